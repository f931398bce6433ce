/**
 * A worker loop's batch, with standbys (docs/workers.md, "Standbys"): the turns the loop
 * takes before it waits for more or yields to I/O. What the batch's handlers answer and
 * push is held, with the keyed partitions they changed; at its end the partitions are
 * snapshotted and sent to their standbys, and only then does what was held leave, in
 * order. So an answer of 200 means the partition's standby has what produced it.
 * Without standbys nothing is held: a batch is only the loop's pace.
 *
 * Pure bookkeeping over the callbacks the worker passes in (the service's snapshots,
 * the partitions' replicator), so it is tested without a bus.
 */
import { create } from "@bufbuild/protobuf";
import type { PartitionState } from "./gen/rpc_pb.js";
import { PartitionStateSchema } from "./gen/rpc_pb.js";

/** What a batch's end needs: the partitions' snapshots, and their standbys. */
export interface Replication {
  /** Whether `partition` has a standby now: one without is not snapshotted. */
  standsBy(partition: number): boolean;
  /** `partition`'s state now; `undefined` when the service's callback failed. */
  snapshot(partition: number): Promise<Uint8Array | undefined>;
  /** Sends `states` to their standbys; resolves once they hold them, or a bound has passed. */
  replicate(states: readonly PartitionState[]): Promise<void>;
  onError(error: unknown, where: string): void;
}

export class Batch {
  /** The partitions this batch changed; `undefined` without standbys. */
  readonly #changed: Set<number> | undefined;
  /** This batch's answers and pushes, in order. */
  readonly #held: (() => void)[] = [];
  #open = false;

  constructor(readonly replication: Replication | undefined) {
    this.#changed = replication === undefined ? undefined : new Set();
  }

  /** Whether a batch is under way (with standbys): its end is due before the loop waits. */
  get open(): boolean {
    return this.#open;
  }

  /** The loop takes a turn: a batch is under way, if it was not. */
  turn(): void {
    this.#open = this.#changed !== undefined;
  }

  /** Marks keyed partitions this batch changed (`undefined` entries are skipped). */
  mark(partitions: Iterable<number | undefined> | undefined): void {
    if (this.#changed === undefined || partitions === undefined) return;
    for (const partition of partitions) if (partition !== undefined) this.#changed.add(partition);
  }

  /** `partition` left (handed over): its new owner's standby gets it from the new owner. */
  unmark(partition: number): void {
    this.#changed?.delete(partition);
  }

  /** Sends now, or while a batch is under way, once its standbys hold what it changed. */
  emit(send: () => void): void {
    if (this.#open) this.#held.push(send);
    else send();
  }

  /**
   * Ends the batch: snapshots the partitions it changed, sends them to their standbys
   * and waits for them, then sends what the batch held (and what handlers or deadlines
   * sent meanwhile), in order.
   */
  async end(): Promise<void> {
    const [changed, replication] = [this.#changed, this.replication];
    if (changed === undefined || replication === undefined || !this.#open) return;
    const states: PartitionState[] = [];
    for (const partition of [...changed]) {
      changed.delete(partition);
      if (!replication.standsBy(partition)) continue;
      const state = await replication.snapshot(partition);
      if (state === undefined) {
        const why = "the snapshot callback failed: its standby keeps the last one";
        replication.onError(new Error(why), `partition ${partition}`);
        continue;
      }
      states.push(create(PartitionStateSchema, { partition, state }));
    }
    if (states.length > 0) await replication.replicate(states);
    this.#open = false;
    for (const send of this.#held.splice(0)) send();
  }
}
