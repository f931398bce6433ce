// Calls to keyed services (docs/workers.md, "Calling other services") on a real
// nats-server: a TypeScript caller learns from the announcements which services are
// keyed, and sends its calls to the partition of their key, where two TypeScript
// workers of the keyed service hold the partitions between them.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { NatsConnection } from "@nats-io/transport-node";
import { CallFailure, MAX_KEY_LEN, Service, Status, Worker, partitionOf } from "../src/index.js";
import type { Session } from "../src/gen/rpc_pb.js";
import {
  KeyedSchema,
  RpcRequestSchema,
  RpcResponseSchema,
  ServiceSchemaSchema,
  SessionSchema,
} from "../src/gen/rpc_pb.js";
import { DEADLINE_MS, startBus, until } from "./bus.js";
import type { Bus } from "./bus.js";

/** Enough partitions that each of two workers holds some, whatever their random ids. */
const PARTITIONS = 16;
const TIMES = { keyedHeartbeatMs: 50, keyedMemberTimeoutMs: 1_000, handoverTimeoutMs: 1_000 };

const text = new TextEncoder();
const utf8 = new TextDecoder();
let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** A keyed service answering which worker took the call, and by which key. */
function vault(name: string, taken: string[]): Service {
  return new Service("vault")
    .keyed({ partitions: PARTITIONS, sessionKey: "room" })
    .rawMethod("who", (ctx) => {
      taken.push(ctx.key ?? "");
      return `${name} ${ctx.key ?? ""}`;
    });
}

/**
 * The caller: `front.go` calls `vault.who` with the key its body names (none when
 * empty), and answers the result as `<code> <body or message>`.
 */
const front = new Service("front")
  .rawMethod("go", async (ctx, body) => {
    const key = utf8.decode(body);
    const result = await ctx.call("vault.who", "", key === "" ? {} : { key });
    return `${result.code} ${result.ok ? utf8.decode(result.body) : result.message}`;
  })
  .onEvent("go", "queue", async (ctx, payload) => {
    const key = utf8.decode(payload);
    const result = await ctx.call("vault.who", "", key === "" ? {} : { key });
    ctx.reply(`${result.code} ${result.ok ? utf8.decode(result.body) : result.message}`);
  });

/** `front.go` as a gate sends it, from `session` (none when undefined). */
async function go(nc: NatsConnection, prefix: string, key: string, session: Session | undefined): Promise<string> {
  const request = create(RpcRequestSchema, { route: "front.go", body: text.encode(key), session, timeoutMs: 5_000 });
  const reply = await nc.request(`${prefix}.svc.front.go`, toBinary(RpcRequestSchema, request), {
    timeout: DEADLINE_MS,
  });
  const response = fromBinary(RpcResponseSchema, reply.data);
  assert.equal(response.code, Status.OK, response.message);
  return utf8.decode(response.body);
}

