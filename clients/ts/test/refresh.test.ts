/**
 * Token refresh: the client sends Refresh, the gate answers RefreshAck. A fake gate
 * plays the gate's side (accepts "good-*" tokens, refuses others with 401), in both
 * encodings, so the test does not depend on a gate configured for signed tokens.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ShaddockError, Status, type Encoding } from "../src/index.js";
import { PacketSchema } from "../src/gen/client_pb.js";
import { fakeGate, type FakeGate } from "./fake-gate.js";
import { closeAll, recorded, rejection } from "./helpers.js";
import { within } from "./wait.js";

const fakes: FakeGate[] = [];
after(async () => {
  closeAll();
  await Promise.all(fakes.map((f) => f.close()));
});

/** A fake gate answering refreshes; `tokens` records the tokens it was sent. */
async function refreshingGate(tokens: string[]): Promise<FakeGate> {
  const fake = await fakeGate((socket, json) => {
    socket.on("message", (data: Buffer, isBinary: boolean) => {
      const token = isBinary ? refreshTokenOf(data) : (JSON.parse(data.toString()) as { refresh?: { token: string } }).refresh?.token;
      if (token === undefined) return;
      tokens.push(token);
      const code = token.startsWith("good-") ? 200 : 401;
      const message = code === 200 ? "" : "token refused: bad signature";
      socket.send(json
        ? JSON.stringify({ refresh_ack: { code, message } })
        : toBinary(PacketSchema, create(PacketSchema, { kind: { case: "refreshAck", value: { code, message } } })));
    });
  });
  fakes.push(fake);
  return fake;
}

function refreshTokenOf(data: Buffer): string | undefined {
  const packet = fromBinary(PacketSchema, data);
  return packet.kind.case === "refresh" ? packet.kind.value.token : undefined;
}

for (const encoding of ["protobuf", "json"] as Encoding[]) {
  test(`a refresh is accepted or refused with the gate's code (${encoding})`, async () => {
    const tokens: string[] = [];
    const fake = await refreshingGate(tokens);
    const { client } = recorded({ servers: fake.url, encoding, reconnect: false });
    client.connect();
    await within("open", client.ready());
    await within("accepted", client.refresh("good-2"));
    const error = await within("refused", rejection(client.refresh("forged")));
    assert.ok(error instanceof ShaddockError);
    assert.equal(error.code, Status.UNAUTHORIZED);
    assert.equal(error.reason, "token refused: bad signature");
    assert.equal(error.local, false);
    // Acks are matched in order: two at once each get their own.
    const both = await within("both", Promise.allSettled([client.refresh("good-3"), client.refresh("bad-4")]));
    assert.deepEqual(both.map((r) => r.status), ["fulfilled", "rejected"]);
    assert.deepEqual(tokens, ["good-2", "forged", "good-3", "bad-4"]);
    assert.equal(client.state, "open");
  });
}

test("an ack for no refresh is bad input and closes with a reason", async () => {
  const fake = await fakeGate((socket) =>
    socket.send(toBinary(PacketSchema, create(PacketSchema, { kind: { case: "refreshAck", value: { code: 200 } } }))),
  );
  fakes.push(fake);
  const { client } = recorded({ servers: fake.url, reconnect: false });
  client.connect();
  assert.equal(await within("closed", client.closed()), "bad frame from the gate: a refresh ack for no refresh");
});
