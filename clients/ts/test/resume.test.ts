/**
 * Resuming a session after its link drops (docs/protocol.md, "Resume"), against a fake
 * gate that resumes as the protocol says (test/resuming-gate.ts): pushes cut mid-stream
 * arrive once each, in order; requests in flight are sent again with their ids and
 * answered once; a refused resume is a new session; acks go every 64 frames and with
 * every heartbeat; a kick, or `resume: false`, means no resume.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { ACK_EVERY, bodyText, Client, ShaddockError, Status, type Body, type Encoding, type StateEvent } from "../src/index.js";
import { closeAll, collect, recorded, rejection, waitForCount, type TestOptions } from "./helpers.js";
import { resumingGate, type Received, type ResumingGate, type Sent } from "./resuming-gate.js";
import { waitFor, within } from "./wait.js";

const gates: ResumingGate[] = [];
async function fake(options?: { heartbeatMs?: number }): Promise<ResumingGate> {
  const gate = await resumingGate(options);
  gates.push(gate);
  return gate;
}
after(async () => {
  closeAll();
  await Promise.all(gates.map((g) => g.close()));
});

/** Reconnects at once: these tests wait on the resume, not on the back-off. */
const FAST: TestOptions["reconnect"] = { initialDelayMs: 1, maxDelayMs: 20 };

async function opened(gate: ResumingGate, options: Partial<TestOptions> = {}) {
  const { client, events } = recorded({ servers: gate.url, reconnect: FAST, ...options });
  client.connect();
  await within("open", client.ready());
  return { client, events };
}

function sent<K extends Sent["kind"]>(gate: ResumingGate, kind: K): (Received & { packet: Extract<Sent, { kind: K }> })[] {
  return gate.received.filter((r): r is Received & { packet: Extract<Sent, { kind: K }> } => r.packet.kind === kind);
}

const requests = (gate: ResumingGate, body: string) => sent(gate, "request").filter((r) => r.packet.body === body);
const opens = (events: StateEvent[]) => events.filter((e) => e.state === "open");
const counting = (n: number) => Array.from({ length: n }, (_, i) => String(i + 1));

/** Everything the gate wrote before an answer to this has arrived too (one link, in order). */
async function roundTrip(client: Client): Promise<void> {
  assert.equal(bodyText(await within("a round trip", client.request("echo.raw", "sync"))), "sync");
}

for (const encoding of ["protobuf", "json"] as Encoding[]) {
  test(`a link cut mid push-stream resumes: every push once, in order (${encoding})`, async () => {
    const gate = await fake();
    const { client, events } = await opened(gate, { encoding });
    assert.equal(client.resumable, true);
    const pushes = collect<Body>((listener) => client.on("count", listener));
    let handledAtDrop = -1;
    client.onState((e) => {
      if (e.state === "reconnecting") handledAtDrop = pushes.length;
    });
    // 300 pushes; the link is cut after the 150th, the last 20 before it lost in flight;
    // the other 150 are sent while the session is detached.
    gate.push("count", 300, { cutAfter: 150, lose: 20 });
    await waitForCount("pushes", pushes, 300);
    await roundTrip(client);
    assert.deepEqual(pushes.map(bodyText), counting(300));

    assert.equal(client.resumes, 1);
    assert.deepEqual(events.map((e) => e.state), ["connecting", "open", "reconnecting", "open"]);
    const [first, again] = opens(events);
    assert.equal(first?.resumed, false);
    assert.equal(first?.resumeCode, undefined);
    assert.equal(again?.resumed, true);
    assert.equal(again?.resumeCode, Status.OK);
    assert.deepEqual(gate.acks, [[1, 0], [1, 200]]);
    // The resume named the first session's token and the last push handled; the gate's
    // replay started at its last ack (128, below that), and the client dropped the repeats.
    const hellos = sent(gate, "handshake").map((r) => r.packet);
    assert.deepEqual(hellos[0], { kind: "handshake", resumable: true, resumeToken: "", lastSeq: 0 });
    assert.ok(handledAtDrop >= ACK_EVERY * 2 && handledAtDrop <= 130, `handled ${handledAtDrop} before the drop`);
    assert.deepEqual(hellos[1], { kind: "handshake", resumable: true, resumeToken: "token-1-1", lastSeq: handledAtDrop });
  });
}