test("a call to a keyed service reaches its key's partition: the caller's key, the session's, the uid", async () => {
  const prefix = "kc1";
  const taken: string[] = [];
  const [a, b] = await Promise.all(
    ["a", "b"].map(async (name) => Worker.start(await bus.connect(), vault(name, taken), { prefix, ...TIMES })),
  );
  const workers: Record<string, Worker> = { a: a as Worker, b: b as Worker };
  const held = (name: string): readonly number[] => workers[name]?.keyed?.held ?? [];
  await until("a and b hold every partition", () => held("a").length + held("b").length === PARTITIONS);
  // Started after the vault's workers announced: it learns of the vault by asking.
  const caller = await Worker.start(await bus.connect(), front, { prefix });
  await until("the caller knows the vault is keyed", () => caller.keyedServices.has("vault"));
  assert.deepEqual(caller.keyedServices.get("vault"), { partitions: PARTITIONS, sessionKey: "room" });

  const gate = await bus.connect();
  const ann = create(SessionSchema, { gate: "g1", sid: 1n, uid: "ann", data: { room: "r7" } });
  const bob = create(SessionSchema, { gate: "g1", sid: 2n, uid: "bob" });
  const longest = "é".repeat(MAX_KEY_LEN / 2); // 256 bytes: the most a key may have
  const cases: [string, Session | undefined, string][] = [
    ["the caller's key first", ann, "k-explicit"],
    ["then the session value the service names", ann, "r7"],
    ["then the uid", bob, "bob"],
    ["a key of MAX_KEY_LEN bytes", undefined, longest],
  ];
  for (const [why, session, key] of cases) {
    const explicit = why.startsWith("the caller's") || why.startsWith("a key") ? key : "";
    const answer = await go(gate, prefix, explicit, session);
    const [code, name, seen] = answer.split(" ");
    assert.equal(code, "200", `${why}: ${answer}`);
    assert.equal(seen, key, `${why}: the callee's ctx.key`);
    assert.ok(held(name ?? "").includes(partitionOf(key, PARTITIONS)), `${why}: ${name} holds the key's partition`);
  }
  // Keys spread over both workers: some key lands on each.
  const keys = Array.from({ length: 32 }, (_, n) => `key-${n}`);
  const names = new Set<string>();
  for (const key of keys) names.add((await go(gate, prefix, key, bob)).split(" ")[1] ?? "");
  assert.deepEqual([...names].sort(), ["a", "b"]);
  assert.equal(taken.length, cases.length + keys.length);

  // No key (no session, or one without the value or a uid): 400 at once, nothing sent.
  const anonymous = create(SessionSchema, { gate: "g1", sid: 3n, data: { other: "x" } });
  const noKey = `${Status.BAD_REQUEST} ${CallFailure.NO_KEY}`;
  assert.equal(await go(gate, prefix, "", undefined), noKey);
  assert.equal(await go(gate, prefix, "", anonymous), noKey);
  // Bytes are counted, not characters: 129 "é" are 258 bytes.
  const tooLong = `${Status.BAD_REQUEST} ${CallFailure.KEY_TOO_LONG}`;
  assert.equal(await go(gate, prefix, "k".repeat(MAX_KEY_LEN + 1), bob), tooLong);
  assert.equal(await go(gate, prefix, `${longest}é`, bob), tooLong);
  // With timing, a refused call's span took no time.
  const timed = create(RpcRequestSchema, { route: "front.go", session: anonymous, timing: true });
  const reply = await gate.request(`${prefix}.svc.front.go`, toBinary(RpcRequestSchema, timed));
  const spans = fromBinary(RpcResponseSchema, reply.data).calls.map((s) => [s.route, s.code, s.us, s.hop]);
  assert.deepEqual(spans, [["vault.who", Status.BAD_REQUEST, 0, 1]]);
  // An event has no session: its calls go by the key given, or not at all.
  const event = async (key: string): Promise<string> =>
    utf8.decode((await gate.request(`${prefix}.go`, text.encode(key), { timeout: DEADLINE_MS })).data);
  assert.match(await event("from-an-event"), /^200 [ab] from-an-event$/);
  assert.equal(await event(""), noKey);
  assert.equal(taken.length, cases.length + keys.length + 1, "the refused calls never reached the vault");
  assert.equal(CallFailure.NO_KEY, "keyed route: give a key, or log in first");
  assert.equal(CallFailure.KEY_TOO_LONG, "key too long");
  await Promise.all([caller.drain(), a?.drain(), b?.drain()]);
});

test("the caller learns keyed services from announcements, forgets them, ignores what is invalid", async () => {
  const prefix = "kc2";
  const nc = await bus.connect();
  const asks: number[] = [];
  nc.subscribe(`${prefix}.schema.ask`, { callback: (_e, msg) => void asks.push(msg.data.length) });
  await nc.flush();
  const caller = await Worker.start(await bus.connect(), front, { prefix });
  await until("the caller asked for the announcements", () => asks.length === 1);
  assert.deepEqual(asks, [0], "one empty ask");

  const announce = (service: string, keyed?: { partitions: number; sessionKey?: string }, on = service): void =>
    nc.publish(
      `${prefix}.schema.svc.${on}`,
      toBinary(
        ServiceSchemaSchema,
        create(ServiceSchemaSchema, { service, keyed: keyed && create(KeyedSchema, keyed) }),
      ),
    );
  const known = (): string => JSON.stringify([...caller.keyedServices].sort(([x], [y]) => (x < y ? -1 : 1)));
  announce("arena", { partitions: 64, sessionKey: "arena_match" });
  announce("inv", { partitions: 1 });
  await until("arena and inv are known", () => caller.keyedServices.size === 2);
  // Each of these changes nothing; the last one, keyed, says they have all been heard.
  nc.publish(`${prefix}.schema.svc.arena`, new Uint8Array([0xff, 0xff])); // does not decode
  announce("arena", { partitions: 0 });
  announce("arena", { partitions: 1025 });
  announce("arena", { partitions: 8, sessionKey: "Not A Name" });
  announce("arena", { partitions: 8 }, "inv"); // another service's subject
  announce("marker", { partitions: 2 });
  await until("the marker is known", () => caller.keyedServices.has("marker"));
  assert.equal(
    known(),
    JSON.stringify([
      ["arena", { partitions: 64, sessionKey: "arena_match" }],
      ["inv", { partitions: 1, sessionKey: "" }],
      ["marker", { partitions: 2, sessionKey: "" }],
    ]),
  );
  // Announced without `keyed`: plain again.
  announce("arena");
  await until("arena is forgotten", () => !caller.keyedServices.has("arena"));
  assert.deepEqual([...caller.keyedServices.keys()].sort(), ["inv", "marker"]);
  await caller.drain();
});

