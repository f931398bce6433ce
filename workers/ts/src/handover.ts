/**
 * A keyed service's partitions moving between workers, both sides of a hand-over: the
 * old owner's (prepare, overlap, state) and the new owner's (prepare, hold, take the
 * state). What is held, and who owns what, is `keyed.ts`'s, reached through `Holder`;
 * the protocol, step by step, is in README.md, "How partitions move".
 */
import { setTimeout as delay } from "node:timers/promises";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { HandOver } from "./gen/rpc_pb.js";
import { HandOverSchema } from "./gen/rpc_pb.js";
import type { KeyedSettings } from "./keyed-settings.js";
import { unseen } from "./seen.js";
import type { Seen } from "./seen.js";
import { handoverSubject } from "./subjects.js";

/** What a refusing worker answers a hand-over with: anything non-empty. */
const REFUSED = new TextEncoder().encode("refused");
/** What a worker answers a hand-over (or a replica) with once done: empty. */
export const DONE = new Uint8Array();

/** A request received on a partition's subscription, and its method. */
export interface Request {
  readonly msg: Msg;
  readonly method: string;
}

/** A partition held here. */
export interface Held {
  /** Its subscription (unsubscribed once the partition has left, its state on its way). */
  readonly sub: Subscription;
  /** While it is handed away: per origin, the highest `seq` of its requests taken since the prepare. */
  seen: Map<string, bigint> | undefined;
}

/** A partition this worker prepares to take: subscribed, holding what it receives. */
interface Prepared {
  readonly sub: Subscription;
  readonly held: Request[];
  /** Requests dropped: the buffer was full. */
  dropped: number;
  /** Lets the partition go if its state does not come. */
  readonly expiry: NodeJS.Timeout;
}

/** How a partition was taken: with no state, handed over (or taken back), or from a standby's replica. */
export type How = "fresh" | "handed" | "standby";

/** How a hand-over request was answered: empty, non-empty, or not in time (or nobody there). */
type Answer = "taken" | "refused" | "unanswered";

/** A hand-over taken: its old owner, and its id among that one's. */
interface Taken {
  readonly from: string;
  readonly id: bigint;
}

/** What hand-overs count, among `KeyedStats` (keyed.ts). */
export interface HandoverStats {
  handedOk: number;
  handedKept: number;
  conflicts: number;
  handoverOverflow: number;
}

/** What a hand-over needs of the worker's loop (`PartitionHost`, keyed.ts, extends it). */
export interface HandoverHost {
  /** Queues `partition`'s request, as any other (answered 503 when the queue is full). */
  offer(msg: Msg, method: string, partition: number): void;
  /** Queues the take-over of `partition` for the loop, ahead of its requests. */
  takeOver(partition: number, state: Uint8Array | undefined): void;
  /** Queues the hand-over of `partition` behind its last request: resolves with its state. */
  handOver(partition: number): Promise<Uint8Array>;
  onError(error: unknown, where: string): void;
}

/** What a hand-over needs of the partitions it moves (`Partitions`, keyed.ts). */
export interface Holder {
  /** This worker's id among its peers. */
  readonly id: string;
  /** How many partitions the service has. */
  readonly partitions: number;
  readonly stats: HandoverStats;
  /** The partitions held here (those being handed away among them). */
  readonly held: Map<number, Held>;
  /** Whether this worker is leaving (draining). */
  leaving(): boolean;
  /** Whether the peer `id` is alive. */
  lives(id: string): boolean;
  /** Subscribes `partition` (plain): what arrives goes where the partition's stage says. */
  subscribe(partition: number): Subscription;
  /** Takes `partition` (fresh, with a dead owner's replica, or back after an unanswered hand-over). */
  take(partition: number, state: Uint8Array | undefined, how: How): void;
  /** Queues the take-over of `partition` for the loop, and counts it. */
  takenOver(partition: number, state: Uint8Array | undefined, how: How): void;
  /** Says what this worker holds, once for everything changed in this turn. */
  sayChanged(): void;
  /** Ends the leaving once nothing is held or prepared. */
  settle(): void;
}

/** The partitions on their way out of this worker and into it; see the module docs. */
export class Handovers {
  readonly #nc: NatsConnection;
  readonly #prefix: string;
  readonly #service: string;
  readonly #settings: KeyedSettings;
  readonly #host: HandoverHost;
  readonly #holder: Holder;
  /** Partitions on their way out: prepared or left, not yet taken by the new owner. */
  readonly #moving = new Set<number>();
  /** Partitions on their way in: prepared, their state not come yet. */
  readonly #preparing = new Map<number, Prepared>();
  /** Per partition, the last hand-over taken here: a state sent again is known by it. */
  readonly #taken = new Map<number, Taken>();
  /** The id of the last hand-over started here. */
  #lastHandover = 0n;
  #stopped = false;

  constructor(
    nc: NatsConnection,
    prefix: string,
    service: string,
    settings: KeyedSettings,
    host: HandoverHost,
    holder: Holder,
  ) {
    this.#nc = nc;
    this.#prefix = prefix;
    this.#service = service;
    this.#settings = settings;
    this.#host = host;
    this.#holder = holder;
  }

