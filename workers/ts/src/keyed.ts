/**
 * A keyed service's partitions on one worker: which it holds, and moving them
 * (docs/workers.md, "Keyed services"; the Rust reference is
 * `services/src/worker/keyed.rs`).
 *
 * The worker says every heartbeat on `<prefix>.keyed.<service>.members` that it lives,
 * what it holds and whether it is leaving (and at once when that changes, or when it
 * hears a new peer), hears its peers there, asks `Members` what to do, and does it:
 *
 * - **Take fresh**: queue the take-over (no state) for the loop, then subscribe the
 *   partition, `<prefix>.svc.<service>.p<N>.>` in queue group `<service>.p<N>`. The
 *   loop runs the take-over before any of the partition's requests.
 * - **Hand over** to its owner: drain the partition's subscription (UNSUB, and every
 *   message the bus routed here until the PING after it comes back is still queued), so
 *   nothing is lost; then queue the hand-over for the loop, whose answer (the state,
 *   after the partition's last request here) is sent as a `HandOver` request to
 *   `<prefix>.keyed.<service>.handover.<owner>`. An empty answer means the new owner
 *   has queued the state and subscribed. A refusal, or no answer within the hand-over
 *   timeout: this worker takes the partition back with that state, and tries again at
 *   a later heartbeat. Meanwhile the gates' requests for the partition find no
 *   responders and are sent again until it is served.
 * - **Take a hand-over**: queue the take-over with the state, subscribe, answer empty.
 *   A leaving worker, or one handing that partition away itself, refuses (non-empty).
 *
 * At shutdown (`leave`) the worker says it is leaving, hands every partition to its
 * owner among the others, and ends once it holds none; with nobody left to take them,
 * its partitions just drain and their state ends with it.
 */
import { randomBytes } from "node:crypto";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { HandOver, KeyedMember } from "./gen/rpc_pb.js";
import { HandOverSchema, KeyedMemberSchema } from "./gen/rpc_pb.js";
import { Members } from "./ownership.js";
import { handoverSubject, membersSubject, partitionGroup, partitionSubject } from "./subjects.js";

/** Default heartbeat: how often a keyed worker tells its peers it lives and what it holds. */
export const DEFAULT_KEYED_HEARTBEAT_MS = 500;
/** Default member timeout: a peer unheard for longer is dead (more than two heartbeats). */
export const DEFAULT_KEYED_MEMBER_TIMEOUT_MS = 2_000;
/** Default hand-over timeout: how long the old owner waits for the new one to take a partition. */
export const DEFAULT_HANDOVER_TIMEOUT_MS = 2_000;

/** What a refusing worker answers a hand-over with: anything non-empty. */
const REFUSED = new TextEncoder().encode("refused");

/** A keyed worker's timings, in milliseconds. */
export interface KeyedTimes {
  readonly heartbeatMs: number;
  readonly memberTimeoutMs: number;
  readonly handoverTimeoutMs: number;
}

/** Checks that a live worker, heard every heartbeat, is never counted dead. */
export function checkKeyedTimes(times: KeyedTimes): void {
  const { heartbeatMs, memberTimeoutMs, handoverTimeoutMs } = times;
  if (!(heartbeatMs > 0)) throw new Error(`the keyed heartbeat must be positive, not ${heartbeatMs}`);
  if (!(handoverTimeoutMs > 0)) throw new Error(`the hand-over timeout must be positive, not ${handoverTimeoutMs}`);
  if (!(memberTimeoutMs > 2 * heartbeatMs)) {
    const why = `must be more than two heartbeats (${heartbeatMs} ms)`;
    throw new Error(`the keyed member timeout (${memberTimeoutMs} ms) ${why}`);
  }
}

/** What a worker's partitions have been through. */
export interface KeyedStats {
  /** Partitions taken with no state (nobody held them, or their holder died). */
  takenFresh: number;
  /** Partitions taken with the state a peer handed over (or taken back after a refusal). */
  takenHanded: number;
  /** Partitions handed over to their new owner. */
  handedOk: number;
  /** Hand-overs refused or unanswered: the partition stayed here, with its state. */
  handedKept: number;
  /** Times a peer said it held a partition held here too (settled by hand-over). */
  conflicts: number;
}

