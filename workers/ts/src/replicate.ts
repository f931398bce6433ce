/**
 * The owner's side of standbys (docs/workers.md, "Standbys"; the Rust reference is
 * `services/src/worker/keyed/replicate.rs`): after each batch of work, the snapshots of
 * the partitions it changed go to each partition's standby, one `Replica` request per
 * standby, and the batch's answers wait until every standby holds them, or the replica
 * timeout has passed. A standby that did not answer in time (or refused, or is not
 * there) is not waited for again for a rest (one keyed heartbeat): its partitions are
 * counted unreplicated, and sent again whole once the rest is over.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import type { NatsConnection } from "@nats-io/transport-node";
import type { PartitionState } from "./gen/rpc_pb.js";
import { PartitionStateSchema, ReplicaSchema } from "./gen/rpc_pb.js";
import { replicaSubject } from "./subjects.js";

/** What a `Replica`'s own fields take beside its states, generously. */
const ENVELOPE = 64;
/** The largest payload assumed when the server has not said its own. */
const DEFAULT_MAX_PAYLOAD = 1024 * 1024;
/** At most one warning about failing standbys this often, ms. */
const WARN_EVERY_MS = 1_000;

/** Names and bounds of one worker's replication. */
export interface ReplicatorSettings {
  readonly prefix: string;
  readonly service: string;
  /** This worker's keyed id: `Replica.from`. */
  readonly me: string;
  /** How long a batch waits for a standby's answer, ms. */
  readonly timeoutMs: number;
  /** How long a standby that failed is not waited for, ms (one keyed heartbeat). */
  readonly restMs: number;
}

/** Sends partitions' snapshots to their standbys; see the module docs. */
export class Replicator {
  /** Replicas a standby did not hold in time (or refused): the batch went on without it. */
  failures = 0;
  readonly #nc: NatsConnection;
  readonly #settings: ReplicatorSettings;
  readonly #onError: (error: unknown, where: string) => void;
  /** The last `Replica.seq` used. */
  #seq = 0n;
  /** Each held partition's standby. */
  #standbys = new Map<number, string>();
  /** Standbys that failed, and until when (`performance.now()`) they are not waited for. */
  readonly #resting = new Map<string, number>();
  /** Partitions whose latest snapshot is not at their standby. */
  readonly #unreplicated = new Set<number>();
  #warned = -Infinity;

  constructor(nc: NatsConnection, settings: ReplicatorSettings, onError: (error: unknown, where: string) => void) {
    this.#nc = nc;
    this.#settings = settings;
    this.#onError = onError;
  }

  /** Whether `partition` has a standby now. */
  standsBy(partition: number): boolean {
    return this.#standbys.has(partition);
  }

  /**
   * Takes each held partition's standby (`held`: the partitions held here), and gives
   * the partitions to send whole now: those whose standby changed, and those a standby
   * missed once its rest is over.
   */
  follow(standbys: Map<number, string>, held: ReadonlySet<number>): number[] {
    const send = new Set<number>();
    for (const [partition, standby] of standbys) {
      if (this.#standbys.get(partition) !== standby) send.add(partition);
    }
    this.#standbys = standbys;
    const now = performance.now();
    for (const partition of this.#unreplicated) {
      if (!held.has(partition)) {
        this.#unreplicated.delete(partition);
        continue;
      }
      const standby = standbys.get(partition);
      if (standby !== undefined && !this.#rests(standby, now)) send.add(partition);
    }
    return [...send];
  }

  /** Partitions of the `held` here whose latest state no standby holds (with those that have none). */
  unreplicated(held: number): number {
    return this.#unreplicated.size + Math.max(0, held - this.#standbys.size);
  }

  /**
   * Sends `states` to their partitions' standbys and resolves once each holds them, at
   * most the replica timeout later; a partition without a standby is skipped.
   */
  async send(states: readonly PartitionState[]): Promise<void> {
    const byStandby = new Map<string, PartitionState[]>();
    for (const state of states) {
      const standby = this.#standbys.get(state.partition);
      if (standby === undefined) continue;
      const list = byStandby.get(standby) ?? [];
      list.push(state);
      byStandby.set(standby, list);
    }
    const now = performance.now();
    const max = this.#nc.info?.max_payload ?? DEFAULT_MAX_PAYLOAD;
    const asks: Promise<void>[] = [];
    for (const [standby, list] of byStandby) {
      if (this.#rests(standby, now)) {
        for (const state of list) this.#unreplicated.add(state.partition);
        continue;
      }
      for (const batch of batches(list, max)) {
        this.#seq += 1n;
        const replica = create(ReplicaSchema, { from: this.#settings.me, seq: this.#seq, partitions: batch });
        asks.push(this.#ask(standby, toBinary(ReplicaSchema, replica)).then((why) => this.#heard(standby, batch, why)));
      }
    }
    await Promise.all(asks);
  }

  /** Whether `standby` failed lately, and is not waited for now. */
  #rests(standby: string, now: number): boolean {
    const until = this.#resting.get(standby);
    return until !== undefined && now < until;
  }

  /** Sends one replica to `standby`: `undefined` once it holds it, else why not. */
  async #ask(standby: string, payload: Uint8Array): Promise<string | undefined> {
    const { prefix, service, timeoutMs } = this.#settings;
    try {
      const answer = await this.#nc.request(replicaSubject(prefix, service, standby), payload, { timeout: timeoutMs });
      return answer.data.length === 0 ? undefined : `refused: ${new TextDecoder().decode(answer.data)}`;
    } catch (error) {
      // No answer within the timeout, nobody there, or the connection closed.
      return `no answer within the replica timeout (${timeoutMs} ms): ${String(error)}`;
    }
  }

  /** `standby`'s answer to `batch`: held, or failed (`why`). */
  #heard(standby: string, batch: readonly PartitionState[], why: string | undefined): void {
    if (why === undefined) {
      this.#resting.delete(standby);
      for (const state of batch) this.#unreplicated.delete(state.partition);
      return;
    }
    this.#resting.set(standby, performance.now() + this.#settings.restMs);
    for (const state of batch) this.#unreplicated.add(state.partition);
    this.failures += 1;
    const now = performance.now();
    if (now - this.#warned >= WARN_EVERY_MS) {
      this.#warned = now;
      const what = `standby ${standby} does not hold what a batch changed (${why})`;
      const then = "the batch's answers left without it, and its partitions are unreplicated until it answers again";
      this.#onError(new Error(`${what}: ${then}`), "standby");
    }
  }
}

/**
 * `states` in requests the bus takes (`max` bytes of payload each); a state too large
 * for one alone goes alone, and the bus refuses it (counted, said, unreplicated).
 */
export function batches(states: readonly PartitionState[], max: number): PartitionState[][] {
  const out: PartitionState[][] = [];
  let size = 0;
  for (const state of states) {
    const len = toBinary(PartitionStateSchema, state).length + 8;
    const last = out.at(-1);
    if (last !== undefined && size + len + ENVELOPE <= max) {
      last.push(state);
    } else {
      size = 0;
      out.push([state]);
    }
    size += len;
  }
  return out;
}
