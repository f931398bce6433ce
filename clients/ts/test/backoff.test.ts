/** The reconnect schedule, alone: exponential, capped, jittered to between half and all. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { backoffDelay, DEFAULT_RECONNECT } from "../src/index.js";
import { nextUrlIndex } from "../src/backoff.js";

const policy = { ...DEFAULT_RECONNECT, initialDelayMs: 100, maxDelayMs: 1_000 };

test("the delay doubles per attempt up to the cap", () => {
  const top = (attempt: number) => backoffDelay(attempt, policy, () => 1);
  assert.deepEqual([0, 1, 2, 3, 4, 5, 60].map(top), [100, 200, 400, 800, 1_000, 1_000, 1_000]);
});

test("jitter keeps each delay between half and all of it", () => {
  assert.equal(backoffDelay(2, policy, () => 0), 200);
  assert.equal(backoffDelay(2, policy, () => 0.5), 300);
  for (let i = 0; i < 100; i++) {
    const d = backoffDelay(3, policy);
    assert.ok(d >= 400 && d <= 800, String(d));
  }
});

test("a zero initial delay cannot spin", () => {
  assert.ok(backoffDelay(0, { ...policy, initialDelayMs: 0, maxDelayMs: 0 }, () => 0) > 0);
});

test("reconnects go to the next URL in turn", () => {
  const urls = ["a", "b", "c"];
  assert.deepEqual([0, 1, 2].map((i) => nextUrlIndex(i, urls)), [1, 2, 0]);
  assert.equal(nextUrlIndex(0, ["only"]), 0);
});
