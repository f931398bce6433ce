// Keyed services' hash, owners and plan, without a bus. The pinned values come from the
// Rust functions (proto/src/keyed.rs `fnv1a`, services/src/ownership.rs `score`), so a
// TypeScript and a Rust worker of one service agree on every owner.
import assert from "node:assert/strict";
import { test } from "node:test";
import { MAX_PARTITIONS, Members, fnv1a, partitionOf, score } from "../src/index.js";
import type { Step } from "../src/index.js";

const TIMES = { timeoutMs: 3_000, listenMs: 1_000 };

function fresh(steps: readonly Step[]): number[] {
  return steps.flatMap((s) => (s.kind === "takeFresh" ? [s.partition] : []));
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}

test("fnv1a and partitionOf match the Rust values", () => {
  assert.equal(fnv1a(""), 0x811c9dc5);
  assert.equal(fnv1a("a"), 0xe40c292c);
  assert.equal(fnv1a("foobar"), 0xbf9cf968);
  assert.equal(fnv1a(new TextEncoder().encode("foobar")), 0xbf9cf968);
  assert.equal(fnv1a("match-1"), 0x226896f0);
  assert.equal(partitionOf("match-1", 64), 0x226896f0 % 64);
  for (const n of [1, 2, 7, 64, MAX_PARTITIONS]) {
    for (const key of ["", "a", "ann", "match-17", "été"]) {
      const p = partitionOf(key, n);
      assert.ok(Number.isInteger(p) && p >= 0 && p < n, `${key} in ${n}: ${p}`);
    }
  }
  assert.equal(partitionOf("x", 0), 0, "0 partitions is treated as 1");
  // A key is hashed as UTF-8, as the gates do.
  assert.equal(fnv1a("été"), fnv1a(new Uint8Array([0xc3, 0xa9, 0x74, 0xc3, 0xa9])));
});

test("score matches the Rust rendezvous score", () => {
  // Printed by services/src/ownership.rs `score`, compiled as it is.
  assert.equal(score("a", 0), 0xa804af28);
  assert.equal(score("b", 1), 0x03b928d0);
  assert.equal(score("worker-0", 7), 0xc4a08ec2);
  assert.equal(score("0123456789abcdef", 63), 0x582d5bb8);
  assert.equal(score("ffffffffffffffff", 1023), 0xead7fe2f);
});

test("alone, a worker takes everything once it has listened", () => {
  const m = new Members("a", 8, TIMES, 0);
  const none = new Set<number>();
  assert.deepEqual(m.plan(none, none, false, TIMES.listenMs - 1), [], "too early");
  assert.deepEqual(fresh(m.plan(none, none, false, TIMES.listenMs)), range(8));
});

test("owners agree, and a newcomer takes a fair share only from its peers", () => {
  const ids = range(4).map((n) => `worker-${n}`);
  const ownersOf = (alive: string[]): string[] => {
    // Every member's own view gives the same owners.
    const views = alive.map((me) => {
      const m = new Members(me, 64, TIMES, 0);
      for (const peer of alive.filter((p) => p !== me)) m.heard(peer, [], false, 0);
      return range(64).map((p) => m.owner(p, false) ?? "");
    });
    for (const view of views) assert.deepEqual(view, views[0], "views differ");
    return views[0] ?? [];
  };
  const three = ownersOf(ids.slice(0, 3));
  const four = ownersOf(ids);
  const moved = range(64).filter((p) => three[p] !== four[p]);
  assert.ok(moved.every((p) => four[p] === ids[3]), "only the newcomer gains");
  assert.ok(moved.length >= 8 && moved.length <= 24, `moved ${moved.length}`);
});

test("ties go to the greater id, and the owner is the highest score", () => {
  const m = new Members("m", 16, TIMES, 0);
  m.heard("n", [], false, 0);
  m.heard("o", [], false, 0);
  for (const p of range(16)) {
    const best = ["m", "n", "o"].reduce((a, b) => {
      const [sa, sb] = [score(a, p), score(b, p)];
      return sb > sa || (sb === sa && b > a) ? b : a;
    });
    assert.equal(m.owner(p, false), best);
  }
});

test("held partitions go to their owner, and a leaver keeps none", () => {
  const m = new Members("a", 16, TIMES, 0);
  m.heard("b", [], false, 0);
  const held = new Set(range(16));
  const steps = m.plan(held, new Set(), false, 0);
  const toB = range(16).filter((p) => m.owner(p, false) === "b");
  assert.ok(toB.length > 0 && toB.length < 16);
  assert.deepEqual(
    steps,
    toB.map((partition) => ({ kind: "handOver", partition, to: "b" })),
  );
  // Leaving: every partition goes to b; one being moved is left alone.
  const leaving = m.plan(held, new Set([3]), true, 0);
  assert.equal(leaving.length, 15);
  assert.ok(leaving.every((s) => s.kind === "handOver" && s.to === "b" && s.partition !== 3));
  // Nobody else: a leaver has no owner to hand to.
  assert.equal(new Members("a", 4, TIMES, 0).owner(0, true), undefined);
});