test("requests in flight when the link drops are sent again with their ids and answered once", async () => {
  const gate = await fake();
  const { client, events } = await opened(gate, { encoding: "protobuf" });
  const a = client.request("hold.me", "a", { key: "ka" });
  const b = client.request("hold.me", "b");
  await waitFor("the gate to hold both", () => requests(gate, "b").length === 1 && requests(gate, "a").length === 1);
  gate.cut();
  // While the session is detached: a is answered (the gate keeps the answer), b is not.
  gate.release("a");
  const c = client.request("echo.raw", "c");
  assert.equal(bodyText(await within("a, from the replay", a)), "a");
  await waitFor("b sent again", () => requests(gate, "b").length === 2);
  gate.release("b");
  assert.equal(bodyText(await within("b, answered after the resume", b)), "b");
  assert.equal(bodyText(await within("c", c)), "c");
  await roundTrip(client);

  assert.equal(client.resumes, 1);
  assert.equal(opens(events)[1]?.resumed, true);
  // The same id, route, body and key, on the new link.
  for (const body of ["a", "b"]) {
    const [before, resent] = requests(gate, body);
    assert.ok(before !== undefined && resent !== undefined, `${body} sent twice`);
    assert.notEqual(before.link, resent.link);
    assert.equal(resent.session, before.session);
    assert.deepEqual(resent.packet, before.packet);
  }
  assert.equal(requests(gate, "a")[0]?.packet.key, "ka");
  // Ids stay unique across the resumed session: c and the round trip got new ones.
  const ids = new Map(sent(gate, "request").map((r) => [r.packet.body + r.packet.id, r.packet.id]));
  assert.equal(new Set(ids.values()).size, ids.size, JSON.stringify([...ids]));
});

test("a refused resume is a new session: requests in flight fail with 503, the code shows", async () => {
  const gate = await fake();
  const { client, events } = await opened(gate, { encoding: "json" });
  const held = client.request("hold.me", "lost");
  await waitFor("the gate to hold it", () => requests(gate, "lost").length === 1);
  // In one go: the client cannot redial in between.
  gate.cut();
  gate.refuseResumes(Status.NOT_FOUND);
  const error = await within("the failure", rejection(held));
  assert.ok(error instanceof ShaddockError, String(error));
  assert.equal(error.code, Status.UNAVAILABLE);
  assert.equal(error.local, true);
  assert.match(error.reason, /^connection lost: the gate closed the connection \(code 1006\) \(not resumed: 404\)$/);

  const again = opens(events)[1];
  assert.equal(again?.resumed, false);
  assert.equal(again?.resumeCode, Status.NOT_FOUND);
  assert.equal(client.resumes, 0);
  assert.equal(sent(gate, "handshake")[1]?.packet.resumeToken, "token-1-1");
  // Never sent again: its answer would have been the old session's.
  assert.equal(requests(gate, "lost").length, 1);
  // The new session is resumable in turn, and serves.
  assert.equal(client.resumable, true);
  await roundTrip(client);
});

test(`the client acknowledges every ${ACK_EVERY} frames handled`, async () => {
  const gate = await fake();
  const { client } = await opened(gate);
  const pushes = collect<Body>((listener) => client.on("count", listener));
  gate.push("count", 200);
  await waitForCount("pushes", pushes, 200);
  await waitFor("three acks", () => sent(gate, "ack").length >= 3);
  // The round trip's answer is frame 201: no ack due for it.
  await roundTrip(client);
  assert.deepEqual(sent(gate, "ack").map((r) => r.packet.seq), [64, 128, 192]);
});

test("a heartbeat goes once an interval, the first a whole interval after the handshake", async () => {
  const heartbeatMs = 300;
  const gate = await fake({ heartbeatMs });
  const start = Date.now();
  await opened(gate);
  await waitFor("a heartbeat", () => sent(gate, "heartbeat").length > 0);
  // Timers may round a millisecond early; half an interval (the old rate) is far off.
  assert.ok(Date.now() - start >= heartbeatMs - 5, `first heartbeat after ${Date.now() - start} ms`);
  const counted = Date.now();
  await waitFor("four more intervals", () => Date.now() - counted >= 4 * heartbeatMs);
  // Late timers only beat less often: at most one beat an interval, plus the first.
  assert.ok(sent(gate, "heartbeat").length <= 6, `${sent(gate, "heartbeat").length} heartbeats`);
});

