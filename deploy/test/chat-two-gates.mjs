// Two players, one on each gate, chat in one room through the fleet: each sees the
// other join and both lines, in order. Usage: node chat-two-gates.mjs GATE1_URL GATE2_URL
import assert from "node:assert/strict";
import { chat, connect, waitFor } from "./sdk.mjs";

const [url1, url2] = process.argv.slice(2);
if (!url1 || !url2) {
  console.error("usage: node chat-two-gates.mjs GATE1_URL GATE2_URL");
  process.exit(2);
}
const tag = `${process.pid}-${Date.now() % 100000}`;
const room = `fleet-${tag}`;
const names = [`ann-${tag}`, `bob-${tag}`];
// Serial sessions: each sender's lines reach the room in send order (docs/chat.md).
const clients = [await connect(url1, { serial: true }), await connect(url2, { serial: true })];
try {
  const players = clients.map((c) => chat(c));
  const seen = players.map((p) => {
    const lines = [];
    p.onMessage((m) => lines.push(`${m.from}: ${m.text}`));
    return lines;
  });
  const joinedSeenByAnn = [];
  players[0].onJoined((e) => joinedSeenByAnn.push(e.name));

  for (const [i, p] of players.entries()) assert.equal(await p.login(names[i]), names[i]);
  assert.deepEqual((await players[0].join(room)).members, [names[0]]);
  assert.deepEqual([...(await players[1].join(room)).members].sort(), [...names].sort());
  await waitFor(`${names[0]} (gate 1) told ${names[1]} (gate 2) joined`, () => joinedSeenByAnn.includes(names[1]));

  const lines = ["hello from gate 1", "and again"];
  for (const line of lines) await players[0].say(room, line);
  await players[1].say(room, "hello from gate 2");
  const expected = [...lines.map((l) => `${names[0]}: ${l}`), `${names[1]}: hello from gate 2`];
  for (const [i, lines] of seen.entries()) {
    await waitFor(`${names[i]} sees 3 lines`, () => lines.length >= expected.length);
    assert.deepEqual(lines, expected, `lines seen by ${names[i]}`);
  }
  const members = await players[0].members(room);
  assert.deepEqual([...members].sort(), [...names].sort());
  console.log(`ok    chat across gates: ${names[0]} on ${url1} and ${names[1]} on ${url2} in room ${room}, both saw ${expected.length} lines in order`);
} finally {
  for (const c of clients) c.close();
}
