/**
 * Reconnection against real gates: to the next URL when a gate goes away, and to the
 * same port when the gate there restarts. Every wait is a condition with a deadline.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { bodyText, chat, ShaddockError, Status } from "../src/index.js";
import { freePort, startGate, type Gate } from "./gate.js";
import { closeAll, recorded, rejection } from "./helpers.js";
import { waitFor, within } from "./wait.js";

const gates: Gate[] = [];
async function gateOn(gatePort?: number): Promise<Gate> {
  const gate = await startGate(gatePort === undefined ? {} : { gatePort });
  gates.push(gate);
  return gate;
}
after(async () => {
  closeAll();
  await Promise.all(gates.map((g) => g.stop()));
});

test("when the first gate shuts down the client moves to the second URL", async () => {
  const first = await gateOn();
  const second = await gateOn();
  const { client, events } = recorded({ servers: [first.url, second.url], serial: true });
  client.connect();
  await within("open", client.ready());
  assert.equal(client.url, first.url);
  assert.equal(bodyText(await client.request("echo.raw", "on the first")), "on the first");

  // The gate drains: it tells the client to move (a Drain packet) before it closes
  // anything, and waits for the client to leave.
  await first.stop();
  await waitFor("open on the second gate", () => client.state === "open" && client.url === second.url);
  assert.notEqual(client.sessionId, undefined);
  assert.equal(bodyText(await client.request("echo.raw", "on the second")), "on the second");
  const moved = events.find((e) => e.state === "open" && e.url === second.url);
  assert.ok(moved, JSON.stringify(events, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
  assert.equal(moved.reason, "moved: gate shutting down");
  // A move, not a reconnect: no gap in between.
  assert.deepEqual(events.map((e) => e.state), ["connecting", "open", "open"]);
});

test("a gate that is down at start is skipped for the next URL", async () => {
  const live = await gateOn();
  const dead = `ws://127.0.0.1:${await freePort()}/`;
  const { client, events } = recorded({ servers: [dead, live.url] });
  client.connect();
  await within("open", client.ready());
  assert.equal(client.url, live.url);
  assert.deepEqual(events.map((e) => e.state), ["connecting", "connecting", "open"]);
  assert.match(events[1]?.reason ?? "", /could not connect/);
});

test("after the gate restarts on its port the client reconnects and can log in again", async () => {
  const port = await freePort();
  let gate = await gateOn(port);
  const { client, events } = recorded({ servers: gate.url, serial: true });
  client.connect();
  await within("open", client.ready());
  const c = chat(client);
  const name = `restart${process.pid}`;
  await c.login(name);

  await gate.stop();
  await waitFor("reconnecting", () => client.state === "reconnecting" || client.state === "connecting");
  // While the gate is down, a request waits for the connection rather than failing.
  const waiting = client.request("echo.raw", "sent while away", { timeoutMs: 30_000 });
  gate = await gateOn(port);
  await within("open again", client.ready(30_000), 30_000);
  assert.equal(bodyText(await waiting), "sent while away");
  // A new session: log in again.
  assert.equal(await c.login(name), name);
  assert.equal(events.at(-1)?.state, "open");
  assert.ok(events.some((e) => e.state === "reconnecting"));
});

test("requests in flight when the connection drops fail with 503", async () => {
  const gate = await gateOn();
  const { client } = recorded({ servers: gate.url, reconnect: false });
  client.connect();
  await within("open", client.ready());
  // Stopped (wholly: pause() waits for every thread), the gate cannot answer the request;
  // then SIGKILL: the socket drops with no kick and no answer.
  await gate.pause();
  const inFlight = client.request("echo.raw", "lost", { timeoutMs: 30_000 });
  gate.child.kill("SIGKILL");
  const error = await within("the failure", rejection(inFlight));
  assert.ok(error instanceof ShaddockError, String(error));
  assert.equal(error.code, Status.UNAVAILABLE);
  assert.equal(error.local, true);
  assert.equal(client.state, "closed");
  assert.match(client.closedReason ?? "", /closed/);
});

test("with a limit on attempts the client gives up and says why", async () => {
  const dead = `ws://127.0.0.1:${await freePort()}/`;
  const { client, events } = recorded({ servers: dead, reconnect: { initialDelayMs: 1, maxDelayMs: 5, maxAttempts: 3 } });
  client.connect();
  const reason = await within("giving up", client.closed());
  assert.match(reason, /^gave up after 3 attempts: could not connect/);
  assert.deepEqual(events.map((e) => e.state), ["connecting", "connecting", "connecting", "closed"]);
});
