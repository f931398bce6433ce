// The Service alone, without a bus: calls in, RpcResponses out.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { CallResult, HandlerError, Service, Status } from "../src/index.js";
import type { OutgoingCall } from "../src/index.js";
import { EchoRequestSchema, EchoResponseSchema } from "../src/gen/echo_pb.js";
import { CallSpanSchema, RpcRequestSchema, SessionSchema } from "../src/gen/rpc_pb.js";
import { echoService } from "../src/services/echo.js";

const text = new TextEncoder();
const utf8 = new TextDecoder();

function request(body: Uint8Array, uid = "") {
  return create(RpcRequestSchema, {
    route: "t.m",
    body,
    session: create(SessionSchema, { gate: "g1", sid: 7n, uid, data: { lang: "en" } }),
  });
}

test("a typed method decodes the request and encodes the response", async () => {
  const body = toBinary(EchoRequestSchema, create(EchoRequestSchema, { body: text.encode("ping") }));
  const { response } = await echoService().call("echo", request(body));
  assert.equal(response.code, Status.OK);
  assert.deepEqual(fromBinary(EchoResponseSchema, response.body).body, text.encode("ping"));
});

test("a raw method answers its bytes unchanged", async () => {
  const body = new Uint8Array([0xff, 0x00, 0x01]);
  const { response } = await echoService().call("raw", request(body));
  assert.equal(response.code, Status.OK);
  assert.deepEqual(response.body, body);
});

test("an unknown method is 404 and a body that does not decode is 400", async () => {
  assert.equal((await echoService().call("nope", request(new Uint8Array()))).response.code, Status.NOT_FOUND);
  const bad = await echoService().call("echo", request(new Uint8Array([0x0a, 0x05, 0x01])));
  assert.equal(bad.response.code, Status.BAD_REQUEST);
  assert.match(bad.response.message, /bad request body/);
  const garbage = await echoService().callEncoded("echo", new Uint8Array([0xff, 0xff]));
  assert.equal(garbage.response.code, Status.BAD_REQUEST);
});

test("effects and pushes come back in order; a failed handler's are dropped", async () => {
  const service = new Service("room")
    .rawMethod("enter", (ctx) => {
      assert.equal(ctx.data("lang"), "en");
      ctx.bindUid("ann");
      ctx.setData("room", "r1");
      ctx.join("r1");
      ctx.broadcast("r1", "room.entered", "ann");
      ctx.pushToUser("bob", "room.hello", "hi");
      ctx.kickUser("mallory", "banned");
      assert.equal(ctx.uid, "ann");
      return "ok";
    })
    .rawMethod("refuse", (ctx) => {
      ctx.join("r1");
      ctx.broadcast("r1", "room.entered", "x");
      throw HandlerError.forbidden("not you");
    })
    .rawMethod("crash", () => {
      throw new Error("boom");
    })
    .rawMethod("bad-group", (ctx) => {
      ctx.broadcast("a.>", "room.x", "");
      return "";
    });
  const ok = await service.call("enter", request(new Uint8Array()));
  assert.equal(ok.response.code, 200);
  assert.deepEqual(
    ok.response.effects.map((e) => e.kind.case),
    ["bindUid", "setData", "join"],
  );
  assert.deepEqual(
    ok.outbound.map((o) => o.kind),
    ["group", "user", "user"],
  );
  const refused = await service.call("refuse", request(new Uint8Array()));
  assert.equal(refused.response.code, Status.FORBIDDEN);
  assert.equal(refused.response.message, "not you");
  assert.deepEqual([refused.response.effects.length, refused.outbound.length], [0, 0]);
  const crashed = await service.call("crash", request(new Uint8Array()));
  assert.equal(crashed.response.code, Status.HANDLER_ERROR);
  assert.equal((await service.call("bad-group", request(new Uint8Array()))).response.code, Status.BAD_REQUEST);
});