/** A keyed worker as its peers see it. */
export interface KeyedView {
  /** This worker's id among its peers (16 hex digits, new at every start). */
  readonly id: string;
  /** The partitions it holds, ascending (those being handed over among them). */
  readonly held: readonly number[];
  /** The partitions it is handing over (left, their new owner has not taken them yet). */
  readonly moving: readonly number[];
  /** Whether it is leaving (draining). */
  readonly leaving: boolean;
  readonly stats: Readonly<KeyedStats>;
}

/** What the partitions need of their worker. */
export interface PartitionHost {
  /** Queues a partition's request, as any other (answered 503 when the queue is full). */
  offer(msg: Msg, method: string): void;
  /** Queues the take-over of `partition` for the loop, ahead of its requests. */
  takeOver(partition: number, state: Uint8Array | undefined): void;
  /** Queues the hand-over of `partition` behind its last request: resolves with its state. */
  handOver(partition: number): Promise<Uint8Array>;
  onError(error: unknown, where: string): void;
}

/** A keyed service's partitions on this worker; see the module docs. */
export class Partitions {
  readonly id = randomBytes(8).toString("hex");
  readonly stats: KeyedStats = { takenFresh: 0, takenHanded: 0, handedOk: 0, handedKept: 0, conflicts: 0 };
  readonly #nc: NatsConnection;
  readonly #prefix: string;
  readonly #service: string;
  readonly #host: PartitionHost;
  readonly #times: KeyedTimes;
  readonly #members: Members;
  /** The partitions held here, with their subscriptions (draining while moving). */
  readonly #held = new Map<number, Subscription>();
  /** Partitions on their way out: left, state not yet taken by the new owner. */
  readonly #moving = new Set<number>();
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
    times: KeyedTimes,
  ) {
    checkKeyedTimes(times);
    this.#nc = nc;
    this.#prefix = prefix;
    this.#service = service;
    this.#host = host;
    this.#times = times;
    const memberTimes = { timeoutMs: times.memberTimeoutMs, listenMs: 2 * times.heartbeatMs };
    this.#members = new Members(this.id, partitions, memberTimes, performance.now());
  }

  /** What its peers hear of this worker now. */
  get view(): KeyedView {
    return {
      id: this.id,
      held: this.#heldList(),
      moving: [...this.#moving].sort((a, b) => a - b),
      leaving: this.#leaving,
      stats: { ...this.stats },
    };
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
    listen(handoverSubject(this.#prefix, this.#service, this.id), (msg) => this.#takeHanded(msg));
    this.#timer = setInterval(() => this.#tick(), this.#times.heartbeatMs);
    this.#publishHeartbeat();
    void this.#nc.closed().then(() => this.#stop());
  }

  /**
   * Says it is leaving, hands every partition over to its owner among the others (or
   * drains it when there is none), and resolves once it holds none. Idempotent.
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
    this.#held.clear();
    this.#moving.clear();
    if (!this.#nc.isClosed()) {
      this.#publishHeartbeat(); // the last: leaving, holding nothing
      for (const sub of this.#subs) sub.unsubscribe();
    }
    this.#allHandedOver();
  }

  #heldList(): number[] {
    return [...this.#held.keys()].sort((a, b) => a - b);
  }

  /** Every heartbeat: say it, count the silent peers dead, and act. */
  #tick(): void {
    if (this.#stopped) return;
    this.#publishHeartbeat();
    const dead = this.#members.expire(performance.now());
    if (dead.length > 0) {
      this.#host.onError(new Error(`keyed peers not heard from, counted dead: ${dead.join(", ")}`), "keyed");
    }
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
    if (isNew) this.#sayChanged();
    if (isNew || member.leaving) this.#act();
  }

  /** Says what this worker holds, once for everything changed in this turn. */
  #sayChanged(): void {
    if (this.#sayPending) return;
    this.#sayPending = true;
    queueMicrotask(() => {
      this.#sayPending = false;
      if (!this.#stopped) this.#publishHeartbeat();
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
    const held = new Set(this.#held.keys());
    for (const step of this.#members.plan(held, this.#moving, this.#leaving, performance.now())) {
      if (step.kind === "handOver") this.#handOver(step.partition, step.to);
      else this.#take(step.partition, undefined);
    }
    if (this.#leaving) {
      // Nobody left to take them: they drain, and their state ends here.
      for (const partition of held) {
        if (!this.#moving.has(partition) && this.#members.owner(partition, true) === undefined) {
          this.#handOver(partition, undefined);
        }
      }
    }
  }

  /** Queues the take-over for the loop, then subscribes `partition`. */
  #take(partition: number, state: Uint8Array | undefined): void {
    if (state === undefined) this.stats.takenFresh += 1;
    else this.stats.takenHanded += 1;
    this.#host.takeOver(partition, state);
    const subject = partitionSubject(this.#prefix, this.#service, partition);
    const methodAt = subject.length + 1;
    try {
      const sub = this.#nc.subscribe(`${subject}.>`, {
        queue: partitionGroup(this.#service, partition),
        callback: (error, msg) => {
          if (error === null) this.#host.offer(msg, msg.subject.slice(methodAt));
        },
      });
      this.#held.set(partition, sub);
    } catch (error) {
      this.#host.onError(error, `cannot subscribe partition ${partition}`);
    }
    this.#sayChanged();
  }

  /** Starts handing `partition` over to `to` (`undefined`: nobody, it just drains). */
  #handOver(partition: number, to: string | undefined): void {
    const sub = this.#held.get(partition);
    if (sub === undefined || this.#moving.has(partition)) return;
    this.#moving.add(partition);
    void this.#move(partition, sub, to);
  }

  async #move(partition: number, sub: Subscription, to: string | undefined): Promise<void> {
    try {
      // UNSUB; whatever the bus routed here before it is still queued.
      await sub.drain();
    } catch (error) {
      this.#host.onError(error, `draining partition ${partition}`);
    }
    if (to === undefined) {
      this.#held.delete(partition);
      this.#moving.delete(partition);
      this.#sayChanged();
      this.#settle();
      return;
    }
    // The loop answers after the partition's last request here.
    const state = await this.#host.handOver(partition);
    const handover = create(HandOverSchema, { partition, state, from: this.id });
    let taken = false;
    try {
      const answer = await this.#nc.request(
        handoverSubject(this.#prefix, this.#service, to),
        toBinary(HandOverSchema, handover),
        { timeout: this.#times.handoverTimeoutMs },
      );
      taken = answer.data.length === 0;
    } catch {
      // No answer in time, nobody there, or the connection closed: kept here.
    }
    if (this.#stopped) return;
    this.#moving.delete(partition);
    this.#held.delete(partition);
    if (taken) {
      this.stats.handedOk += 1;
      this.#sayChanged();
    } else {
      this.stats.handedKept += 1;
      this.#host.onError(new Error(`worker ${to} did not take partition ${partition}: kept here`), "keyed");
      this.#take(partition, state);
    }
    this.#settle();
  }

  /** A peer hands a partition over to this worker. */
  #takeHanded(msg: Msg): void {
    if (!msg.reply) return;
    let handover: HandOver;
    try {
      handover = fromBinary(HandOverSchema, msg.data);
    } catch (error) {
      this.#host.onError(error, "a hand-over that does not decode: refused");
      this.#answer(msg, REFUSED);
      return;
    }
    const { partition, state } = handover;
    if (this.#leaving || this.#stopped || this.#moving.has(partition) || partition >= this.#members.partitions) {
      this.#answer(msg, REFUSED);
      return;
    }
    if (this.#held.has(partition)) {
      // Two views disagreed for a moment: the state handed over replaces this one.
      this.stats.conflicts += 1;
      this.#host.onError(new Error(`handed partition ${partition}, held here already, by ${handover.from}`), "keyed");
      this.#host.takeOver(partition, state);
    } else {
      this.#take(partition, state);
    }
    this.#answer(msg, new Uint8Array());
  }

  #answer(msg: Msg, body: Uint8Array): void {
    try {
      msg.respond(body);
    } catch (error) {
      this.#host.onError(error, "answering a hand-over");
    }
  }

  /** Ends the leaving once nothing is held. */
  #settle(): void {
    if (this.#leaving && this.#held.size === 0) this.#allHandedOver();
  }
}
