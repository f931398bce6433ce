/**
 * Bad input from a server never throws out of an event handler: the client drops the
 * connection and says why. A fake gate sends what a real one never would.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { chat, ShaddockError, Status, type Encoding } from "../src/index.js";
import { PacketSchema } from "../src/gen/client_pb.js";
import { fakeGate, type FakeGate, type Script } from "./fake-gate.js";
import { closeAll, recorded, rejection } from "./helpers.js";
import { within } from "./wait.js";

const fakes: FakeGate[] = [];
after(async () => {
  closeAll();
  await Promise.all(fakes.map((f) => f.close()));
});

/** Connects to a fake running `script` without reconnecting; resolves with the closed reason. */
async function closedReasonAgainst(encoding: Encoding, script: Script): Promise<string> {
  const fake = await fakeGate(script);
  fakes.push(fake);
  const { client } = recorded({ servers: fake.url, encoding, reconnect: false });
  const uncaught: unknown[] = [];
  const onUncaught = (error: unknown) => uncaught.push(error);
  process.on("uncaughtException", onUncaught);
  try {
    client.connect();
    const reason = await within("the client to close", client.closed());
    assert.deepEqual(uncaught, []);
    return reason;
  } finally {
    process.off("uncaughtException", onUncaught);
  }
}

const packet = (init: Parameters<typeof create<typeof PacketSchema>>[1]) =>
  toBinary(PacketSchema, create(PacketSchema, init));

test("an undecodable binary frame closes the connection with a reason", async () => {
  const reason = await closedReasonAgainst("protobuf", (s) => s.send(new Uint8Array([0xff, 0xff, 0xff, 0xff])));
  assert.match(reason, /^bad frame from the gate: invalid packet/);
});

test("an unknown packet kind closes the connection with a reason (protobuf)", async () => {
  // Field 99, length-delimited, empty: a kind this client does not know.
  const reason = await closedReasonAgainst("protobuf", (s) => s.send(new Uint8Array([0x9a, 0x06, 0x00])));
  assert.equal(reason, "bad frame from the gate: unknown packet kind");
});

test("a packet only a client sends closes the connection with a reason", async () => {
  const reason = await closedReasonAgainst("protobuf", (s) =>
    s.send(packet({ kind: { case: "request", value: { id: 1n, route: "x.y" } } })),
  );
  assert.equal(reason, "bad frame from the gate: packet not for a client: request");
});

test("a text frame on a protobuf session closes it with a reason", async () => {
  const reason = await closedReasonAgainst("protobuf", (s) => s.send("{}"));
  assert.equal(reason, "bad frame from the gate: a text frame on a protobuf session");
});

test("text that is not JSON closes a JSON session with a reason", async () => {
  const reason = await closedReasonAgainst("json", (s) => s.send("not json {"));
  assert.match(reason, /^bad frame from the gate: invalid packet: /);
});

test("an unknown packet kind closes a JSON session with a reason", async () => {
  const reason = await closedReasonAgainst("json", (s) => s.send(JSON.stringify({ teleport: {} })));
  assert.equal(reason, "bad frame from the gate: unknown packet kind: teleport");
});

test("a JSON field of the wrong type closes the session with a reason", async () => {
  const reason = await closedReasonAgainst("json", (s) => s.send(JSON.stringify({ response: { id: "one", code: 200 } })));
  assert.equal(reason, "bad frame from the gate: invalid packet: id is not an unsigned integer");
});

test("a typed push that is not its message closes the connection with a reason", async () => {
  const fake = await fakeGate((s) =>
    s.send(packet({ kind: { case: "push", value: { route: "chat.message", body: new Uint8Array([0xff, 0xff]) } } })),
  );
  fakes.push(fake);
  const { client } = recorded({ servers: fake.url, reconnect: false });
  const heard: unknown[] = [];
  chat(client).onMessage((m) => heard.push(m));
  client.connect();
  const reason = await within("the client to close", client.closed());
  assert.match(reason, /^bad chat\.message push from the gate: a body that is not a shaddock\.chat\.ChatMessage/);
  assert.deepEqual(heard, []);
});

test("with reconnect on, bad input is the reason the client gives for reconnecting", async () => {
  const fake = await fakeGate((s) => s.send(new Uint8Array([0xff])));
  fakes.push(fake);
  const { client, events } = recorded({
    servers: fake.url,
    reconnect: { initialDelayMs: 1, maxDelayMs: 2, maxAttempts: 2 },
  });
  client.connect();
  const reason = await within("the client to give up", client.closed());
  assert.match(reason, /^gave up after 2 attempts: bad frame from the gate/);
  assert.match(events.find((e) => e.state === "reconnecting")?.reason ?? "", /^bad frame from the gate/);
});

test("a request the server never answers times out locally with 408", async () => {
  const fake = await fakeGate(() => {});
  fakes.push(fake);
  const { client } = recorded({ servers: fake.url, reconnect: false });
  client.connect();
  await within("open", client.ready());
  const error = await rejection(client.request("echo.raw", "anyone?", { timeoutMs: 50 }));
  assert.ok(error instanceof ShaddockError);
  assert.equal(error.code, Status.TIMEOUT);
  assert.equal(error.local, true);
  assert.equal(client.state, "open");
});
