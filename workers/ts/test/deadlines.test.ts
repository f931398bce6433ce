// The worker's deadlines on one timer, without a bus.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Deadlines } from "../src/deadlines.js";

test("deadlines expire in rank order at one instant, never early, and removed ones never", async () => {
  const deadlines = new Deadlines();
  const expired: string[] = [];
  let done = (): void => {};
  const all = new Promise<void>((resolve) => (done = resolve));
  const now = performance.now();
  const at = now + 30;
  const record = (name: string) => (): void => {
    assert.ok(performance.now() >= at, `${name} expired early`);
    expired.push(name);
    if (expired.length === 3) done();
  };
  deadlines.add("request", at, record("request"));
  const gone = deadlines.add("call", at, () => assert.fail("a removed deadline expired"));
  deadlines.add("call", at, record("call"));
  // Later ones are armed for once the earlier have expired.
  deadlines.add("request", at + 20, record("later request"));
  deadlines.remove(gone);
  await all;
  assert.deepEqual(expired, ["call", "request", "later request"]);
  deadlines.close();
});

test("an earlier deadline added later re-arms the timer", async () => {
  const deadlines = new Deadlines();
  const started = performance.now();
  deadlines.add("request", started + 60_000, () => assert.fail("closed before"));
  await new Promise<void>((resolve) => deadlines.add("call", started + 10, resolve));
  assert.ok(performance.now() - started < 30_000);
  deadlines.close();
});