  /** The partitions it is handing over (prepared or left, their new owner has not taken them yet). */
  get moving(): ReadonlySet<number> {
    return this.#moving;
  }

  /** The partitions it prepares to take: subscribed, holding their requests until the state comes. */
  get preparing(): ReadonlyMap<number, unknown> {
    return this.#preparing;
  }

  /** Stops: no hand-over goes on, and nothing is moving or prepared any more. */
  stop(): void {
    this.#stopped = true;
    for (const prepared of this.#preparing.values()) clearTimeout(prepared.expiry);
    this.#preparing.clear();
    this.#moving.clear();
  }

  /** A request of `partition`: held if it is prepared here (`true`), else left to the caller. */
  hold(partition: number, request: Request): boolean {
    const prepared = this.#preparing.get(partition);
    if (prepared === undefined) return false;
    this.#hold(partition, prepared, request);
    return true;
  }

  /**
   * Takes `partition` if it is prepared here (`true`), with `state` and what was held;
   * else leaves it to the caller.
   */
  takePrepared(partition: number, state: Uint8Array | undefined, how: How): boolean {
    const prepared = this.#preparing.get(partition);
    if (prepared === undefined) return false;
    // Its old owner died mid-hand-over: none of what was held here was served.
    this.#adopt(partition, prepared, state, new Map(), how);
    return true;
  }

  /** Holds a prepared partition's request, or drops it when the buffer is full. */
  #hold(partition: number, prepared: Prepared, request: Request): void {
    if (prepared.held.length < this.#settings.handoverBuffer) {
      prepared.held.push(request);
      return;
    }
    prepared.dropped += 1;
    this.#holder.stats.handoverOverflow += 1;
    if (prepared.dropped === 1) {
      const why = `${prepared.held.length} requests held for its hand-over: dropping more until its state comes`;
      this.#host.onError(new Error(`partition ${partition}: ${why}`), "keyed");
    }
  }