test("every heartbeat carries an ack of what was handled", async () => {
  // The client beats every 200 ms (the gate's interval).
  const gate = await fake({ heartbeatMs: 200 });
  const { client } = await opened(gate);
  const pushes = collect<Body>((listener) => client.on("count", listener));
  gate.push("count", 10);
  await waitForCount("pushes", pushes, 10);
  const heartbeatAcks = () =>
    gate.received.filter((r, i) => r.packet.kind === "ack" && gate.received[i - 1]?.packet.kind === "heartbeat");
  await waitFor("two heartbeats after the pushes", () => heartbeatAcks().filter((r) => r.packet.kind === "ack" && r.packet.seq === 10).length >= 2);
  // Each heartbeat is followed by its ack.
  gate.received.forEach((r, i) => {
    if (r.packet.kind === "heartbeat") assert.equal(gate.received[i + 1]?.packet.kind ?? "ack", "ack", `after packet ${i}`);
  });
  // Fewer than 64 frames: no other ack.
  assert.equal(sent(gate, "ack").length, heartbeatAcks().length);
});

test("a link gone silent is dropped without a close frame, and resumed", async () => {
  const gate = await fake({ heartbeatMs: 200 });
  const { client, events } = await opened(gate);
  const pushes = collect<Body>((listener) => client.on("count", listener));
  gate.push("count", 5);
  await waitForCount("pushes", pushes, 5);
  // Nothing reaches the client any more, heartbeat answers included; these 5 wait.
  gate.mute();
  gate.push("count", 5);
  await waitForCount("pushes", pushes, 10);
  await roundTrip(client);
  assert.deepEqual(pushes.map(bodyText), [...counting(5), ...counting(5)]);
  assert.match(events.find((e) => e.state === "reconnecting")?.reason ?? "", /^no frame from the gate in 400 ms$/);
  assert.equal(opens(events)[1]?.resumed, true);
  // A close frame (1000) would have ended the session at the gate.
  assert.deepEqual(gate.closes, [[1, 1006]]);
});

test("after a kick the client reconnects to a new session, asking no resume", async () => {
  const gate = await fake();
  const { client, events } = await opened(gate);
  gate.kick("gate shutting down", 1001);
  await waitFor("open again", () => opens(events).length === 2);
  const [, hello] = sent(gate, "handshake");
  assert.deepEqual(hello?.packet, { kind: "handshake", resumable: true, resumeToken: "", lastSeq: 0 });
  assert.equal(opens(events)[1]?.resumed, false);
  assert.equal(opens(events)[1]?.resumeCode, undefined);
  assert.equal(client.resumes, 0);
});

test("with resume: false the client asks none, and a dropped link fails what was in flight", async () => {
  const gate = await fake();
  const { client, events } = await opened(gate, { resume: false });
  assert.equal(client.resumable, false);
  const held = client.request("hold.me", "gone");
  await waitFor("the gate to hold it", () => requests(gate, "gone").length === 1);
  gate.cut();
  const error = await within("the failure", rejection(held));
  assert.ok(error instanceof ShaddockError && error.code === Status.UNAVAILABLE, String(error));
  await waitFor("open again", () => opens(events).length === 2);
  assert.deepEqual(sent(gate, "handshake").map((r) => r.packet.resumable), [false, false]);
  assert.equal(sent(gate, "handshake")[1]?.packet.resumeToken, "");
  assert.equal(opens(events)[1]?.resumed, false);
  assert.deepEqual(sent(gate, "ack"), []);
});

test("resume follows reconnect: off without it, and a TypeError when asked for without it", async () => {
  const gate = await fake();
  const { client } = await opened(gate, { reconnect: false });
  assert.equal(sent(gate, "handshake")[0]?.packet.resumable, false);
  assert.equal(client.resumable, false);
  assert.throws(() => new Client({ servers: gate.url, reconnect: false, resume: true }), TypeError);
});
