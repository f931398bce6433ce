/**
 * The arena service (a keyed service) through the typed API, on one real gate, in both
 * encodings: a join goes with its match as the request's key, inputs route by the
 * session's match, and every player of the match gets its state pushes. JSON sessions
 * need the gate's typed JSON bodies; their tests are skipped only when a run-time probe
 * finds the gate without it.
 */
import assert from "node:assert/strict";
import { describe, test, type TestContext } from "node:test";
import { arena, arenaRoutes, chat, ShaddockError, Status, type Arena, type arenaTypes, type Encoding } from "../src/index.js";
import { gateForTests, collect, open, rejection, typedJsonUnsupported } from "./helpers.js";
import { waitFor } from "./wait.js";

const gate = gateForTests();

/** Names unique to each test, so tests on one gate never share players or matches. */
let serial = 0;
function unique(prefix: string): string {
  serial += 1;
  return `${prefix}${serial}-${process.pid}`;
}

/** A logged-in player's arena API (the arena needs a uid). */
async function player(encoding: Encoding, name: string): Promise<Arena> {
  const client = await open({ servers: gate.url, encoding, serial: true });
  assert.equal(await chat(client).login(name), name);
  return arena(client);
}

async function skipWithoutTypedJson(t: TestContext, encoding: Encoding): Promise<boolean> {
  if (encoding !== "json") return false;
  const unsupported = await typedJsonUnsupported(gate.url);
  if (unsupported) t.skip(unsupported);
  return unsupported !== false;
}

/** A state's players as "uid (x, y)", sorted. */
const positions = (state: arenaTypes.State | undefined) =>
  (state?.players ?? []).map((p) => `${p.uid} (${p.x}, ${p.y})`).sort();

for (const encoding of ["protobuf", "json"] as const) {
  describe(`arena over ${encoding}`, () => {
    test("two players join one match by its key; one moves, the other's pushes show it", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const match = unique("m");
      const [ann, bob] = [unique("ann"), unique("bob")];
      const a = await player(encoding, ann);
      const b = await player(encoding, bob);
      const seenByB = collect<arenaTypes.State>((f) => b.onState(f));

      const joined = await a.join(match);
      assert.equal(joined.match, match);
      assert.equal(joined.x, 0n);
      assert.equal(joined.y, 0n);
      await b.join(match);

      // Inputs need no key: the gate routes them by the session's match. Positions are int64.
      for (let i = 0; i < 3; i++) await a.input(1, 0);
      const moved = await a.input(0, -2);
      assert.deepEqual([moved.x, moved.y], [3n, -2n]);

      const want = [`${ann} (3, -2)`, `${bob} (0, 0)`].sort();
      await waitFor(`${bob} sees ${ann} at (3, -2)`, () => JSON.stringify(positions(seenByB.at(-1))) === JSON.stringify(want));
      assert.ok(seenByB.every((s) => s.match === match));
      const ticks = seenByB.map((s) => s.tick);
      assert.ok(ticks.every((tick, i) => i === 0 || tick > ticks[i - 1]!), `ticks rise: ${ticks.join(" ")}`);

      // After a leave, the others' pushes no longer list the player.
      await b.leave();
      const seenByA = collect<arenaTypes.State>((f) => a.onState(f));
      await waitFor(`${ann} sees ${bob} gone`, () => JSON.stringify(positions(seenByA.at(-1))) === JSON.stringify([`${ann} (3, -2)`]));
    });

    test("arena.join without its match as the key is refused with 400", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const a = await player(encoding, unique("ann"));
      const match = unique("m");
      for (const key of [undefined, unique("other")]) {
        const error = await rejection(a.client.call(arenaRoutes.join, { match }, key === undefined ? {} : { key }));
        assert.ok(error instanceof ShaddockError);
        assert.equal(error.code, Status.BAD_REQUEST);
        assert.match(error.reason, /key/);
        assert.equal(error.local, false);
      }
    });

    test("a session without a uid cannot join", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const client = await open({ servers: gate.url, encoding, serial: true });
      const error = await rejection(arena(client).join(unique("m")));
      assert.ok(error instanceof ShaddockError);
      assert.equal(error.code, Status.UNAUTHORIZED);
    });
  });
}
