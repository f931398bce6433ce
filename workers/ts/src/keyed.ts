/**
 * A keyed service's partitions on one worker: hearing its peers, which it holds, taking
 * and serving them, and keeping its peers' replicas (the Rust reference is
 * `services/src/worker/keyed.rs`); moving them with their state is `handover.ts`'s. The
 * protocol, step by step, is in README.md, "How partitions move", and docs/workers.md,
 * "Keyed services".
 */
import { randomBytes } from "node:crypto";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { KeyedMember, PartitionState } from "./gen/rpc_pb.js";
import { KeyedMemberSchema } from "./gen/rpc_pb.js";
import { DONE, Handovers } from "./handover.js";
import type { HandoverHost, Held, Holder, How, Request } from "./handover.js";
import { checkKeyedTimes } from "./keyed-settings.js";
import type { KeyedSettings } from "./keyed-settings.js";
import { Members } from "./ownership.js";
import { Replicator } from "./replicate.js";
import { noteSeen } from "./seen.js";
import { Replicas, decodeReplica } from "./standby.js";
import { handoverSubject, membersSubject, partitionSubject, replicaSubject } from "./subjects.js";

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
export interface PartitionHost extends HandoverHost {
  /** Queues a turn that marks `partition` changed: its standby gets it whole after the batch. */
  replicate(partition: number): void;
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
  /** The partitions on their way out and in. */
  readonly #handovers: Handovers;
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
    const holder: Holder = {
      id: this.id,
      partitions: this.#members.partitions,
      stats: this.stats,
      held: this.#held,
      leaving: () => this.#leaving,
      lives: (id) => this.#members.lives(id),
      subscribe: (partition) => this.#subscribe(partition),
      take: (partition, state, how) => this.#take(partition, state, how),
      takenOver: (partition, state, how) => this.#takenOver(partition, state, how),
      sayChanged: () => this.#sayChanged(),
      settle: () => this.#settle(),
    };
    this.#handovers = new Handovers(nc, prefix, service, settings, host, holder);
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
      moving: ascending(this.#handovers.moving),
      preparing: ascending(this.#handovers.preparing.keys()),
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
    listen(handoverSubject(this.#prefix, this.#service, this.id), (msg) => this.#handovers.handedOver(msg));
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
    this.#handovers.stop();
    this.#held.clear();
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
    const settled = [...this.#held.keys()].filter((partition) => !this.#handovers.moving.has(partition));
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
    const here = (partition: number) => this.#held.has(partition) || this.#handovers.preparing.has(partition);
    for (const [partition, state] of this.#replicas.orphans(this.#members, here)) {
      this.#take(partition, state, "standby");
    }
    const held = new Set(this.#held.keys());
    for (const step of this.#members.plan(held, this.#handovers.moving, this.#leaving, performance.now())) {
      if (step.kind === "handOver") this.#handovers.handOver(step.partition, step.to);
      else this.#take(step.partition, undefined, "fresh");
    }
    if (this.#leaving) {
      for (const partition of held) {
        if (!this.#handovers.moving.has(partition) && this.#members.owner(partition, true) === undefined) {
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
    if (this.#handovers.hold(partition, request)) return;
    const held = this.#held.get(partition);
    if (held === undefined) return;
    if (held.seen !== undefined) noteSeen(held.seen, request.msg.data);
    this.#host.offer(request.msg, request.method, partition);
  }

  /**
   * Takes `partition` (fresh, with a dead owner's replica, or back after an unanswered
   * hand-over), adopting it if prepared.
   */
  #take(partition: number, state: Uint8Array | undefined, how: How): void {
    if (this.#handovers.takePrepared(partition, state, how)) return;
    this.#takenOver(partition, state, how);
    try {
      this.#held.set(partition, { sub: this.#subscribe(partition), seen: undefined });
    } catch (error) {
      this.#host.onError(error, `cannot subscribe partition ${partition}`);
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

  /** Ends the leaving once nothing is held or prepared. */
  #settle(): void {
    if (this.#leaving && this.#held.size === 0 && this.#handovers.preparing.size === 0) this.#allHandedOver();
  }
}

function ascending(partitions: Iterable<number>): number[] {
  return [...partitions].sort((a, b) => a - b);
}