test("a claimed partition waits for its hand-over, and a dead claim frees it", () => {
  const m = new Members("a", 4, TIMES, 0);
  // "z" holds everything and is leaving: "a" owns all but takes nothing fresh.
  m.heard("z", [0, 1, 2, 3], true, 0);
  const none = new Set<number>();
  assert.deepEqual(m.plan(none, none, false, TIMES.timeoutMs), []);
  // "z" dies: its partitions are nobody's, and "a" takes them fresh.
  const deadAt = TIMES.timeoutMs + 1;
  assert.deepEqual(m.expire(deadAt), { dead: ["z"], left: [] }, "it held partitions: dead");
  assert.deepEqual(fresh(m.plan(none, none, false, deadAt)), range(4));
});

test("with standbys, a dead peer's partitions wait the adoption time before being taken fresh", () => {
  const none = new Set<number>();
  for (const adoptionMs of [1_000, 0]) {
    const m = new Members("a", 4, { ...TIMES, adoptionMs }, 0);
    m.heard("z", [0, 1, 2, 3], false, 0);
    const deadAt = TIMES.timeoutMs + 1;
    assert.deepEqual(m.expire(deadAt).dead, ["z"]);
    assert.deepEqual(fresh(m.plan(none, none, false, deadAt)), adoptionMs > 0 ? [] : range(4), `${adoptionMs} ms`);
    m.expire(deadAt + adoptionMs);
    assert.deepEqual(fresh(m.plan(none, none, false, deadAt + adoptionMs)), range(4));
  }
});

test("with standbys, a newcomer among peers waits out a member timeout before taking fresh", () => {
  const none = new Set<number>();
  const adoptionMs = 1_000;
  const m = new Members("a", 4, { ...TIMES, adoptionMs }, 0);
  m.heard("b", [], false, 0);
  const owned = range(4).filter((p) => m.owner(p, false) === "a");
  assert.ok(owned.length > 0);
  const ready = TIMES.listenMs + TIMES.timeoutMs + adoptionMs;
  m.heard("b", [], false, ready - 1);
  assert.deepEqual(fresh(m.plan(none, none, false, ready - 1)), [], "too early");
  assert.deepEqual(fresh(m.plan(none, none, false, ready)), owned);
  const alone = new Members("a", 4, { ...TIMES, adoptionMs }, 0);
  assert.deepEqual(fresh(alone.plan(none, none, false, TIMES.listenMs)), range(4));
});

test("a peer silent after leaving with nothing held left, and is not counted dead", () => {
  const m = new Members("a", 4, TIMES, 0);
  m.heard("drained", [1], true, 0);
  m.heard("drained", [], true, 0); // its last word
  m.heard("crashed", [], false, 0);
  m.heard("crashed-leaving", [2], true, 0);
  assert.deepEqual(m.expire(TIMES.timeoutMs), { dead: [], left: [] }, "heard within the timeout");
  assert.ok(m.lives("drained"), "a member until the timeout, as any other");
  assert.ok(!range(4).some((p) => m.owner(p, false) === "drained"), "owning nothing: it is leaving");
  const gone = m.expire(TIMES.timeoutMs + 1);
  assert.deepEqual({ dead: [...gone.dead].sort(), left: gone.left }, {
    dead: ["crashed", "crashed-leaving"],
    left: ["drained"],
  });
  assert.equal(m.heard("drained", [], false, TIMES.timeoutMs), true, "heard again after: a newcomer");
});

test("conflicts are seen, and a worker's own heartbeat is ignored", () => {
  const m = new Members("a", 4, TIMES, 0);
  assert.equal(m.heard("b", [1, 2], false, 0), true);
  assert.equal(m.heard("b", [1, 2], false, 1), false, "not new the second time");
  assert.equal(m.heard("a", [0, 1, 2, 3], false, 0), false);
  assert.deepEqual(m.conflicts([0, 2]), [2]);
  assert.deepEqual(m.peers, ["b"]);
});

test("a partition's successor is its owner among the settled others; the first expiry is the oldest peer's", () => {
  const m = new Members("me", 16, TIMES, 0);
  assert.equal(m.successor(0, "me", false, 0), undefined, "alone: no standby");
  assert.equal(m.nextExpiry(), undefined, "no peer, nothing expires");
  m.heard("p1", [], false, 100);
  m.heard("p2", [], false, 200);
  m.heard("gone", [], true, 300);
  // Heard for two heartbeats (the listening time): settled, each may stand by.
  const settled = 200 + TIMES.listenMs;
  const p1 = range(16).find((p) => m.owner(p, false) === "me" && m.successor(p, "me", false, settled) === "p1");
  if (p1 !== undefined) assert.equal(m.successor(p1, "me", false, 100), undefined, "p1 too new, p2 newer still");
  for (const partition of range(16)) {
    const owner = m.owner(partition, false) ?? "";
    const successor = m.successor(partition, owner, false, settled);
    // The owner once `owner` is gone: the best of the others, never a leaving one.
    const others = ["me", "p1", "p2"].filter((id) => id !== owner);
    const best = others.reduce((a, b) => (score(a, partition) >= score(b, partition) ? a : b));
    assert.equal(successor, best, `partition ${partition}`);
    assert.notEqual(m.successor(partition, owner, true, settled), "me", "a leaving worker stands by for nothing");
  }
  assert.equal(m.nextExpiry(), 100 + TIMES.timeoutMs + 1);
  m.heard("p1", [], false, 400);
  assert.equal(m.nextExpiry(), 200 + TIMES.timeoutMs + 1);
  assert.deepEqual(m.expire(200 + TIMES.timeoutMs + 1).dead, ["p2"], "forgotten the moment its time is up");
});