test("a handler answers from a call's result; the caller gets the session and the deadline", async () => {
  const calls: OutgoingCall[] = [];
  const caller = (call: OutgoingCall): Promise<CallResult> => {
    calls.push(call);
    const answer = call.route === "bank.pay" ? new CallResult(Status.OK, text.encode("paid"), "") : undefined;
    return Promise.resolve(answer ?? CallResult.error(Status.NOT_FOUND, "no such method"));
  };
  const service = new Service("shop")
    .rawMethod("buy", async (ctx, body) => {
      ctx.setData("cart", utf8.decode(body));
      return (await ctx.call("bank.pay", body)).orThrow();
    })
    .rawMethod("rob", async (ctx) => (await ctx.call("bank.rob")).orThrow());
  const bought = await service.call("buy", request(text.encode("1 coin"), "ann"), { caller, deadline: 1234.5 });
  assert.deepEqual([bought.response.code, utf8.decode(bought.response.body)], [Status.OK, "paid"]);
  const [call] = calls;
  assert.ok(call);
  assert.deepEqual([call.route, utf8.decode(call.body), call.deadline], ["bank.pay", "1 coin", 1234.5]);
  assert.deepEqual([call.session?.uid, call.session?.data["cart"]], ["ann", "1 coin"]);
  // The callee's failure, as it is.
  const robbed = await service.call("rob", request(new Uint8Array()), { caller });
  assert.deepEqual([robbed.response.code, robbed.response.message], [Status.NOT_FOUND, "no such method"]);
});

test("a stand-in caller sees the key, the trace and the timing; spans come back in the answer", async () => {
  const calls: OutgoingCall[] = [];
  const callee = [create(CallSpanSchema, { route: "leaf.x", code: 200, us: 5, hop: 1 })];
  const caller = (call: OutgoingCall): Promise<CallResult> => {
    calls.push(call);
    return Promise.resolve(new CallResult(Status.OK, new Uint8Array(), "", callee));
  };
  const service = new Service("t").rawMethod("m", async (ctx) => {
    await ctx.call("a.b", "", { key: "k1" });
    await ctx.callWith("c.d", EchoRequestSchema, {}, { key: "k2" });
    return ctx.trace.join(",");
  });
  const traced = create(RpcRequestSchema, { ...request(new Uint8Array()), trace: ["x.y"], timing: true });
  const { response } = await service.call("m", traced, { caller });
  assert.equal(utf8.decode(response.body), "x.y");
  assert.deepEqual(
    calls.map((c) => [c.route, c.key, c.trace, c.timing]),
    [
      ["a.b", "k1", ["x.y", "t.m"], true],
      ["c.d", "k2", ["x.y", "t.m"], true],
    ],
  );
  assert.deepEqual(
    response.calls.map((c) => `${c.route} ${c.code} ${c.hop}`),
    ["a.b 200 1", "leaf.x 200 2", "c.d 200 1", "leaf.x 200 2"],
  );
  assert.equal(response.calls[1]?.us, 5, "the callee's own measure");
  // Without timing: no spans, and the calls ask for none.
  const plain = await service.call("m", request(new Uint8Array()), { caller });
  assert.deepEqual([plain.response.calls, calls[2]?.timing, calls[2]?.trace], [[], false, ["t.m"]]);
});

test("a call's route is checked, and without a bus a call gets 503", async () => {
  const results: CallResult[] = [];
  const service = new Service("s").rawMethod("go", async (ctx, body) => {
    results.push(await ctx.call(utf8.decode(body)));
    return "";
  });
  const caller = (): Promise<CallResult> => assert.fail("a bad route never reaches the caller");
  for (const route of ["bank", "bank.", ".pay", "bank.pay.x", "Bank.pay", "bank.>"]) {
    await service.call("go", request(text.encode(route)), { caller });
  }
  await service.call("go", request(text.encode("bank.pay")));
  assert.deepEqual(
    results.map((r) => `${r.code} ${r.message}`),
    [...Array<string>(6).fill("400 a call's route is service.method"), "503 bus unavailable"],
  );
});

test("a call's result reads as a body, a typed message, or the callee's error", () => {
  const echoed = toBinary(EchoResponseSchema, create(EchoResponseSchema, { body: text.encode("x") }));
  const ok = new CallResult(Status.OK, echoed, "");
  assert.ok(ok.ok);
  assert.deepEqual(ok.decode(EchoResponseSchema).body, text.encode("x"));
  const failed = CallResult.error(Status.UNAVAILABLE, "no worker available now");
  assert.equal(failed.ok, false);
  assert.throws(() => failed.orThrow(), { name: "HandlerError", code: 503, message: "no worker available now" });
  assert.throws(() => failed.decode(EchoResponseSchema), { code: 503 });
  const garbage = new CallResult(Status.OK, new Uint8Array([0xff]), "");
  assert.throws(() => garbage.decode(EchoResponseSchema), { code: 500, message: /^bad answer from a call/ });
});

