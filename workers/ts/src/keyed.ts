/**
 * A keyed service's partitions on one worker: which it holds, and moving them with
 * their state (the Rust reference is `services/src/worker/keyed.rs`); the protocol,
 * step by step, is in README.md, "How partitions move", and docs/workers.md, "Keyed
 * services".
 */
import { randomBytes } from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { HandOver, KeyedMember, PartitionState } from "./gen/rpc_pb.js";
import { HandOverSchema, KeyedMemberSchema } from "./gen/rpc_pb.js";
import { checkKeyedTimes } from "./keyed-settings.js";
import type { KeyedSettings } from "./keyed-settings.js";
import { Members } from "./ownership.js";
import { Replicator } from "./replicate.js";
import { noteSeen, unseen } from "./seen.js";
import type { Seen } from "./seen.js";
import { Replicas, decodeReplica } from "./standby.js";
import { handoverSubject, membersSubject, partitionSubject, replicaSubject } from "./subjects.js";

/** What a refusing worker answers a hand-over with: anything non-empty. */
const REFUSED = new TextEncoder().encode("refused");
const DONE = new Uint8Array();

/** What a worker's partitions have been through. */
export interface KeyedStats {
  /** Partitions taken with no state (nobody held them, or their holder died). */
  takenFresh: number;
  /** Partitions taken with the state a peer handed over (or taken back when unanswered). */
  takenHanded: number;
  /** Partitions of a dead owner taken with the replica this worker held as its standby. */
  takenStandby: number;
  /**
   * Partitions held here whose latest state no standby holds: none (one worker), or
   * one that did not answer in time (sent again whole after a heartbeat). 0 without standbys.
   */
  unreplicated: number;
  /** Replicas a standby did not hold in time (or refused): the batch's answers left without it. */
  replicaFailures: number;
  /** Partitions handed over to their new owner. */
  handedOk: number;
  /** Hand-overs refused or unanswered: the partition stayed here, with its state. */
  handedKept: number;
  /** Times a peer said it held a partition held here too (settled by hand-over). */
  conflicts: number;
  /** Requests dropped while preparing to take a partition: its hand-over buffer was full. */
  handoverOverflow: number;
  /** Peers counted dead: silent for the member timeout, not having left. */
  peersDead: number;
  /** Peers that left: silent after saying leaving with nothing held (drained). */
  peersLeft: number;
}

/** A keyed worker as its peers see it. */
export interface KeyedView {
  /** This worker's id among its peers (16 hex digits, new at every start). */
  readonly id: string;
  /** The partitions it holds, ascending (those being handed over among them). */
  readonly held: readonly number[];
  /** The partitions it is handing over (prepared or left, their new owner has not taken them yet). */
  readonly moving: readonly number[];
  /** The partitions it prepares to take: subscribed, holding their requests until the state comes. */
  readonly preparing: readonly number[];
  /** Whether it is leaving (draining). */
  readonly leaving: boolean;
  /** The partitions it keeps a replica of, as their standby (docs/workers.md, "Standbys"), ascending. */
  readonly standbyFor: readonly number[];
  readonly stats: Readonly<KeyedStats>;
}

/** What the partitions need of their worker. */
export interface PartitionHost {
  /** Queues `partition`'s request, as any other (answered 503 when the queue is full). */
  offer(msg: Msg, method: string, partition: number): void;
  /** Queues a turn that marks `partition` changed: its standby gets it whole after the batch. */
  replicate(partition: number): void;
  /** Queues the take-over of `partition` for the loop, ahead of its requests. */
  takeOver(partition: number, state: Uint8Array | undefined): void;
  /** Queues the hand-over of `partition` behind its last request: resolves with its state. */
  handOver(partition: number): Promise<Uint8Array>;
  onError(error: unknown, where: string): void;
}

/** A request received on a partition's subscription, and its method. */
interface Request {
  readonly msg: Msg;
  readonly method: string;
}

