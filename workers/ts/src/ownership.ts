/**
 * Who owns which partition of a keyed service (docs/workers.md, "Keyed services"), as
 * the Rust workers compute it (`proto/src/keyed.rs`, `services/src/ownership.rs`), so
 * TypeScript and Rust workers of one service agree without a vote. Pure logic over a
 * clock the caller passes in; `keyed.ts` acts on the plan.
 *
 * - **Partition**: a key's partition is FNV-1a 32 of its UTF-8 bytes, modulo the
 *   partitions (what the gates route by).
 * - **Members**: every worker of the service says, each heartbeat, that it lives, which
 *   partitions it holds, and whether it is leaving. One not heard from for the member
 *   timeout is forgotten: what it held is nobody's. It *left* if its last heartbeat said
 *   leaving with nothing held (a drained worker's last word), and is *dead* otherwise.
 *   A left peer stays a member until then, not at once: an old owner sends a state again
 *   while its new owner lives, and a leaving worker may still take one it prepared.
 * - **Owner**: among the live members that are not leaving (this worker included), the
 *   one with the highest score `fmix32(FNV-1a-32("<id>:<partition>"))`; ties go to the
 *   greater id. A member joining moves only the partitions it now wins; one leaving,
 *   only its own.
 * - **Plan**: a partition this worker holds and another owns is handed over to it; one
 *   it owns and no live member claims is taken fresh, once the worker has listened long
 *   enough since it started (two heartbeats) to have heard everyone who holds one.
 */

/** The most partitions a keyed service may have. */
export const MAX_PARTITIONS = 1024;

const encoder = new TextEncoder();

/** FNV-1a, 32 bits, of `data` (a string is hashed as its UTF-8 bytes). */
export function fnv1a(data: Uint8Array | string): number {
  const bytes = typeof data === "string" ? encoder.encode(data) : data;
  let hash = 0x811c9dc5;
  for (const byte of bytes) {
    hash = Math.imul(hash ^ byte, 0x01000193);
  }
  return hash >>> 0;
}

/** A key's partition: `fnv1a(key) % partitions` (0 partitions count as 1). */
export function partitionOf(key: Uint8Array | string, partitions: number): number {
  return fnv1a(key) % Math.max(1, partitions);
}

