/**
 * The chat service through the typed API, two or three clients on one real gate, in
 * both encodings. JSON sessions need the gate's typed JSON bodies; their tests are
 * skipped only when a run-time probe finds the gate without it.
 */
import assert from "node:assert/strict";
import { describe, test, type TestContext } from "node:test";
import { chat, ShaddockError, Status, type Chat, type Encoding } from "../src/index.js";
import type { ChatMessage, MemberEvent } from "../src/gen/chat_pb.js";
import { gateForTests, collect, open, rejection, typedJsonUnsupported, waitForCount } from "./helpers.js";
import { waitFor } from "./wait.js";

const gate = gateForTests();

/** Names unique to each test, so tests on one gate never share players or rooms. */
let serial = 0;
function unique(prefix: string): string {
  serial += 1;
  return `${prefix}${serial}-${process.pid}`;
}

async function player(encoding: Encoding, name: string): Promise<Chat> {
  const client = await open({ servers: gate.url, encoding, serial: true });
  const c = chat(client);
  assert.equal(await c.login(name), name);
  return c;
}

/** Skips a JSON-mode test when the gate answers typed JSON as undecodable; true when skipped. */
async function skipWithoutTypedJson(t: TestContext, encoding: Encoding): Promise<boolean> {
  if (encoding !== "json") return false;
  const unsupported = await typedJsonUnsupported(gate.url);
  if (unsupported) t.skip(unsupported);
  return unsupported !== false;
}

const text = (m: ChatMessage) => `${m.from}: ${m.text}`;

for (const encoding of ["protobuf", "json"] as const) {
  describe(`chat over ${encoding}`, () => {
    test("two players in one room see each other's lines, each sender's in order", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const room = unique("room");
      const [ann, bob] = [unique("ann"), unique("bob")];
      const a = await player(encoding, ann);
      const b = await player(encoding, bob);
      const seenByA = collect<ChatMessage>((f) => a.onMessage(f));
      const seenByB = collect<ChatMessage>((f) => b.onMessage(f));
      const joinedSeenByA = collect<MemberEvent>((f) => a.onJoined(f));

      const first = await a.join(room);
      assert.equal(first.room, room);
      assert.deepEqual(first.members, [ann]);
      const second = await b.join(room);
      assert.deepEqual([...second.members].sort(), [ann, bob].sort());
      await waitFor(`${ann} told ${bob} joined`, () => joinedSeenByA.some((e) => e.name === bob && e.room === room));

      // Pipelined: the serial session keeps them in send order at every member.
      const lines = Array.from({ length: 10 }, (_, i) => `line ${i}`);
      await Promise.all([...lines.map((l) => a.say(room, l)), b.say(room, "hello from bob")]);

      for (const [who, seen] of [[ann, seenByA], [bob, seenByB]] as const) {
        await waitForCount(`messages at ${who}`, seen, lines.length + 1);
        assert.ok(seen.every((m) => m.room === room));
        assert.deepEqual(seen.filter((m) => m.from === ann).map((m) => m.text), lines, `order at ${who}`);
        assert.deepEqual(seen.filter((m) => m.from === bob).map(text), [`${bob}: hello from bob`]);
      }
    });

    test("a sender gets its own line before the answer to its say", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const room = unique("room");
      const a = await player(encoding, unique("ann"));
      const seen = collect<ChatMessage>((f) => a.onMessage(f));
      await a.join(room);
      await a.say(room, "me first");
      assert.deepEqual(seen.map((m) => m.text), ["me first"]);
    });

    test("a whisper reaches only the player named", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const [ann, bob, cid] = [unique("ann"), unique("bob"), unique("cid")];
      const a = await player(encoding, ann);
      const b = await player(encoding, bob);
      const c = await player(encoding, cid);
      const toBob = collect<ChatMessage>((f) => b.onWhisper(f));
      const toCid = collect<ChatMessage>((f) => c.onWhisper(f));
      await a.whisper(bob, "psst");
      await waitForCount("whispers to bob", toBob, 1);
      assert.equal(toBob[0]?.from, ann);
      assert.equal(toBob[0]?.text, "psst");
      assert.equal(toBob[0]?.room, "");
      // A line to cid after it: cid's only whisper is its own, so the first went to bob alone.
      await a.whisper(cid, "for cid");
      await waitForCount("whispers to cid", toCid, 1);
      assert.deepEqual(toCid.map((m) => m.text), ["for cid"]);
      assert.equal(toBob.length, 1);
    });

    test("members lists the room, sorted, and follows joins and leaves", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const room = unique("room");
      const names = [unique("zed"), unique("amy"), unique("max")];
      const players = await Promise.all(names.map((n) => player(encoding, n)));
      for (const p of players) await p.join(room);
      assert.deepEqual(await players[0]!.members(room), [...names].sort());
      const leftSeen = collect<MemberEvent>((f) => players[0]!.onLeft(f));
      await players[1]!.leave(room);
      await waitFor("the leave announced", () => leftSeen.some((e) => e.name === names[1] && e.reason === "left"));
      assert.deepEqual(await players[0]!.members(room), [names[0]!, names[2]!].sort());
      assert.deepEqual(await players[2]!.members(unique("empty")), []);
    });

    test("saying in a room one is not in is refused with 403", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const a = await player(encoding, unique("ann"));
      const error = await rejection(a.say(unique("room"), "hello?"));
      assert.ok(error instanceof ShaddockError);
      assert.equal(error.code, Status.FORBIDDEN);
      assert.equal(error.local, false);
    });

    test("a second login with the same name kicks the first, with its reason", async (t) => {
      if (await skipWithoutTypedJson(t, encoding)) return;
      const name = unique("ann");
      const first = await player(encoding, name);
      const kicks = collect<string>((f) => first.client.onKick(f));
      const room = unique("room");
      await first.join(room);
      const second = await player(encoding, name);
      await waitForCount("the kick", kicks, 1);
      assert.match(kicks[0]!, /logged in elsewhere/);
      // A kick for a taken name ends the client: no reconnect to take it back.
      assert.equal(await first.client.closed(), kicks[0]);
      assert.equal(first.client.state, "closed");
      assert.equal(second.client.state, "open");
      // The name now belongs to the second session.
      assert.ok((await second.join(room)).members.includes(name));
    });
  });
}
