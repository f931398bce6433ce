/**
 * A request's key (for a keyed service's route) on the wire, in both encodings: the
 * codecs put it in `Request.key` (protobuf field 4) or `"key"` (JSON, left out when
 * empty), and `request`, `call`, `notify` and the arena API send it. A fake gate
 * records what the client sends and answers each request with its key.
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { arena, bodyText, type Client, type Encoding } from "../src/index.js";
import { jsonCodec } from "../src/codec/json.js";
import { protobufCodec } from "../src/codec/protobuf.js";
import { JoinResponseSchema } from "../src/gen/arena_pb.js";
import { PacketSchema } from "../src/gen/client_pb.js";
import { fakeGate, type FakeGate } from "./fake-gate.js";
import { closeAll, recorded, waitForCount } from "./helpers.js";
import { within } from "./wait.js";

const fakes: FakeGate[] = [];
after(async () => {
  closeAll();
  await Promise.all(fakes.map((f) => f.close()));
});

describe("the codecs", () => {
  test("protobuf puts the key in Request.key, empty without one", () => {
    const keyed = protobufCodec.encode({ kind: "request", id: 7, route: "arena.join", body: "", key: "m1" });
    const plain = protobufCodec.encode({ kind: "request", id: 8, route: "echo.raw", body: "hi" });
    for (const [frame, id, key] of [[keyed, 7n, "m1"], [plain, 8n, ""]] as const) {
      assert.ok(frame instanceof Uint8Array);
      const packet = fromBinary(PacketSchema, frame);
      assert.ok(packet.kind.case === "request");
      assert.equal(packet.kind.value.id, id);
      assert.equal(packet.kind.value.key, key);
    }
  });

  test("JSON puts the key in \"key\", left out without one", () => {
    const keyed = jsonCodec.encode({ kind: "request", id: 7, route: "arena.join", body: { match: "m1" }, key: "m1" });
    assert.deepEqual(JSON.parse(keyed as string), {
      request: { id: 7, route: "arena.join", body: { match: "m1" }, key: "m1" },
    });
    for (const key of [undefined, ""]) {
      const plain = jsonCodec.encode({ kind: "request", id: 8, route: "echo.raw", body: "hi", ...(key !== undefined && { key }) });
      assert.deepEqual(JSON.parse(plain as string), { request: { id: 8, route: "echo.raw", body: "hi" } });
    }
  });
});

/** What the fake gate saw of one request. */
interface Seen {
  route: string;
  key: string;
  /** The key field was in the frame at all (JSON); always true for protobuf. */
  hasKey: boolean;
}

/** A fake gate that records each request and answers it with its key (as text), or an arena JoinResponse for arena.join. */
async function keyEchoingGate(seen: Seen[]): Promise<FakeGate> {
  const fake = await fakeGate((socket, json) => {
    socket.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        const packet = fromBinary(PacketSchema, data);
        if (packet.kind.case !== "request") return;
        const { id, route, key } = packet.kind.value;
        seen.push({ route, key, hasKey: true });
        if (id === 0n) return;
        const body = route === "arena.join"
          ? toBinary(JoinResponseSchema, create(JoinResponseSchema, { match: key, tick: 5n, x: -3n }))
          : new TextEncoder().encode(key);
        socket.send(toBinary(PacketSchema, create(PacketSchema, { kind: { case: "response", value: { id, code: 200, body } } })));
        return;
      }
      const request = (JSON.parse(data.toString()) as { request?: { id: number; route: string; key?: string } }).request;
      if (request === undefined) return;
      const key = request.key ?? "";
      seen.push({ route: request.route, key, hasKey: "key" in request });
      if (request.id === 0) return;
      // 64-bit integers are JSON strings; fields at 0 are left out.
      const body = request.route === "arena.join" ? { match: key, tick: "5", x: "-3" } : key;
      assert.ok(json);
      socket.send(JSON.stringify({ response: { id: request.id, code: 200, body } }));
    });
  });
  fakes.push(fake);
  return fake;
}

async function connected(encoding: Encoding, seen: Seen[]): Promise<Client> {
  const fake = await keyEchoingGate(seen);
  const { client } = recorded({ servers: fake.url, encoding, reconnect: false });
  client.connect();
  await within("open", client.ready());
  return client;
}

for (const encoding of ["protobuf", "json"] as const) {
  describe(`a request's key over ${encoding}`, () => {
    test("request, call and notify send the key given; none without one", async () => {
      const seen: Seen[] = [];
      const client = await connected(encoding, seen);
      assert.equal(bodyText(await within("keyed", client.request("tally.add", "", { key: "k-1" }))), "k-1");
      assert.equal(bodyText(await within("plain", client.request("echo.raw", "hi"))), "");
      // A timeout alongside the key changes nothing on the wire.
      assert.equal(bodyText(await within("with a timeout", client.request("tally.add", "", { key: "ünï", timeoutMs: 5_000 }))), "ünï");
      client.notify("tally.add", "", { key: "n-1" });
      client.notify("echo.raw", "");
      await waitForCount("requests at the gate", seen, 5);
      assert.deepEqual(seen.map((s) => [s.route, s.key]), [
        ["tally.add", "k-1"],
        ["echo.raw", ""],
        ["tally.add", "ünï"],
        ["tally.add", "n-1"],
        ["echo.raw", ""],
      ]);
      if (encoding === "json") assert.deepEqual(seen.map((s) => s.hasKey), [true, false, true, true, false]);
    });

    test("a request made before the connection opens keeps its key", async () => {
      const seen: Seen[] = [];
      const fake = await keyEchoingGate(seen);
      const { client } = recorded({ servers: fake.url, encoding, reconnect: false });
      const answer = client.request("tally.add", "", { key: "early" });
      client.connect();
      assert.equal(bodyText(await within("answer", answer)), "early");
      assert.deepEqual(seen.map((s) => s.key), ["early"]);
    });

    test("arena.join goes with its match as the key; input and leave with none", async () => {
      const seen: Seen[] = [];
      const client = await connected(encoding, seen);
      const api = arena(client);
      const joined = await within("join", api.join("m7"));
      assert.equal(joined.match, "m7");
      assert.equal(joined.tick, 5n);
      assert.equal(joined.x, -3n);
      assert.equal(joined.y, 0n);
      await within("input", api.input(1, 0));
      await within("leave", api.leave());
      assert.deepEqual(seen.map((s) => [s.route, s.key]), [
        ["arena.join", "m7"],
        ["arena.input", ""],
        ["arena.leave", ""],
      ]);
    });
  });
}