/** MurmurHash3's 32-bit finalizer: spreads similar FNV hashes apart. */
function fmix32(hash: number): number {
  let h = hash;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The rendezvous score of worker `member` for `partition`: the highest owns it. */
export function score(member: string, partition: number): number {
  return fmix32(fnv1a(`${member}:${partition}`));
}

/** What a worker should do about one partition. */
export type Step =
  /** Hand the partition it holds over to `to`, its owner. */
  | { readonly kind: "handOver"; readonly partition: number; readonly to: string }
  /** Take the partition, which it owns and nobody holds, with no state. */
  | { readonly kind: "takeFresh"; readonly partition: number };

/** A peer as its last heartbeat described it. */
interface Member {
  seen: number;
  /** When this worker first heard it. */
  since: number;
  held: ReadonlySet<number>;
  leaving: boolean;
}

/** The peers `Members.expire` forgot, by how they went. */
export interface Gone {
  /** Silent without having left: crashed, cut off, or stopped before its last word. */
  readonly dead: string[];
  /** Silent after saying it was leaving and held nothing: drained. */
  readonly left: string[];
}

/**
 * How long a member may go unheard, how long a starting worker listens, and, with
 * standbys, how long a dead peer's partitions wait for the standby holding their state
 * to take them before their owner takes them fresh (0 or absent: not at all), in ms.
 */
export interface MemberTimes {
  readonly timeoutMs: number;
  readonly listenMs: number;
  readonly adoptionMs?: number;
}

/** One worker's view of its service's members. Times are milliseconds on any clock. */
export class Members {
  readonly #peers = new Map<string, Member>();
  /** The partitions dead peers held, and when they were counted dead. */
  readonly #orphaned = new Map<number, number>();

  constructor(
    readonly me: string,
    readonly partitions: number,
    readonly times: MemberTimes,
    readonly started: number,
  ) {}

  /**
   * Takes a peer's heartbeat (this worker's own, heard back, is ignored); true when the
   * peer is new here.
   */
  heard(id: string, held: Iterable<number>, leaving: boolean, now: number): boolean {
    if (id === this.me) return false;
    const known = this.#peers.get(id);
    this.#peers.set(id, { seen: now, since: known?.since ?? now, held: new Set(held), leaving });
    return known === undefined;
  }

  /**
   * Forgets the peers not heard from for the timeout: those whose last heartbeat said
   * leaving with nothing held left, the others are dead.
   */
  expire(now: number): Gone {
    const gone: Gone = { dead: [], left: [] };
    const adoptionMs = this.times.adoptionMs ?? 0;
    for (const [partition, at] of this.#orphaned) {
      if (now - at >= adoptionMs) this.#orphaned.delete(partition);
    }
    for (const [id, member] of this.#peers) {
      if (now - member.seen <= this.times.timeoutMs) continue;
      this.#peers.delete(id);
      const left = member.leaving && member.held.size === 0;
      (left ? gone.left : gone.dead).push(id);
      if (!left && adoptionMs > 0) for (const partition of member.held) this.#orphaned.set(partition, now);
    }
    return gone;
  }

  /** Whether peer `id` is alive: heard from within the timeout (as of the last `expire`). */
  lives(id: string): boolean {
    return this.#peers.has(id);
  }

  /** When live peer `id` was last heard; `undefined` for one not alive. */
  lastHeard(id: string): number | undefined {
    return this.#peers.get(id)?.seen;
  }

  /** The live peers' ids. */
  get peers(): string[] {
    return [...this.#peers.keys()];
  }

  /**
   * The owner of `partition` among the live members that are not leaving (this worker
   * among them unless `leaving`); `undefined` when there is none.
   */
  owner(partition: number, leaving: boolean): string | undefined {
    return first(this.#candidates(leaving), partition);
  }

  /**
   * Where `member`, holding `partition`, kept its standby `at` a moment (docs/workers.md,
   * "Standbys"): who would take it if `member` died, its owner among the others (this
   * worker among them unless `leaving`), of the peers heard for two heartbeats (the
   * listening time) by then. A newer peer was not one yet: `member` may not have heard
   * of it, and kept its partitions' states at the standby it had. A standby asks as of
   * `member`'s last heartbeat: a member that died before a newcomer settled kept its
   * states there.
   */
  successor(partition: number, member: string, leaving: boolean, at: number): string | undefined {
    const settled = (id: string) => {
      const peer = this.#peers.get(id);
      return peer === undefined || at - peer.since >= this.times.listenMs;
    };
    return first(
      this.#candidates(leaving).filter((id) => id !== member && settled(id)),
      partition,
    );
  }

  /** The live members that are not leaving, this worker among them unless `leaving`. */
  #candidates(leaving: boolean): string[] {
    const ids = leaving ? [] : [this.me];
    for (const [id, member] of this.#peers) {
      if (!member.leaving) ids.push(id);
    }
    return ids;
  }

  /** Whether live peer `id` says it holds `partition`. */
  holds(id: string, partition: number): boolean {
    return this.#peers.get(id)?.held.has(partition) ?? false;
  }

  /**
   * When the first peer not heard from since falls past the timeout: the moment
   * `expire` would forget it; `undefined` without peers.
   */
  nextExpiry(): number | undefined {
    let oldest: number | undefined;
    for (const member of this.#peers.values()) {
      if (oldest === undefined || member.seen < oldest) oldest = member.seen;
    }
    return oldest === undefined ? undefined : oldest + this.times.timeoutMs + 1;
  }

  /** Whether a live peer says it holds `partition`. */
  claimed(partition: number): boolean {
    for (const member of this.#peers.values()) {
      if (member.held.has(partition)) return true;
    }
    return false;
  }

  /**
   * What to do now, given the partitions this worker holds and those being moved to or
   * from it (left alone until that move ends).
   */
  plan(held: ReadonlySet<number>, moving: ReadonlySet<number>, leaving: boolean, now: number): Step[] {
    const listened = now - this.started >= this.#listeningMs();
    const steps: Step[] = [];
    for (let partition = 0; partition < this.partitions; partition++) {
      if (moving.has(partition)) continue;
      const owner = this.owner(partition, leaving);
      if (held.has(partition)) {
        if (owner !== undefined && owner !== this.me) steps.push({ kind: "handOver", partition, to: owner });
      } else if (listened && owner === this.me && !this.claimed(partition) && !this.#awaitingAdoption(partition, now)) {
        steps.push({ kind: "takeFresh", partition });
      }
    }
    return steps;
  }

  /**
   * How long after its start this worker takes nothing fresh: two heartbeats, to hear
   * everyone who holds something; with standbys and peers, a member timeout and the
   * adoption time more, so that a worker that died just before this one came (its
   * partitions unclaimed, to this worker's ears) is counted dead by its peers and its
   * partitions taken by their standbys, with their state, first.
   */
  #listeningMs(): number {
    const adoptionMs = this.times.adoptionMs ?? 0;
    if (adoptionMs === 0 || this.#peers.size === 0) return this.times.listenMs;
    return this.times.listenMs + this.times.timeoutMs + adoptionMs;
  }

  /** Whether `partition`, held by a peer counted dead less than the adoption time ago, still waits for its standby. */
  #awaitingAdoption(partition: number, now: number): boolean {
    const at = this.#orphaned.get(partition);
    return at !== undefined && now - at < (this.times.adoptionMs ?? 0);
  }

  /** The partitions held here that a peer says it holds too. */
  conflicts(held: Iterable<number>): number[] {
    return [...held].filter((partition) => this.claimed(partition));
  }
}

/** The first of `members` in `partition`'s rendezvous order: the highest score, ties to the greater id. */
function first(members: readonly string[], partition: number): string | undefined {
  let best: { id: string; score: number } | undefined;
  for (const id of members) {
    const s = score(id, partition);
    if (best === undefined || s > best.score || (s === best.score && id > best.id)) best = { id, score: s };
  }
  return best?.id;
}
