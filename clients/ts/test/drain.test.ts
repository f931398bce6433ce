/**
 * A draining gate: the client moves to the next gate of its list and loses nothing.
 * The draining gate is a fake (test/draining-gate.ts) so these tests hold whatever the
 * real gate's drain does; the gate moved to is a real one where it can be.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bodyText, ShaddockError, Status, type Body, type Encoding } from "../src/index.js";
import { drainingGate, type DrainingGate } from "./draining-gate.js";
import { freePort, startGate, type Gate } from "./gate.js";
import { closeAll, collect, recorded, rejection, waitForCount } from "./helpers.js";
import { waitFor, within } from "./wait.js";

let real: Gate;
const fakes: DrainingGate[] = [];
async function fake(firstSession: number, holdEcho = false): Promise<DrainingGate> {
  const gate = await drainingGate({ firstSession, holdEcho });
  fakes.push(gate);
  return gate;
}
before(async () => {
  real = await startGate();
});
after(async () => {
  closeAll();
  await Promise.all([real.stop(), ...fakes.map((f) => f.close())]);
});

for (const encoding of ["protobuf", "json"] as Encoding[]) {
  test(`a drain moves the client to the next gate and loses nothing (${encoding})`, async () => {
    const a = await fake(1, true);
    const { client, events } = recorded({ servers: [a.url, real.url], encoding });
    client.connect();
    await within("open", client.ready());
    const notes = collect<Body>((listener) => client.on("gate.note", listener));
    // Both reach A before the drain: A holds `hold.me` as if forwarded, and refuses
    // `echo.raw` without forwarding it when it drains.
    const held = client.request("hold.me", "old");
    const refused = client.request("echo.raw", "again");
    await waitFor("A to hold both", () => a.events.includes("held 1 echo.raw"));
    assert.equal(bodyText(await client.request("drain.me", "going")), "going");
    // Sent again on the real gate, which echoes it.
    assert.equal(bodyText(await within("the refused request", refused)), "again");
    assert.ok(a.events.includes("refused 1 echo.raw"), a.events.join(", "));
    assert.equal(client.moves, 1);
    assert.equal(client.url, real.url);
    assert.equal(bodyText(await client.request("echo.raw", "on the real gate")), "on the real gate");
    // `hold.me` still waits on A, so A's connection is still open; its answer and its
    // push arrive there.
    assert.ok(!a.events.includes("closed 1"), a.events.join(", "));
    a.release();
    assert.equal(bodyText(await within("the held request", held)), "old");
    await waitForCount("pushes from A", notes, 1);
    await waitFor("the client to close A once nothing waits there", () => a.events.includes("closed 1"));
    assert.equal(client.state, "open");
    const opened = events.filter((e) => e.state === "open");
    assert.equal(opened.length, 2);
    assert.equal(opened[1]?.url, real.url);
    assert.equal(opened[1]?.reason, "moved: going");
  });
}

test("a retiring gate that closes fails what still waits on it; the client stays", async () => {
  const a = await fake(1);
  const b = await fake(100);
  const { client } = recorded({ servers: [a.url, b.url] });
  const kicks = collect<string>((listener) => client.onKick(listener));
  client.connect();
  await within("open", client.ready());
  const held = client.request("hold.me", "old");
  await waitFor("A to hold it", () => a.events.includes("held 1 hold.me"));
  await client.request("drain.me", "going");
  await waitFor("the move", () => client.moves === 1);
  a.kick("gate shutting down", 1001);
  const error = await within("the held request", rejection(held));
  assert.ok(error instanceof ShaddockError, String(error));
  assert.equal(error.code, Status.UNAVAILABLE);
  assert.equal(error.reason, "connection lost: gate shutting down");
  // The retiring gate's kick is not the client's: no kick event, still open on B.
  assert.deepEqual(kicks, []);
  assert.equal(client.state, "open");
  assert.equal(client.sessionId, 100n);
  assert.equal(bodyText(await client.request("echo.raw", "on b")), "on b");
});

test("with no other gate answering the client stays, then reconnects after the kick", async () => {
  const a = await fake(1);
  const dead = `ws://127.0.0.1:${await freePort()}/`;
  const { client } = recorded({ servers: [a.url, dead], reconnect: { initialDelayMs: 1, maxDelayMs: 20 } });
  client.connect();
  await within("open", client.ready());
  await client.request("drain.me", "going");
  const later = client.request("echo.raw", "later");
  await waitFor("A to refuse it", () => a.events.includes("refused 1 echo.raw"));
  // A plain close, not "going away": after a drain, the kick is still a drop to recover from.
  a.kick("gate shutting down", 1000);
  assert.equal(bodyText(await within("the refused request, on A's next session", later)), "later");
  assert.equal(client.moves, 0);
  assert.equal(client.sessionId, 2n);
});
