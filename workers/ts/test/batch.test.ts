// A worker loop's batch without a bus (src/batch.ts): with standbys, what a batch sends
// waits until its changed partitions' snapshots have been sent to their standbys.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Batch } from "../src/batch.js";
import type { Replication } from "../src/batch.js";

/**
 * A replication that writes what happens, in order, to `log`; partition 9's snapshot
 * fails; partition 6 has no standby.
 */
function recorded(log: string[]): Replication {
  return {
    standsBy: (partition) => partition !== 6,
    snapshot: async (partition) => (partition === 9 ? undefined : new TextEncoder().encode(`s${partition}`)),
    replicate: async (states) => void log.push(`replicate ${states.map((s) => s.partition).join(",")}`),
    onError: (_error, where) => void log.push(`error ${where}`),
  };
}

test("without standbys a batch holds nothing", async () => {
  const log: string[] = [];
  const batch = new Batch(undefined);
  batch.turn();
  batch.mark([1]);
  batch.emit(() => log.push("answer"));
  assert.deepEqual(log, ["answer"]);
  assert.equal(batch.open, false);
  await batch.end();
  assert.deepEqual(log, ["answer"]);
});

test("a batch's answers leave after its changed partitions reach their standbys, in order", async () => {
  const log: string[] = [];
  const batch = new Batch(recorded(log));
  batch.emit(() => log.push("before"));
  assert.deepEqual(log, ["before"], "no batch under way: sent at once");
  batch.turn();
  batch.mark([3, undefined, 1, 6]);
  batch.emit(() => log.push("answer 1"));
  batch.mark([2]);
  batch.unmark(2); // handed over: its new owner's standby gets it
  batch.emit(() => log.push("answer 2"));
  assert.deepEqual(log, ["before"], "held while the batch is under way");
  await batch.end();
  assert.deepEqual(log, ["before", "replicate 3,1", "answer 1", "answer 2"], "6 has no standby: not sent");
  // The next batch starts with nothing changed.
  batch.turn();
  batch.emit(() => log.push("answer 3"));
  await batch.end();
  assert.deepEqual(log.slice(4), ["answer 3"]);
});

test("a failed snapshot is told, and the batch's answers still leave", async () => {
  const log: string[] = [];
  const batch = new Batch(recorded(log));
  batch.turn();
  batch.mark([9]);
  batch.emit(() => log.push("answer"));
  await batch.end();
  assert.deepEqual(log, ["error partition 9", "answer"]);
});