test("the schema lists typed methods and carries their files' descriptors", () => {
  const schema = echoService().schema();
  assert.ok(schema);
  assert.equal(schema.service, "echo");
  assert.deepEqual(
    schema.methods.map((m) => [m.method, m.requestType, m.responseType]),
    [["echo", "shaddock.echo.EchoRequest", "shaddock.echo.EchoResponse"]],
  );
  const set = fromBinary(FileDescriptorSetSchema, schema.descriptors);
  assert.deepEqual(
    set.file.map((f) => f.name),
    ["echo.proto"],
  );
  assert.equal(new Service("plain").rawMethod("raw", (_c, b) => b).schema(), undefined);
});

test("registration refuses bad and duplicate names", () => {
  assert.throws(() => new Service("Echo"));
  assert.throws(() => new Service("a.b"));
  assert.throws(() => echoService().rawMethod("raw", (_c, b) => b));
  assert.throws(() => echoService().rawMethod("x>", (_c, b) => b));
});

test("a keyed service announces itself keyed, even with no typed method", () => {
  const service = new Service("tally").keyed({ partitions: 8, sessionKey: "match" }).rawMethod("add", (_c, b) => b);
  const schema = service.schema();
  assert.ok(schema);
  assert.equal(service.partitions, 8);
  assert.deepEqual([schema.keyed?.partitions, schema.keyed?.sessionKey], [8, "match"]);
  assert.deepEqual(schema.methods, []);
  assert.equal(new Service("plain").keyed({ partitions: 1 }).schema()?.keyed?.sessionKey, "");
  assert.equal(echoService().schema()?.keyed, undefined);
  assert.equal(echoService().partitions, undefined);
});

test("a keyed handler sees its key; a request without one is 503, retry", async () => {
  const service = new Service("tally").keyed({ partitions: 4 }).rawMethod("whose", (ctx) => ctx.key ?? "none");
  const keyed = create(RpcRequestSchema, { route: "tally.whose", key: "match-1" });
  const answered = await service.call("whose", keyed);
  assert.deepEqual([answered.response.code, utf8.decode(answered.response.body)], [200, "match-1"]);
  const keyless = await service.call("whose", request(new Uint8Array()));
  assert.equal(keyless.response.code, Status.UNAVAILABLE);
  assert.equal(keyless.response.message, 'service "tally" is keyed and the request has no key: retry');
  // An unknown method is 404 first, as in Rust.
  assert.equal((await service.call("nope", request(new Uint8Array()))).response.code, Status.NOT_FOUND);
  // A request without a key (events, direct callers) has none.
  const plain = new Service("plain").rawMethod("whose", (ctx) => ctx.key ?? "none");
  assert.equal(utf8.decode((await plain.call("whose", request(new Uint8Array()))).response.body), "none");
});

test("hand-over and take-over callbacks give and take a partition's state", async () => {
  const taken: [number, string | undefined][] = [];
  const service = new Service("tally").keyed({
    partitions: 4,
    handOver: (ctx, partition) => {
      ctx.publish("tally.moved", String(partition));
      return `state of ${partition}`;
    },
    takeOver: (_ctx, partition, state) => {
      taken.push([partition, state === undefined ? undefined : utf8.decode(state)]);
    },
  });
  const handed = await service.handOver(2);
  assert.deepEqual([handed.ok, utf8.decode(handed.state), handed.outbound.length], [true, "state of 2", 1]);
  assert.ok((await service.takeOver(1, undefined)).ok);
  assert.ok((await service.takeOver(2, handed.state)).ok);
  assert.deepEqual(taken, [
    [1, undefined],
    [2, "state of 2"],
  ]);
  // Without callbacks: an empty state; a failing callback moves the partition stateless.
  assert.deepEqual((await new Service("x").keyed({ partitions: 1 }).handOver(0)).state, new Uint8Array());
  const failing = new Service("y").keyed({
    partitions: 1,
    handOver: () => {
      throw new Error("boom");
    },
  });
  assert.deepEqual([(await failing.handOver(0)).ok, (await failing.handOver(0)).state.length], [false, 0]);
});

test("keyed refuses bad partitions, bad session keys and a second call", () => {
  assert.throws(() => new Service("k").keyed({ partitions: 0 }));
  assert.throws(() => new Service("k").keyed({ partitions: 1025 }));
  assert.throws(() => new Service("k").keyed({ partitions: 1.5 }));
  assert.throws(() => new Service("k").keyed({ partitions: 4, sessionKey: "a.b" }));
  assert.throws(() => new Service("k").keyed({ partitions: 4 }).keyed({ partitions: 4 }));
  new Service("k").keyed({ partitions: 1024 });
});
