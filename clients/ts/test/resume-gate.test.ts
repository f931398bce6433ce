/**
 * Resume against a real gate, in both encodings: a client reaches the gate through a
 * TCP proxy of the test's own (test/tcp-proxy.ts), which resets its link on both sides
 * while another client, straight to the gate, says lines in its room. The client
 * resumes: every line once, in order, still in the room. test/resume.test.ts pins the
 * client's rules against a fake; this pins that the SDK and the gate agree on the wire.
 *
 * This needs the gate's side of resume: against a gate without it the tests fail and
 * say so.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bodyText, chat, type Chat, type chatTypes, type Client, type Encoding } from "../src/index.js";
import { startGate, type Gate } from "./gate.js";
import { closeAll, collect, open, waitForCount } from "./helpers.js";
import { tcpProxy, type TcpProxy } from "./tcp-proxy.js";
import { waitFor, within } from "./wait.js";

let gate: Gate;
let proxy: TcpProxy;
before(async () => {
  gate = await startGate();
  proxy = await tcpProxy(gate.port);
});
after(async () => {
  closeAll();
  await proxy.close();
  await gate.stop();
});

interface Room {
  room: string;
  client: Client;
  /** The client's chat, behind the proxy. */
  mine: Chat;
  /** The other player's, straight to the gate. */
  theirs: Chat;
  /** The room's lines as the client heard them. */
  heard: chatTypes.ChatMessage[];
  heardBySender: chatTypes.ChatMessage[];
}

/** A client behind the proxy and another straight to the gate, both logged in and in one room. */
async function twoInARoom(name: string, encoding: Encoding): Promise<Room> {
  const room = `den-${name}`;
  const client = await open({
    servers: `ws://127.0.0.1:${proxy.port}/`,
    encoding,
    serial: true,
    reconnect: { initialDelayMs: 1, maxDelayMs: 50 },
  });
  if (!client.resumable) {
    throw new Error(`the gate at ${gate.url} gives no resume token: this shaddock binary has no resume (#29) on its side`);
  }
  const sender = await open({ servers: gate.url, encoding, serial: true });
  const mine = chat(client);
  const theirs = chat(sender);
  const heard = collect<chatTypes.ChatMessage>((listener) => mine.onMessage(listener));
  const heardBySender = collect<chatTypes.ChatMessage>((listener) => theirs.onMessage(listener));
  await mine.login(`r-${name}`);
  await mine.join(room);
  await theirs.login(`s-${name}`);
  await theirs.join(room);
  return { room, client, mine, theirs, heard, heardBySender };
}

for (const encoding of ["protobuf", "json"] as Encoding[]) {
  test(`a link cut mid-conversation resumes on the real gate: every line once, in order (${encoding})`, async () => {
    const { room, client, mine, theirs, heard } = await twoInARoom(`lines-${encoding}`, encoding);
    const said: string[] = [];
    const say = async (text: string) => {
      await theirs.say(room, text);
      said.push(text);
    };
    for (let i = 1; i <= 5; i++) await say(`line ${i}`);
    await waitForCount("lines", heard, 5);

    proxy.cut();
    await waitFor("the client to dial again", () => proxy.holding > 0);
    for (let i = 6; i <= 15; i++) await say(`line ${i}`);
    proxy.release();
    await waitFor("the resume", () => client.resumes === 1 && client.state === "open");
    for (let i = 16; i <= 20; i++) await say(`line ${i}`);
    await waitFor("line 20", () => heard.at(-1)?.text === "line 20");
    // A repeat could only come before the lines said after the resume: none did.
    assert.deepEqual(heard.map((m) => m.text), said);
    // Still in the room, by the same session: no join was needed.
    assert.deepEqual((await mine.members(room)).sort(), [`r-lines-${encoding}`, `s-lines-${encoding}`]);
  });
}

test("requests in flight across the cut are sent again and each answered, on the real gate", async () => {
  const client = await open({ servers: `ws://127.0.0.1:${proxy.port}/`, reconnect: { initialDelayMs: 1, maxDelayMs: 50 } });
  assert.ok(client.resumable, "the gate gives a resume token");
  // Out at once, the link cut behind them in the same tick: the proxy resets its side
  // before reading them, so they never reach the gate, and each is forwarded as new
  // when sent again with its id after the resume.
  const bodies = Array.from({ length: 50 }, (_, i) => `echo ${i}`);
  const answers = bodies.map((body) => client.request("echo.raw", body));
  proxy.cut();
  await waitFor("the client to dial again", () => proxy.holding > 0);
  proxy.release();
  assert.deepEqual((await within("the answers", Promise.all(answers))).map(bodyText), bodies);
  assert.equal(client.resumes, 1);
});

// The chat service keys room membership by the session's (gate, sid): a resumed
// session keeps the identity it started with, so it is still a member.
test("a say caught in the cut is applied once, and the resumed session says on", async () => {
  const { room, client, mine, heard, heardBySender } = await twoInARoom("own", "protobuf");
  // The say goes out and the link goes at once: the gate may have had it or not,
  // answered it or not. Either way it is applied once and answered once.
  const own = mine.say(room, "while cut");
  proxy.cut();
  await waitFor("the client to dial again", () => proxy.holding > 0);
  proxy.release();
  await within("the say caught in the cut", own);
  assert.equal(client.resumes, 1);
  await within("a say after the resume", mine.say(room, "after"));
  await waitFor("both lines at the other end", () => heardBySender.at(-1)?.text === "after");
  assert.deepEqual(heardBySender.map((m) => m.text), ["while cut", "after"]);
  assert.deepEqual(heard.map((m) => m.text), ["while cut", "after"]);
});
