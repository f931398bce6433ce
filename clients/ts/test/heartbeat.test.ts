/**
 * The heartbeat against a gate with a short interval: a client keeps its session over
 * many intervals without sending anything else, and a socket that stays silent is
 * closed by the gate (so the first test could fail).
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { WebSocket } from "ws";
import { bodyText } from "../src/index.js";
import { startGate, type Gate } from "./gate.js";
import { closeAll, open } from "./helpers.js";
import { waitFor, within } from "./wait.js";

// Long enough that a late timer on a loaded machine is not a missed heartbeat: the
// client beats once an interval, and the gate closes after two.
const HEARTBEAT_MS = 250;
let gate: Gate;
before(async () => {
  gate = await startGate({ args: ["--heartbeat", `${HEARTBEAT_MS}ms`] });
});
after(async () => {
  closeAll();
  await gate?.stop();
});

test("an idle client keeps its session over ten heartbeat intervals", async () => {
  const client = await open({ servers: gate.url, reconnect: false });
  const session = client.sessionId;
  const start = Date.now();
  await waitFor("ten intervals with the session open", () => {
    assert.equal(client.state, "open", client.closedReason);
    return Date.now() - start > 10 * HEARTBEAT_MS;
  });
  assert.equal(client.sessionId, session);
  assert.equal(bodyText(await client.request("echo.raw", "still here")), "still here");
});

test("a socket that sends no heartbeat is closed by the gate", async () => {
  const socket = new WebSocket(gate.url);
  const closed = new Promise<string>((resolve) => socket.on("close", (_code, reason) => resolve(reason.toString())));
  socket.on("open", () => socket.send(JSON.stringify({ handshake: {} })));
  assert.equal(await within("the gate to close the silent socket", closed), "heartbeat missed");
});