  /**
   * Serves a prepared partition: its take-over, then every held request `seen` does not
   * cover, in the order received, then what arrives.
   */
  #adopt(partition: number, prepared: Prepared, state: Uint8Array | undefined, seen: Seen, how: How): void {
    this.#preparing.delete(partition);
    clearTimeout(prepared.expiry);
    this.#holder.takenOver(partition, state, how);
    this.#holder.held.set(partition, { sub: prepared.sub, seen: undefined });
    for (const { msg, method } of prepared.held) {
      if (unseen(seen, msg.data)) this.#host.offer(msg, method, partition);
    }
    this.#holder.sayChanged();
  }

  /** Starts handing `partition` over to `to`, its owner. */
  handOver(partition: number, to: string): void {
    const held = this.#holder.held.get(partition);
    if (held === undefined || this.#moving.has(partition)) return;
    this.#moving.add(partition);
    void this.#move(partition, held, to);
  }

  /** The old owner's side of a hand-over; see the module docs. */
  async #move(partition: number, held: Held, to: string): Promise<void> {
    const subject = handoverSubject(this.#prefix, this.#service, to);
    const seen = new Map<string, bigint>();
    held.seen = seen;
    this.#lastHandover += 1n;
    const id = this.#lastHandover;
    const prepared = (await this.#ask(subject, { partition, from: this.#holder.id, prepare: true, id })) === "taken";
    if (this.#stopped) return;
    if (!prepared) {
      held.seen = undefined;
      this.#moving.delete(partition);
      this.#kept(partition, to);
      return;
    }
    await delay(this.#settings.handoverOverlapMs);
    if (this.#stopped) return;
    held.sub.unsubscribe();
    // The loop answers after the partition's last request here.
    const state = await this.#host.handOver(partition);
    const handover = { partition, from: this.#holder.id, state, seen: Object.fromEntries(seen), id };
    let answer = await this.#sendState(subject, handover);
    // Unanswered, the new owner may have taken it: taking it back then would leave two
    // owners, their states parting. So it goes again, the same, while the new owner lives.
    while (answer === "unanswered" && !this.#stopped && this.#holder.lives(to)) {
      const why = `worker ${to} did not answer partition ${partition}'s state in time: sent again`;
      this.#host.onError(new Error(why), "keyed");
      answer = await this.#sendState(subject, handover);
    }
    if (this.#stopped) return;
    this.#moving.delete(partition);
    this.#holder.held.delete(partition);
    if (answer === "taken") {
      this.#holder.stats.handedOk += 1;
      this.#holder.sayChanged();
    } else {
      this.#kept(partition, to);
      this.#holder.take(partition, state, "handed");
    }
    this.#holder.settle();
  }

  /** Sends a hand-over request, and waits for its answer at most the hand-over timeout. */
  async #ask(subject: string, handover: MessageInitShape<typeof HandOverSchema>): Promise<Answer> {
    try {
      const payload = toBinary(HandOverSchema, create(HandOverSchema, handover));
      const answer = await this.#nc.request(subject, payload, { timeout: this.#settings.handoverTimeoutMs });
      return answer.data.length === 0 ? "taken" : "refused";
    } catch {
      // No answer in time, nobody there, or the connection closed.
      return "unanswered";
    }
  }

  /**
   * Sends a partition's state, the first time or again. Unanswered, it is told no sooner
   * than the hand-over timeout (nobody there fails at once), so sending it again goes at
   * that pace.
   */
  async #sendState(subject: string, handover: MessageInitShape<typeof HandOverSchema>): Promise<Answer> {
    const { handoverTimeoutMs } = this.#settings;
    const started = performance.now();
    const answer = await this.#ask(subject, handover);
    if (answer === "unanswered") await delay(Math.max(0, started + handoverTimeoutMs - performance.now()));
    return answer;
  }

  #kept(partition: number, to: string): void {
    this.#holder.stats.handedKept += 1;
    this.#host.onError(new Error(`worker ${to} did not take partition ${partition}: kept here`), "keyed");
  }

  /** A peer's hand-over request: a prepare, or the state. */
  handedOver(msg: Msg): void {
    if (!msg.reply) return;
    let handover: HandOver;
    try {
      handover = fromBinary(HandOverSchema, msg.data);
    } catch (error) {
      this.#host.onError(error, "a hand-over that does not decode: refused");
      this.#answer(msg, REFUSED);
      return;
    }
    if (this.#stopped || handover.partition >= this.#holder.partitions) {
      this.#answer(msg, REFUSED);
    } else if (handover.prepare) {
      void this.#prepare(msg, handover.partition);
    } else {
      this.#answer(msg, this.#takeHanded(handover));
    }
  }

  /** Step 1 on the new owner: subscribe and hold, answering once the server has the subscription. */
  async #prepare(msg: Msg, partition: number): Promise<void> {
    if (this.#holder.leaving() || this.#moving.has(partition) || this.#preparing.has(partition)) {
      this.#answer(msg, REFUSED);
      return;
    }
    if (this.#holder.held.has(partition)) {
      // Two views disagreed for a moment and both took it: subscribed already, and the
      // state handed over replaces this worker's own, which settles it.
      this.#answer(msg, DONE);
      return;
    }
    const { handoverOverlapMs, handoverTimeoutMs, memberTimeoutMs } = this.#settings;
    // Longer than a dead old owner takes to be counted dead: then this worker takes the
    // partition fresh, with what it held.
    const wait = handoverOverlapMs + 2 * handoverTimeoutMs + memberTimeoutMs;
    try {
      const sub = this.#holder.subscribe(partition);
      const expiry = setTimeout(() => this.#letGo(partition), wait);
      this.#preparing.set(partition, { sub, held: [], dropped: 0, expiry });
      await this.#nc.flush();
    } catch (error) {
      // Unanswered: the old owner keeps the partition, and this one lets it go in time.
      this.#host.onError(error, `cannot prepare partition ${partition}`);
      return;
    }
    this.#answer(msg, DONE);
  }

  /**
   * Step 4 on the new owner: the state. Answers empty once taken (or when taken already:
   * the same state sent again, its answer lost or late), anything else when refused.
   */
  #takeHanded(handover: HandOver): Uint8Array {
    const { partition, state, from, id } = handover;
    const last = this.#taken.get(partition);
    if (id !== 0n && last?.from === from && last.id === id) return DONE;
    const prepared = this.#preparing.get(partition);
    // No prepare before it: taken as a take-over and a subscription, unless leaving or
    // handing it away.
    if (prepared === undefined && (this.#holder.leaving() || this.#moving.has(partition))) return REFUSED;
    if (id !== 0n) this.#taken.set(partition, { from, id });
    if (prepared !== undefined) {
      this.#adopt(partition, prepared, state, new Map(Object.entries(handover.seen)), "handed");
      return DONE;
    }
    if (this.#holder.held.has(partition)) {
      // Two views disagreed for a moment: the state handed over replaces this one.
      this.#holder.stats.conflicts += 1;
      this.#host.onError(new Error(`handed partition ${partition}, held here already, by ${handover.from}`), "keyed");
      this.#host.takeOver(partition, state);
    } else {
      this.#holder.take(partition, state, "handed");
    }
    return DONE;
  }

  /** A prepared partition whose state did not come: its old owner kept it, and served what was held here. */
  #letGo(partition: number): void {
    const prepared = this.#preparing.get(partition);
    if (prepared === undefined) return;
    this.#preparing.delete(partition);
    prepared.sub.unsubscribe();
    const why = `its state did not come: let go, ${prepared.held.length} held requests dropped`;
    this.#host.onError(new Error(`partition ${partition} was prepared, but ${why}`), "keyed");
    this.#holder.settle();
  }

  #answer(msg: Msg, body: Uint8Array): void {
    try {
      msg.respond(body);
    } catch (error) {
      this.#host.onError(error, "answering a hand-over");
    }
  }
}