/** A partition held here. */
interface Held {
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
type How = "fresh" | "handed" | "standby";

/** How a hand-over request was answered: empty, non-empty, or not in time (or nobody there). */
type Answer = "taken" | "refused" | "unanswered";

/** A hand-over taken: its old owner, and its id among that one's. */
interface Taken {
  readonly from: string;
  readonly id: bigint;
}

/** A keyed service's partitions on this worker; see the module docs. */
export class Partitions {
  readonly id = randomBytes(8).toString("hex");
  readonly stats: KeyedStats = {
    takenFresh: 0,
    takenHanded: 0,
    takenStandby: 0,
    unreplicated: 0,
    replicaFailures: 0,
    handedOk: 0,
    handedKept: 0,
    conflicts: 0,
    handoverOverflow: 0,
    peersDead: 0,
    peersLeft: 0,
  };
  readonly #nc: NatsConnection;
  readonly #prefix: string;
  readonly #service: string;
  readonly #host: PartitionHost;
  readonly #settings: KeyedSettings;
  readonly #members: Members;
  /** The partitions held here (those being handed away among them). */
  readonly #held = new Map<number, Held>();
  /** Partitions on their way out: prepared or left, not yet taken by the new owner. */
  readonly #moving = new Set<number>();
  /** Partitions on their way in: prepared, their state not come yet. */
  readonly #preparing = new Map<number, Prepared>();
  /** Per partition, the last hand-over taken here: a state sent again is known by it. */
  readonly #taken = new Map<number, Taken>();
  /** The id of the last hand-over started here. */
  #lastHandover = 0n;
  /** The replicas peers send this worker, as their partitions' standby. */
  readonly #replicas = new Replicas();
  /** Sends this worker's partitions to their standbys; `undefined` without standbys. */
  readonly #replicator: Replicator | undefined;
  /** Fires when the first silent peer's member timeout runs out. */
  #expiry: NodeJS.Timeout | undefined;
  readonly #subs: Subscription[] = [];
  #leaving = false;
  #stopped = false;
  #timer: NodeJS.Timeout | undefined;
  #sayPending = false;
  #left: Promise<void> | undefined;
  #allHandedOver: () => void = () => {};

  constructor(
    nc: NatsConnection,
    prefix: string,
    service: string,
    partitions: number,
    host: PartitionHost,
    settings: KeyedSettings,
  ) {
    checkKeyedTimes(settings);
    this.#nc = nc;
    this.#prefix = prefix;
    this.#service = service;
    this.#host = host;
    this.#settings = settings;
    // With standbys, two heartbeats: a standby's claim is heard before its owner would take fresh.
    const adoptionMs = settings.replicaTimeoutMs === undefined ? 0 : 2 * settings.heartbeatMs;
    const memberTimes = { timeoutMs: settings.memberTimeoutMs, listenMs: 2 * settings.heartbeatMs, adoptionMs };
    this.#members = new Members(this.id, partitions, memberTimes, performance.now());
    if (settings.replicaTimeoutMs !== undefined) {
      const names = { prefix, service, me: this.id };
      const times = { timeoutMs: settings.replicaTimeoutMs, restMs: settings.heartbeatMs };
      this.#replicator = new Replicator(nc, { ...names, ...times }, host.onError);
    }
  }

