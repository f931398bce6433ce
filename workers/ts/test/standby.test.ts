// The standby's replicas without a bus (src/standby.ts), pinned as Rust's
// `services/src/worker/keyed/standby.rs` tests pin them: a TypeScript and a Rust worker
// keep, refuse, take and drop the same replicas.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Members } from "../src/index.js";
import type { Replica } from "../src/gen/rpc_pb.js";
import { ReplicaSchema } from "../src/gen/rpc_pb.js";
import { Replicas } from "../src/standby.js";
import { batches } from "../src/replicate.js";
import { PartitionStateSchema } from "../src/gen/rpc_pb.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function replica(from: string, seq: number, states: [number, string][]): Replica {
  const partitions = states.map(([partition, state]) => ({ partition, state: encoder.encode(state) }));
  return create(ReplicaSchema, { from, seq: BigInt(seq), partitions });
}

/** The states a dead owner's partitions would be adopted with, by partition. */
function orphans(replicas: Replicas, members: Members, held: (p: number) => boolean = () => false): Map<number, string> {
  return new Map(replicas.orphans(members, held).map(([p, state]) => [p, decoder.decode(state)]));
}

test("the newest state per partition is kept; a partition out of range refuses the replica", () => {
  const replicas = new Replicas();
  assert.equal(replicas.keep(replica("a", 2, [[0, "two"]]), 4, 0), undefined);
  assert.equal(replicas.keep(replica("a", 1, [[0, "one"], [1, "x"]]), 4, 0), undefined);
  assert.equal(replicas.keep(replica("b", 1, [[3, "b1"]]), 4, 0), undefined);
  const refused = replicas.keep(replica("a", 3, [[2, "y"], [4, "z"]]), 4, 0);
  assert.match(refused ?? "", /partition 4 out of range/);
  assert.deepEqual(replicas.partitions, [0, 1, 3], "nothing of a refused replica is kept");
  // Every sender counted dead here: each state can be taken.
  const nobody = new Members("me", 4, { timeoutMs: 1_000, listenMs: 0 }, 0);
  assert.equal(orphans(replicas, nobody).size, 0, "never heard of is not dead");
  replicas.bury(["a", "b"]);
  const taken = orphans(replicas, nobody);
  assert.equal(taken.get(0), "two", "a late copy never replaces a newer state");
  assert.equal(taken.get(1), "x");
  const other = new Replicas();
  other.keep(replica("a", 5, [[0, "a5"]]), 4, 0);
  other.keep(replica("b", 1, [[0, "b1"]]), 4, 0);
  other.bury(["a", "b"]);
  assert.equal(orphans(other, nobody).get(0), "b1", "another owner's replaces it: the partition moved");
});

test("a replica is taken from a dead owner only, and dropped when not stood by for", () => {
  const timeoutMs = 2_000;
  const view = new Members("me", 8, { timeoutMs, listenMs: 0 }, 0);
  const all = Array.from({ length: 8 }, (_, p) => p);
  view.heard("owner", all, false, 0);
  const replicas = new Replicas();
  replicas.keep(replica("owner", 1, all.map((p) => [p, "s"])), 8, 0);
  assert.equal(orphans(replicas, view).size, 0, "its owner lives");
  // With two workers, this one follows the owner in every partition's order.
  replicas.prune(view, false, () => false, timeoutMs, 0);
  assert.equal(replicas.partitions.length, 8);
  // The owner no longer says it holds 0..4: dropped once the grace is over.
  view.heard("owner", [4, 5, 6, 7], false, 0);
  replicas.prune(view, false, () => false, timeoutMs, 0);
  assert.equal(replicas.partitions.length, 8, "within the grace");
  replicas.prune(view, false, () => false, timeoutMs, timeoutMs);
  assert.deepEqual(replicas.partitions, [4, 5, 6, 7]);
  // Leaving, this worker stands by for nothing a live owner holds.
  const leaving = new Replicas();
  leaving.keep(replica("owner", 1, [[4, "s"]]), 8, 0);
  leaving.prune(view, true, () => false, timeoutMs, 0);
  assert.deepEqual(leaving.partitions, []);
  // The owner dies: its replicas nobody holds are taken (not one held here or claimed
  // elsewhere); the others are dropped once claimed elsewhere or held here.
  replicas.bury(view.expire(timeoutMs * 2).dead);
  view.heard("other", [5], false, timeoutMs * 2);
  assert.deepEqual([...orphans(replicas, view, (p) => p === 6).keys()], [4, 7]);
  replicas.prune(view, false, (p) => p === 6, timeoutMs, timeoutMs);
  assert.deepEqual(replicas.partitions, []);
});

test("states share a replica up to the bus's payload limit; one too large goes alone", () => {
  const state = (partition: number, len: number) =>
    create(PartitionStateSchema, { partition, state: new Uint8Array(len).fill(7) });
  const parts = (list: ReturnType<typeof batches>) => list.map((b) => b.map((s) => s.partition));
  assert.deepEqual(parts(batches([state(0, 10), state(1, 10), state(2, 10)], 1024)), [[0, 1, 2]]);
  // 400 bytes each: two fit under 1,024 with the envelope, the third does not.
  assert.deepEqual(parts(batches([state(0, 400), state(1, 400), state(2, 400)], 1024)), [[0, 1], [2]]);
  assert.deepEqual(parts(batches([state(0, 10), state(1, 5000), state(2, 10)], 1024)), [[0], [1], [2]]);
});
