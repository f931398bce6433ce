/**
 * The standby's side (docs/workers.md, "Standbys"; the Rust reference is
 * `services/src/worker/keyed/standby.rs`): a worker keeps the latest state of each
 * partition it stands by for, as its owner sends it after each batch, and takes the
 * partition with it when the owner is counted dead (it is then the partition's owner:
 * the next in rendezvous order). It keeps a replica only while it is its sender's
 * standby and the sender holds the partition, so a replica it kept is never older than
 * the state a live owner would hand over.
 */
import { fromBinary } from "@bufbuild/protobuf";
import type { Replica } from "./gen/rpc_pb.js";
import { ReplicaSchema } from "./gen/rpc_pb.js";
import type { Members } from "./ownership.js";

/** One partition's latest state from its owner. */
interface Kept {
  readonly from: string;
  readonly seq: bigint;
  readonly state: Uint8Array;
  /** When it came (`performance.now()`). */
  readonly at: number;
  /**
   * Its sender was counted dead here (not merely unheard of yet: a replica can come
   * before its sender's first heartbeat does).
   */
  dead: boolean;
}

/** A replica as it came off the bus, or why it is refused. */
export function decodeReplica(payload: Uint8Array): Replica | string {
  try {
    return fromBinary(ReplicaSchema, payload);
  } catch (error) {
    return `a replica that does not decode: ${String(error)}`;
  }
}

/**
 * The replicas this worker holds as a standby: one per partition at most, so at most
 * the partition count times the bus's largest payload.
 */
export class Replicas {
  readonly #kept = new Map<number, Kept>();

  /** The partitions a replica is kept of, ascending. */
  get partitions(): number[] {
    return [...this.#kept.keys()].sort((a, b) => a - b);
  }

  /**
   * Keeps `replica`'s states (each unless a later one from the same owner is here);
   * refuses the whole of it when a partition is out of range: then says why.
   */
  keep(replica: Replica, partitions: number, now: number): string | undefined {
    const bad = replica.partitions.find((s) => s.partition >= partitions);
    if (bad !== undefined) return `partition ${bad.partition} out of range: the service has ${partitions}`;
    for (const { partition, state } of replica.partitions) {
      const kept = this.#kept.get(partition);
      if (kept !== undefined && kept.from === replica.from && kept.seq > replica.seq) continue;
      this.#kept.set(partition, { from: replica.from, seq: replica.seq, state, at: now, dead: false });
    }
    return undefined;
  }

  /** Marks what `dead` sent: its senders were counted dead. */
  bury(dead: readonly string[]): void {
    for (const kept of this.#kept.values()) kept.dead ||= dead.includes(kept.from);
  }

  /**
   * The partitions kept from owners counted dead that nobody holds (`held`: here), with
   * their states, taken out.
   */
  orphans(members: Members, held: (partition: number) => boolean): [number, Uint8Array][] {
    const orphans: [number, Uint8Array][] = [];
    for (const [partition, kept] of this.#kept) {
      if (!kept.dead || members.claimed(partition) || held(partition)) continue;
      this.#kept.delete(partition);
      orphans.push([partition, kept.state]);
    }
    return orphans.sort(([a], [b]) => a - b);
  }

  /**
   * Drops what this worker no longer stands by for: a live sender's partition this
   * worker would not take if the sender died (or any, once `leaving`), or that the
   * sender stopped holding (after `graceMs`, for a sender whose heartbeat has not said
   * it holds it yet); a dead sender's partition someone claims or this worker `held`; a
   * sender's not heard of within `graceMs`.
   */
  prune(members: Members, leaving: boolean, held: (partition: number) => boolean, graceMs: number, now: number): void {
    for (const [partition, kept] of this.#kept) {
      let keep: boolean;
      const recent = now - kept.at < graceMs;
      const heard = members.lastHeard(kept.from);
      if (heard !== undefined) {
        // As of the sender's last heartbeat: it sent its states to the standby it had then.
        const mine = members.successor(partition, kept.from, leaving, heard) === members.me;
        keep = mine && (members.holds(kept.from, partition) || recent);
      } else if (kept.dead) {
        keep = !members.claimed(partition) && !held(partition);
      } else {
        keep = recent;
      }
      if (!keep) this.#kept.delete(partition);
    }
  }
}