  /** What its peers hear of this worker now. */
  get view(): KeyedView {
    return {
      id: this.id,
      held: this.#heldList(),
      moving: ascending(this.#moving),
      preparing: ascending(this.#preparing.keys()),
      leaving: this.#leaving,
      standbyFor: this.#replicas.partitions,
      stats: {
        ...this.stats,
        unreplicated: this.#replicator?.unreplicated(this.#held.size) ?? 0,
        replicaFailures: this.#replicator?.failures ?? 0,
      },
    };
  }

  /**
   * Sends `states` (a batch's snapshots) to their partitions' standbys; resolves once
   * each holds them, at most the replica timeout later. Nothing to do without standbys.
   */
  async replicate(states: readonly PartitionState[]): Promise<void> {
    await this.#replicator?.send(states);
  }

  /**
   * Whether `partition` has a standby now: one without is not snapshotted (a standby
   * that comes later gets it whole).
   */
  standsBy(partition: number): boolean {
    return this.#replicator?.standsBy(partition) ?? false;
  }

  /**
   * Hears the peers and takes hand-overs, says the first heartbeat, and acts every
   * heartbeat from now on. Nothing is taken fresh before two heartbeats have passed.
   */
  start(): void {
    const listen = (subject: string, handle: (msg: Msg) => void): void => {
      const sub = this.#nc.subscribe(subject, {
        callback: (error, msg) => {
          if (error === null) handle(msg);
        },
      });
      this.#subs.push(sub);
    };
    listen(membersSubject(this.#prefix, this.#service), (msg) => this.#heard(msg.data));
    listen(handoverSubject(this.#prefix, this.#service, this.id), (msg) => this.#handedOver(msg));
    if (this.#replicator !== undefined) {
      listen(replicaSubject(this.#prefix, this.#service, this.id), (msg) => this.#replica(msg));
    }
    this.#timer = setInterval(() => this.#tick(), this.#settings.heartbeatMs);
    this.#publishHeartbeat();
    void this.#nc.closed().then(() => this.#stop());
  }

  /**
   * Says it is leaving, hands every partition over to its owner among the others (or
   * unsubscribes it when there is none), and resolves once it holds and prepares none.
   * Idempotent.
   */
  leave(): Promise<void> {
    this.#left ??= this.#leave();
    return this.#left;
  }

  async #leave(): Promise<void> {
    const allHandedOver = new Promise<void>((resolve) => (this.#allHandedOver = resolve));
    this.#leaving = true;
    this.#sayChanged();
    this.#act();
    this.#settle();
    await allHandedOver;
    this.#stop();
  }

  #stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    clearInterval(this.#timer);
    clearTimeout(this.#expiry);
    for (const prepared of this.#preparing.values()) clearTimeout(prepared.expiry);
    this.#preparing.clear();
    this.#held.clear();
    this.#moving.clear();
    if (!this.#nc.isClosed()) {
      this.#publishHeartbeat(); // the last: leaving, holding nothing
      for (const sub of this.#subs) sub.unsubscribe();
    }
    this.#allHandedOver();
  }

  #heldList(): number[] {
    return ascending(this.#held.keys());
  }

  /**
   * Every heartbeat: say it, then count the silent peers dead and act, once what reached
   * the socket meanwhile has been read. A tick runs in the event loop's timers phase,
   * before its poll phase reads the socket: after a handler that blocked the loop, the
   * peers' heartbeats that came during the block are still unread when the overdue tick
   * fires. `setImmediate` runs after that poll phase, so a peer is counted dead for its
   * own silence, never for this worker's. A block can also fall between the tick and its
   * review (a handler run in that same turn's poll phase): a review that comes late is
   * put off once more, so it too runs after a poll that followed the block.
   */
  #tick(): void {
    if (this.#stopped) return;
    this.#publishHeartbeat();
    this.#reviewAfterPoll();
  }

  #reviewAfterPoll(late = false): void {
    const queued = performance.now();
    setImmediate(() => {
      // Queued from the check phase, the next one runs after the next turn's poll. Once
      // only: a loop blocked turn after turn still gets its peers reviewed.
      if (!late && performance.now() - queued > this.#settings.heartbeatMs) this.#reviewAfterPoll(true);
      else this.#review();
    });
  }

  /**
   * Forgets the silent peers (dead, or left after their last word), reports partitions a
   * peer holds too, acts, and forgets the replicas it no longer stands by for.
   */
  #review(): void {
    if (this.#stopped) return;
    this.#expirePeers();
    // A partition being handed over is claimed by its new owner before the answer comes.
    const settled = [...this.#held.keys()].filter((partition) => !this.#moving.has(partition));
    const conflicts = this.#members.conflicts(settled);
    if (conflicts.length > 0) {
      this.stats.conflicts += conflicts.length;
      const which = conflicts.join(", ");
      const error = new Error(`a peer says it holds partitions held here (${which}): settled by hand-over`);
      this.#host.onError(error, "keyed");
    }
    this.#act();
    const held = (partition: number): boolean => this.#held.has(partition);
    this.#replicas.prune(this.#members, this.#leaving, held, this.#settings.memberTimeoutMs, performance.now());
  }

  /**
   * Counts a silent peer dead the moment its member timeout runs out, not at the next
   * tick: its partitions' pause is the member timeout, no more. The timer fires in the
   * event loop's timers phase, so it goes through the same review after the poll as a
   * tick (`#reviewAfterPoll`): the peers' heartbeats read meanwhile come first.
   */
  #armExpiry(): void {
    clearTimeout(this.#expiry);
    const at = this.#members.nextExpiry();
    if (this.#stopped || at === undefined) return;
    this.#expiry = setTimeout(() => this.#reviewAfterPoll(), Math.max(0, at - performance.now()));
  }

  /** Forgets the silent peers: dead, or left after their last word. */
  #expirePeers(): void {
    const { dead, left } = this.#members.expire(performance.now());
    this.#armExpiry();
    this.stats.peersDead += dead.length;
    this.stats.peersLeft += left.length;
    if (dead.length > 0) {
      this.#host.onError(new Error(`keyed peers not heard from, counted dead: ${dead.join(", ")}`), "keyed");
      this.#replicas.bury(dead);
    }
  }

  /** A peer's heartbeat. A newcomer hears this worker's at once. */
  #heard(payload: Uint8Array): void {
    if (this.#stopped) return;
    let member: KeyedMember;
    try {
      member = fromBinary(KeyedMemberSchema, payload);
    } catch (error) {
      this.#host.onError(error, "a keyed heartbeat that does not decode");
      return;
    }
    const isNew = this.#members.heard(member.id, member.held, member.leaving, performance.now());
    if (isNew) this.#armExpiry();
    if (isNew) this.#sayChanged();
    if (isNew || member.leaving) this.#act();
  }

  /** Says what this worker holds, once for everything changed in this turn. */
  #sayChanged(): void {
    if (this.#sayPending) return;
    this.#sayPending = true;
    queueMicrotask(() => {
      this.#sayPending = false;
      if (this.#stopped) return;
      this.#followStandbys();
      this.#publishHeartbeat();
    });
  }

  #publishHeartbeat(): void {
    const member = create(KeyedMemberSchema, { id: this.id, held: this.#heldList(), leaving: this.#leaving });
    try {
      this.#nc.publish(membersSubject(this.#prefix, this.#service), toBinary(KeyedMemberSchema, member));
    } catch (error) {
      this.#host.onError(error, "keyed heartbeat");
    }
  }

  /** Does what the members say. */
  #act(): void {
    if (this.#stopped) return;
    // A dead owner's partitions this worker stood by for and nobody holds: taken with
    // their state whether or not this worker owns them now (a worker that came after the
    // owner's last replica may: it gets them by hand-over next), so none answered 200
    // starts fresh.
    const here = (partition: number) => this.#held.has(partition) || this.#preparing.has(partition);
    for (const [partition, state] of this.#replicas.orphans(this.#members, here)) {
      this.#take(partition, state, "standby");
    }
    const held = new Set(this.#held.keys());
    for (const step of this.#members.plan(held, this.#moving, this.#leaving, performance.now())) {
      if (step.kind === "handOver") this.#handOver(step.partition, step.to);
      else this.#take(step.partition, undefined, "fresh");
    }
    if (this.#leaving) {
      for (const partition of held) {
        if (!this.#moving.has(partition) && this.#members.owner(partition, true) === undefined) {
          this.#drop(partition);
        }
      }
    }
    // Who lives may have changed: so may the standbys.
    this.#followStandbys();
  }

  /**
   * Works out each held partition's standby (who would take it if this worker died)
   * and has the loop send whole those whose standby changed, and those a standby missed
   * once its rest is over. Called whenever what is held or who lives changes.
   */
  #followStandbys(): void {
    if (this.#replicator === undefined) return;
    const standbys = new Map<number, string>();
    const now = performance.now();
    for (const partition of this.#held.keys()) {
      const standby = this.#members.successor(partition, this.id, false, now);
      if (standby !== undefined) standbys.set(partition, standby);
    }
    const held = new Set(this.#held.keys());
    for (const partition of this.#replicator.follow(standbys, held)) this.#host.replicate(partition);
  }

  /** A replica from a partition's owner: kept, then answered (empty: held; else why not). */
  #replica(msg: Msg): void {
    const replica = decodeReplica(msg.data);
    const why =
      typeof replica === "string"
        ? replica
        : this.#replicas.keep(replica, this.#members.partitions, performance.now());
    if (why !== undefined) this.#host.onError(new Error(why), "a replica refused");
    if (!msg.reply) return;
    try {
      msg.respond(why === undefined ? DONE : new TextEncoder().encode(why));
    } catch (error) {
      this.#host.onError(error, "answering a replica");
    }
  }

  /** Subscribes `partition` (plain): what arrives goes where the partition's stage says. */
  #subscribe(partition: number): Subscription {
    const subject = partitionSubject(this.#prefix, this.#service, partition);
    const methodAt = subject.length + 1;
    return this.#nc.subscribe(`${subject}.>`, {
      callback: (error, msg) => {
        if (error === null) this.#received(partition, { msg, method: msg.subject.slice(methodAt) });
      },
    });
  }

  /** A partition's request: held while preparing, else taken (and noted while handed away). */
  #received(partition: number, request: Request): void {
    const prepared = this.#preparing.get(partition);
    if (prepared !== undefined) {
      this.#hold(partition, prepared, request);
      return;
    }
    const held = this.#held.get(partition);
    if (held === undefined) return;
    if (held.seen !== undefined) noteSeen(held.seen, request.msg.data);
    this.#host.offer(request.msg, request.method, partition);
  }

  /** Holds a prepared partition's request, or drops it when the buffer is full. */
  #hold(partition: number, prepared: Prepared, request: Request): void {
    if (prepared.held.length < this.#settings.handoverBuffer) {
      prepared.held.push(request);
      return;
    }
    prepared.dropped += 1;
    this.stats.handoverOverflow += 1;
    if (prepared.dropped === 1) {
      const why = `${prepared.held.length} requests held for its hand-over: dropping more until its state comes`;
      this.#host.onError(new Error(`partition ${partition}: ${why}`), "keyed");
    }
  }

  /**
   * Takes `partition` (fresh, with a dead owner's replica, or back after an unanswered
   * hand-over), adopting it if prepared.
   */
  #take(partition: number, state: Uint8Array | undefined, how: How): void {
    const prepared = this.#preparing.get(partition);
    if (prepared !== undefined) {
      // Its old owner died mid-hand-over: none of what was held here was served.
      this.#adopt(partition, prepared, state, new Map(), how);
      return;
    }
    this.#takenOver(partition, state, how);
    try {
      this.#held.set(partition, { sub: this.#subscribe(partition), seen: undefined });
    } catch (error) {
      this.#host.onError(error, `cannot subscribe partition ${partition}`);
    }
    this.#sayChanged();
  }

  /**
   * Serves a prepared partition: its take-over, then every held request `seen` does not
   * cover, in the order received, then what arrives.
   */
  #adopt(partition: number, prepared: Prepared, state: Uint8Array | undefined, seen: Seen, how: How): void {
    this.#preparing.delete(partition);
    clearTimeout(prepared.expiry);
    this.#takenOver(partition, state, how);
    this.#held.set(partition, { sub: prepared.sub, seen: undefined });
    for (const { msg, method } of prepared.held) {
      if (unseen(seen, msg.data)) this.#host.offer(msg, method, partition);
    }
    this.#sayChanged();
  }

  /** Queues the take-over of `partition` for the loop, and counts it. */
  #takenOver(partition: number, state: Uint8Array | undefined, how: How): void {
    if (how === "fresh") this.stats.takenFresh += 1;
    else if (how === "standby") this.stats.takenStandby += 1;
    else this.stats.takenHanded += 1;
    this.#host.takeOver(partition, state);
  }

  /** Nobody is left to take `partition`: unsubscribed, and its state ends here. */
  #drop(partition: number): void {
    this.#held.get(partition)?.sub.unsubscribe();
    this.#held.delete(partition);
    this.#sayChanged();
    this.#settle();
  }

  /** Starts handing `partition` over to `to`, its owner. */
  #handOver(partition: number, to: string): void {
    const held = this.#held.get(partition);
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
    const prepared = (await this.#ask(subject, { partition, from: this.id, prepare: true, id })) === "taken";
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
    const handover = { partition, from: this.id, state, seen: Object.fromEntries(seen), id };
    let answer = await this.#sendState(subject, handover);
    // Unanswered, the new owner may have taken it: taking it back then would leave two
    // owners, their states parting. So it goes again, the same, while the new owner lives.
    while (answer === "unanswered" && !this.#stopped && this.#members.lives(to)) {
      const why = `worker ${to} did not answer partition ${partition}'s state in time: sent again`;
      this.#host.onError(new Error(why), "keyed");
      answer = await this.#sendState(subject, handover);
    }
    if (this.#stopped) return;
    this.#moving.delete(partition);
    this.#held.delete(partition);
    if (answer === "taken") {
      this.stats.handedOk += 1;
      this.#sayChanged();
    } else {
      this.#kept(partition, to);
      this.#take(partition, state, "handed");
    }
    this.#settle();
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
    this.stats.handedKept += 1;
    this.#host.onError(new Error(`worker ${to} did not take partition ${partition}: kept here`), "keyed");
  }

  /** A peer's hand-over request: a prepare, or the state. */
  #handedOver(msg: Msg): void {
    if (!msg.reply) return;
    let handover: HandOver;
    try {
      handover = fromBinary(HandOverSchema, msg.data);
    } catch (error) {
      this.#host.onError(error, "a hand-over that does not decode: refused");
      this.#answer(msg, REFUSED);
      return;
    }
    if (this.#stopped || handover.partition >= this.#members.partitions) {
      this.#answer(msg, REFUSED);
    } else if (handover.prepare) {
      void this.#prepare(msg, handover.partition);
    } else {
      this.#answer(msg, this.#takeHanded(handover));
    }
  }

  /** Step 1 on the new owner: subscribe and hold, answering once the server has the subscription. */
  async #prepare(msg: Msg, partition: number): Promise<void> {
    if (this.#leaving || this.#moving.has(partition) || this.#preparing.has(partition)) {
      this.#answer(msg, REFUSED);
      return;
    }
    if (this.#held.has(partition)) {
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
      const sub = this.#subscribe(partition);
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
    if (prepared === undefined && (this.#leaving || this.#moving.has(partition))) return REFUSED;
    if (id !== 0n) this.#taken.set(partition, { from, id });
    if (prepared !== undefined) {
      this.#adopt(partition, prepared, state, new Map(Object.entries(handover.seen)), "handed");
      return DONE;
    }
    if (this.#held.has(partition)) {
      // Two views disagreed for a moment: the state handed over replaces this one.
      this.stats.conflicts += 1;
      this.#host.onError(new Error(`handed partition ${partition}, held here already, by ${handover.from}`), "keyed");
      this.#host.takeOver(partition, state);
    } else {
      this.#take(partition, state, "handed");
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
    this.#settle();
  }

  #answer(msg: Msg, body: Uint8Array): void {
    try {
      msg.respond(body);
    } catch (error) {
      this.#host.onError(error, "answering a hand-over");
    }
  }

  /** Ends the leaving once nothing is held or prepared. */
  #settle(): void {
    if (this.#leaving && this.#held.size === 0 && this.#preparing.size === 0) this.#allHandedOver();
  }
}

function ascending(partitions: Iterable<number>): number[] {
  return [...partitions].sort((a, b) => a - b);
}