test("a call to a keyed service not heard of goes to the method's subject, without a key", async () => {
  const prefix = "kc3";
  // The caller starts first and nobody announces: it cannot know.
  const caller = await Worker.start(await bus.connect(), front, { prefix });
  const nc = await bus.connect();
  const seen: string[] = [];
  nc.subscribe(`${prefix}.svc.vault.>`, {
    callback: (_e, msg) => {
      const { key, origin, seq } = fromBinary(RpcRequestSchema, msg.data);
      seen.push(`${msg.subject} key=${key} origin=${origin} seq=${seq}`);
      const response = create(RpcResponseSchema, { code: Status.UNAVAILABLE, message: "keyed" });
      msg.respond(toBinary(RpcResponseSchema, response));
    },
  });
  await nc.flush();
  const bob = create(SessionSchema, { gate: "g1", sid: 2n, uid: "bob" });
  assert.equal(await go(await bus.connect(), prefix, "k", bob), `${Status.UNAVAILABLE} keyed`);
  assert.deepEqual(
    seen,
    [`${prefix}.svc.vault.who key= origin= seq=0`],
    "without the key, or an order: the callee may not be keyed",
  );
  await caller.drain();
});

test("a call to a keyed service carries its order: the caller's origin, and a seq rising with each call", async () => {
  const prefix = "kc4";
  const caller = await Worker.start(await bus.connect(), front, { prefix });
  // A vault announced keyed, answered by a bare client on every partition that notes
  // each request's order.
  const nc = await bus.connect();
  const orders: { origin: string; seq: bigint; reply: string }[] = [];
  nc.subscribe(`${prefix}.part.vault.>`, {
    callback: (_e, msg) => {
      const { origin, seq } = fromBinary(RpcRequestSchema, msg.data);
      orders.push({ origin, seq, reply: msg.reply ?? "" });
      msg.respond(toBinary(RpcResponseSchema, create(RpcResponseSchema, { code: Status.OK, body: text.encode("v") })));
    },
  });
  const schema = create(ServiceSchemaSchema, { service: "vault", keyed: create(KeyedSchema, { partitions: PARTITIONS }) });
  nc.publish(`${prefix}.schema.svc.vault`, toBinary(ServiceSchemaSchema, schema));
  await until("the caller knows the vault is keyed", () => caller.keyedServices.has("vault"));

  const gate = await bus.connect();
  for (const key of ["k1", "k2"]) assert.equal(await go(gate, prefix, key, undefined), "200 v");
  // Calls in flight together too: published in the order their handlers ran.
  await Promise.all(["k3", "k4", "k5", "k6"].map((key) => go(gate, prefix, key, undefined)));
  assert.equal(orders.length, 6);
  const origin = orders[0]?.origin ?? "";
  assert.match(origin, new RegExp(`^${prefix}\\.call\\.[0-9a-f]{16}$`), "the worker's call reply prefix");
  for (const [i, order] of orders.entries()) {
    assert.equal(order.origin, origin);
    assert.equal(order.reply, `${origin}.${order.seq}`, "the seq is the call id");
    if (i > 0) assert.ok(order.seq > (orders[i - 1]?.seq ?? 0n), `seq rises: ${orders.map((o) => o.seq).join(", ")}`);
  }
  await caller.drain();
});
