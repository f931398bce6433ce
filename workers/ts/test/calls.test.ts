// Calls between services (docs/workers.md, "Calling other services") on a real
// nats-server: a bare NATS client sends requests as a gate would, and plays the callee
// where the test must see the wire (or hold the call) itself.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { CallFailure, MAX_CALL_DEPTH, MAX_CALL_SPANS, Service, Status, Worker } from "../src/index.js";
import type { CallResult, WorkerOptions } from "../src/index.js";
import { EchoRequestSchema, EchoResponseSchema } from "../src/gen/echo_pb.js";
import type { CallSpan, RpcRequest, RpcResponse } from "../src/gen/rpc_pb.js";
import { RpcRequestSchema, RpcResponseSchema, SessionSchema } from "../src/gen/rpc_pb.js";
import { echoService } from "../src/services/echo.js";
import { bankService, shopService } from "../src/services/shop.js";
import { DEADLINE_MS, startBus } from "./bus.js";
import type { Bus } from "./bus.js";

const text = new TextEncoder();
const utf8 = new TextDecoder();
let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** A gate's request for `route`, from ann's session unless `session` is false. */
function rpcRequest(route: string, body: string, timeoutMs = 0, session = true): Uint8Array {
  const request = create(RpcRequestSchema, {
    route,
    body: text.encode(body),
    timeoutMs,
    session: session ? create(SessionSchema, { gate: "g1", sid: 1n, uid: "ann" }) : undefined,
  });
  return toBinary(RpcRequestSchema, request);
}

/** Sends a request as a gate would and decodes the answer. */
async function send(
  nc: NatsConnection,
  prefix: string,
  route: string,
  body: string,
  timeoutMs = 0,
): Promise<RpcResponse> {
  const reply = await nc.request(`${prefix}.svc.${route}`, rpcRequest(route, body, timeoutMs), {
    timeout: DEADLINE_MS,
  });
  return fromBinary(RpcResponseSchema, reply.data);
}

/** `[code, body as text]` of an answer. */
function said(response: RpcResponse): [number, string] {
  return [response.code, utf8.decode(response.body)];
}

/** A callee played by the test: it takes the service's requests in its queue group and answers when told. */
class Callee {
  readonly #sub: Subscription;
  readonly #taken: Msg[] = [];
  #wake = (): void => {};

  constructor(nc: NatsConnection, prefix: string, service: string) {
    this.#sub = nc.subscribe(`${prefix}.svc.${service}.>`, {
      queue: service,
      callback: (_error, msg) => {
        this.#taken.push(msg);
        this.#wake();
      },
    });
  }

  /** The next call it took, waiting for it. */
  async next(): Promise<{ msg: Msg; request: RpcRequest }> {
    while (this.#taken.length === 0) await new Promise<void>((resolve) => (this.#wake = resolve));
    const msg = this.#taken.shift() as Msg;
    return { msg, request: fromBinary(RpcRequestSchema, msg.data) };
  }

  stop(): void {
    this.#sub.unsubscribe();
  }
}

function answer(msg: Msg, body: string, code: number = Status.OK): void {
  msg.respond(toBinary(RpcResponseSchema, create(RpcResponseSchema, { code, body: text.encode(body) })));
}

/** A promise and the function that resolves it. */
function latch(): { promise: Promise<void>; open: () => void } {
  let open = (): void => {};
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

async function shop(nc: NatsConnection, prefix: string, options: WorkerOptions = {}): Promise<Worker> {
  return Worker.start(nc, shopService(), { prefix, ...options });
}

test("a handler answers from a call's result; the call carries the session and the time left", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "ca", "bank");
  await callee.flush();
  const service = new Service("shop").rawMethod("buy", async (ctx, body) => {
    ctx.setData("cart", utf8.decode(body));
    return (await ctx.call("bank.pay", body)).orThrow();
  });
  const worker = await Worker.start(nc, service, { prefix: "ca" });
  const bought = send(gate, "ca", "shop.buy", "3 coins", 3_000);

  const { msg, request } = await bank.next();
  assert.equal(msg.subject, "ca.svc.bank.pay");
  assert.match(msg.reply ?? "", /^ca\.call\.[0-9a-f]{16}\.\d+$/);
  assert.equal(request.route, "bank.pay");
  assert.equal(utf8.decode(request.body), "3 coins");
  assert.equal(request.session?.uid, "ann");
  assert.equal(request.session?.data["cart"], "3 coins", "with the caller's own changes so far");
  assert.ok(request.timeoutMs > 2_000 && request.timeoutMs <= 3_000, `what is left: ${request.timeoutMs}`);
  answer(msg, "paid");
  const response = await bought;
  assert.deepEqual(said(response), [Status.OK, "paid"]);
  assert.equal(response.effects.length, 1, "the caller's own effects");
  bank.stop();
  await worker.drain();
});

test("TypeScript workers serve calls like any request, with or without a session", async () => {
  const [a, b, gate] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = await Worker.start(b, bankService(), { prefix: "cb" });
  const echo = await Worker.start(b, echoService(), { prefix: "cb" });
  const relay = new Service("relay")
    .rawMethod("echo", async (ctx, body) => {
      const result = await ctx.callWith("echo.echo", EchoRequestSchema, { body });
      return result.decode(EchoResponseSchema).body;
    })
    .onEvent("tick", "queue", async (ctx) => {
      // No session: the bank sees nobody.
      ctx.publish("paid", (await ctx.call("bank.pay", "1 coin")).orThrow());
    });
  const worker = await Worker.start(a, relay, { prefix: "cb" });
  assert.deepEqual(said(await send(gate, "cb", "relay.echo", "typed")), [Status.OK, "typed"]);
  const paid = gate.subscribe("cb.paid", { max: 1 });
  gate.publish("cb.tick");
  for await (const msg of paid) assert.equal(utf8.decode(msg.data), "nobody paid 1 coin");
  assert.deepEqual(said(await send(gate, "cb", "bank.pay", "2 coins")), [Status.OK, "ann paid 2 coins"]);
  await Promise.all([worker.drain(), bank.drain(), echo.drain()]);
});

test("a call to a service nobody serves gets 503 at once", async () => {
  const [nc, gate] = [await bus.connect(), await bus.connect()];
  const worker = await shop(nc, "cc");
  const response = await send(gate, "cc", "shop.buy", "1 coin", 3_000);
  assert.deepEqual(said(response), [Status.OK, "no sale: 503 no worker available now"]);
  await worker.drain();
});

test("an answer without a status code, or that does not decode, is a 500 to the caller", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cm", "bank");
  await callee.flush();
  const service = new Service("shop").rawMethod("buy", async (ctx, body) => {
    const paid = await ctx.call("bank.pay", body);
    return text.encode(`${paid.code} ${paid.message}`);
  });
  const worker = await Worker.start(nc, service, { prefix: "cm" });
  const empty = send(gate, "cm", "shop.buy", "1", 3_000);
  (await bank.next()).msg.respond(new Uint8Array());
  assert.deepEqual(said(await empty), [Status.OK, `${Status.HANDLER_ERROR} ${CallFailure.MALFORMED_NO_CODE}`]);
  const garbage = send(gate, "cm", "shop.buy", "2", 3_000);
  (await bank.next()).msg.respond(new Uint8Array([0xff, 0xff]));
  const [code, said500] = said(await garbage);
  assert.equal(code, Status.OK);
  assert.match(said500, /^500 malformed answer to a call: /);
  bank.stop();
  await worker.drain();
});

test("a call times out the margin before the request's deadline, the handler answers in time, the worker serves meanwhile", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cd", "bank");
  await callee.flush();
  const worker = await shop(nc, "cd", { callMarginMs: 100 });
  const started = performance.now();
  const stalled = send(gate, "cd", "shop.buy", "1 coin", 300);
  const { request } = await bank.next();
  assert.ok(request.timeoutMs <= 200, `the deadline less the margin: ${request.timeoutMs}`);
  // The shop is not waiting for the bank: it serves.
  assert.deepEqual(said(await send(gate, "cd", "shop.login", "bob")), [Status.OK, ""]);
  // The margin before the deadline the call's 408 reaches the handler, which answers.
  assert.deepEqual(said(await stalled), [Status.OK, "no sale: 408 call timed out"]);
  const took = performance.now() - started;
  assert.ok(took >= 199 && took < 300, `within the caller's time, less the margin: ${took}`);
  assert.equal(worker.stats.expired, 0);
  bank.stop();
  await worker.drain();
});

test("a call made without a deadline waits the call timeout", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "ce", "bank");
  await callee.flush();
  const worker = await shop(nc, "ce", { callTimeoutMs: 200 });
  const stalled = send(gate, "ce", "shop.buy", "1 coin");
  const { request } = await bank.next();
  assert.equal(request.timeoutMs, 200);
  assert.deepEqual(said(await stalled), [Status.OK, "no sale: 408 call timed out"]);
  bank.stop();
  await worker.drain();
});

test("a call's own timeout holds within its caller's deadline less the margin; with no more left, 408 at once", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cx", "bank");
  await callee.flush();
  // `ask` waits for the bank at most the milliseconds its body says.
  const service = new Service("shop").rawMethod("ask", async (ctx, body) => {
    const result = await ctx.call("bank.pay", "", { timeoutMs: Number(utf8.decode(body)) });
    return `${result.code} ${result.message}`;
  });
  const worker = await Worker.start(nc, service, { prefix: "cx", callMarginMs: 100 });
  const ask = async (waitMs: number, callerMs: number): Promise<[number, string, number]> => {
    const started = performance.now();
    const response = await send(gate, "cx", "shop.ask", String(waitMs), callerMs);
    return [...said(response), performance.now() - started];
  };
  // Its own 100 ms, well within the caller's 3 s; or none given by the caller.
  for (const callerMs of [3_000, 0]) {
    const asked = ask(100, callerMs);
    assert.equal((await bank.next()).request.timeoutMs, 100);
    const [code, text, took] = await asked;
    assert.deepEqual([code, text], [Status.OK, "408 call timed out"]);
    assert.ok(took >= 99 && took < 1_000, `its own timeout: ${took}`);
  }
  // Beyond the caller's 400 ms: capped at 300 ms, the caller's less the margin.
  const capped = ask(5_000, 400);
  const { request } = await bank.next();
  assert.ok(request.timeoutMs > 200 && request.timeoutMs <= 300, `capped: ${request.timeoutMs}`);
  assert.deepEqual((await capped).slice(0, 2), [Status.OK, "408 call timed out"]);
  // No more than the margin left: refused at once, never sent.
  const [code, text, took] = await ask(5_000, 100);
  assert.deepEqual([code, text], [Status.OK, "408 call timed out"]);
  assert.ok(took < 100, `at once: ${took}`);
  bank.stop();
  await worker.drain();
});

test("a handler that never answers gets one 408 at its deadline, and its late answer is dropped", async () => {
  const [nc, gate] = [await bus.connect(), await bus.connect()];
  const released = latch();
  const service = new Service("slow")
    .rawMethod("hang", async () => {
      await released.promise;
      return "too late";
    })
    .rawMethod("never", () => new Promise<string>(() => {}))
    .rawMethod("ping", (_ctx, body) => body);
  const worker = await Worker.start(nc, service, { prefix: "cf", answerTimeoutMs: 100 });
  const inbox = gate.subscribe("cf-inbox");
  const answers = inbox[Symbol.asyncIterator]();
  const next = async (): Promise<[number, string]> => {
    const { value } = await answers.next();
    return said(fromBinary(RpcResponseSchema, (value as Msg).data));
  };

  // The caller's 200 ms, and the worker's own 100 ms for a caller that did not say.
  gate.publish("cf.svc.slow.hang", rpcRequest("slow.hang", "", 200), { reply: "cf-inbox" });
  gate.publish("cf.svc.slow.never", rpcRequest("slow.never", "", 0), { reply: "cf-inbox" });
  const started = performance.now();
  assert.deepEqual(await next(), [Status.TIMEOUT, ""]);
  assert.deepEqual(await next(), [Status.TIMEOUT, ""]);
  assert.ok(performance.now() - started >= 199, "the first at its caller's deadline");
  // The handler answers now: nothing goes out. Answers leave one connection in order, so
  // the next one on the inbox is the ping's.
  released.open();
  gate.publish("cf.svc.slow.ping", rpcRequest("slow.ping", "pong"), { reply: "cf-inbox" });
  assert.deepEqual(await next(), [Status.OK, "pong"]);
  assert.deepEqual(worker.stats, { served: 1, rejected: 0, events: 0, expired: 2, late: 1 });
  inbox.unsubscribe();
  await worker.drain();
});

test("the worker's 408 says why", async () => {
  const [nc, gate] = [await bus.connect(), await bus.connect()];
  const worker = await Worker.start(nc, new Service("idle").rawMethod("x", () => new Promise<string>(() => {})), {
    prefix: "cg",
  });
  const response = await send(gate, "cg", "idle.x", "", 50);
  assert.deepEqual([response.code, response.message], [Status.TIMEOUT, "no answer in time"]);
  await worker.drain();
});

test("calls past maxCalls get 503 at once, and results make room", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "ch", "bank");
  await callee.flush();
  const codes: number[] = [];
  const service = new Service("spree").rawMethod("buy", async (ctx, body) => {
    const n = Number(utf8.decode(body));
    const results = await Promise.all(Array.from({ length: n }, () => ctx.call("bank.pay", "1")));
    codes.push(...results.map((r: CallResult) => r.code));
    return results.map((r) => r.message || utf8.decode(r.body)).join(",");
  });
  const worker = await Worker.start(nc, service, { prefix: "ch", maxCalls: 2 });
  const first = send(gate, "ch", "spree.buy", "2", 5_000);
  const held = [await bank.next(), await bank.next()];
  assert.equal(worker.callsInFlight, 2);
  // Two calls in flight: a third is refused without waiting for them.
  assert.deepEqual(said(await send(gate, "ch", "spree.buy", "1", 5_000)), [Status.OK, "too many calls in flight"]);
  for (const { msg } of held) answer(msg, "paid");
  assert.deepEqual(said(await first), [Status.OK, "paid,paid"]);
  assert.equal(worker.callsInFlight, 0);
  const again = send(gate, "ch", "spree.buy", "1", 5_000);
  answer((await bank.next()).msg, "paid");
  assert.deepEqual(said(await again), [Status.OK, "paid"]);
  assert.deepEqual(codes, [Status.UNAVAILABLE, Status.OK, Status.OK, Status.OK]);
  bank.stop();
  await worker.drain();
});

test("continuations run in the order their results arrive", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "ci", "bank");
  await callee.flush();
  const ran: string[] = [];
  const service = new Service("order").rawMethod("buy", async (ctx, body) => {
    const who = utf8.decode(body);
    const result = await ctx.call("bank.pay", body);
    ran.push(`${who}:${utf8.decode(result.body)}`);
    return who;
  });
  const worker = await Worker.start(nc, service, { prefix: "ci" });
  const a = send(gate, "ci", "order.buy", "a", 5_000);
  const callA = await bank.next();
  const b = send(gate, "ci", "order.buy", "b", 5_000);
  const callB = await bank.next();
  answer(callB.msg, "1");
  assert.deepEqual(said(await b), [Status.OK, "b"]);
  answer(callA.msg, "2");
  assert.deepEqual(said(await a), [Status.OK, "a"]);
  assert.deepEqual(ran, ["b:1", "a:2"]);
  bank.stop();
  await worker.drain();
});

test("drain waits for a handler waiting on a call", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cj", "bank");
  await callee.flush();
  const worker = await shop(nc, "cj");
  const bought = send(gate, "cj", "shop.buy", "1 coin", 5_000);
  const { msg } = await bank.next();
  const drained = worker.drain();
  answer(msg, "paid late");
  await drained;
  assert.deepEqual(said(await bought), [Status.OK, "paid late"]);
  bank.stop();
});

/** Sends `route` with timing (or not) and decodes the answer. */
async function timed(nc: NatsConnection, prefix: string, route: string, body: string, timing: boolean) {
  const request = create(RpcRequestSchema, {
    route,
    body: text.encode(body),
    timing,
    timeoutMs: 5_000,
    session: create(SessionSchema, { gate: "g1", sid: 1n, uid: "ann" }),
  });
  const reply = await nc.request(`${prefix}.svc.${route}`, toBinary(RpcRequestSchema, request), {
    timeout: DEADLINE_MS,
  });
  return fromBinary(RpcResponseSchema, reply.data);
}

test("a call carries its request's trace and route: a cycle ends with 500 past MAX_CALL_DEPTH", async () => {
  const [nc, gate] = [await bus.connect(), await bus.connect()];
  const depths: number[] = [];
  const service = new Service("loop").rawMethod("again", async (ctx) => {
    depths.push(ctx.trace.length);
    const result = await ctx.call("loop.again");
    return result.ok ? result.body : `${result.code} ${result.message}`;
  });
  // What goes on the wire, seen on the gate's connection, which the answer comes back on too.
  const wire: RpcRequest[] = [];
  gate.subscribe("ct.svc.loop.>", { callback: (_e, msg) => void wire.push(fromBinary(RpcRequestSchema, msg.data)) });
  await gate.flush();
  const worker = await Worker.start(nc, service, { prefix: "ct" });
  const response = await timed(gate, "ct", "loop.again", "", false);
  assert.deepEqual(said(response), [
    Status.OK,
    `${Status.HANDLER_ERROR} calls nested deeper than 8: a cycle of calls?`,
  ]);
  assert.equal(CallFailure.TOO_DEEP, `calls nested deeper than ${MAX_CALL_DEPTH}: a cycle of calls?`);
  // The gate's request (trace 0), then calls with traces 1 to 8; the 9th was never sent.
  assert.deepEqual(depths, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
  assert.deepEqual(
    wire.map((r) => r.trace),
    depths.map((n) => Array<string>(n).fill("loop.again")),
  );
  assert.equal(worker.callsInFlight, 0);
  await worker.drain();
});

test("a call carries its request's timing; an event's calls carry no trace and no timing", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cu", "bank");
  await callee.flush();
  const service = new Service("shop")
    .rawMethod("buy", async (ctx, body) => (await ctx.call("bank.pay", body)).orThrow())
    .onEvent("tick", "queue", async (ctx) => void (await ctx.call("bank.pay", "")));
  const worker = await Worker.start(nc, service, { prefix: "cu" });
  for (const timing of [true, false]) {
    const bought = timed(gate, "cu", "shop.buy", "1", timing);
    const { msg, request } = await bank.next();
    assert.deepEqual([request.trace, request.timing], [["shop.buy"], timing]);
    answer(msg, "paid");
    assert.deepEqual(said(await bought), [Status.OK, "paid"]);
  }
  gate.publish("cu.tick");
  const { msg, request } = await bank.next();
  assert.deepEqual([request.trace, request.timing, request.session], [[], false, undefined]);
  answer(msg, "");
  bank.stop();
  await worker.drain();
});

/** `route code hop` of each span, and checks their times. */
function spans(response: RpcResponse): string[] {
  return response.calls.map((s: CallSpan) => `${s.route} ${s.code} ${s.hop}`);
}

test("with timing, an answer lists its calls' spans in order, each followed by its callee's a hop deeper", async () => {
  const [a, b, gate] = [await bus.connect(), await bus.connect(), await bus.connect()];
  // outer.two calls mid.one twice, in turn; mid.one calls leaf.x (and nobody.x, which nobody serves).
  const leaf = new Service("leaf").rawMethod("x", (_ctx, body) => body);
  const mid = new Service("mid").rawMethod("one", async (ctx, body) => {
    await ctx.call("nobody.x");
    return (await ctx.call("leaf.x", body)).orThrow();
  });
  const outer = new Service("outer")
    .rawMethod("two", async (ctx) => {
      const first = await ctx.call("mid.one", "1");
      const second = await ctx.call("mid.one", "2");
      await ctx.call("not-a-route"); // refused at once: 0 µs
      return `${utf8.decode(first.orThrow())}${utf8.decode(second.orThrow())}`;
    })
    .rawMethod("many", async (ctx) => {
      // Each call's span and its callee's two: past MAX_CALL_SPANS, the rest are dropped.
      await Promise.all(Array.from({ length: MAX_CALL_SPANS }, () => ctx.call("mid.one", "")));
      return "";
    })
    .rawMethod("fails", async (ctx) => {
      await ctx.call("leaf.x");
      throw new Error("after its call");
    });
  const workers = [
    await Worker.start(b, leaf, { prefix: "cv" }),
    await Worker.start(b, mid, { prefix: "cv" }),
    await Worker.start(a, outer, { prefix: "cv" }),
  ];
  const response = await timed(gate, "cv", "outer.two", "", true);
  assert.deepEqual(said(response), [Status.OK, "12"]);
  const once = ["mid.one 200 1", "nobody.x 503 2", "leaf.x 200 2"];
  assert.deepEqual(spans(response), [...once, ...once, "not-a-route 400 1"]);
  const [mid1, nobody1, leaf1, mid2, , leaf2, refused] = response.calls;
  for (const [outside, inside] of [
    [mid1, leaf1],
    [mid1, nobody1],
    [mid2, leaf2],
  ]) {
    assert.ok((inside?.us ?? 0) > 0, "measured");
    assert.ok((outside?.us ?? 0) > (inside?.us ?? 0), "a call takes longer than the calls made for it");
  }
  assert.equal(refused?.us, 0);

  // Without timing: no spans, here or at the callees.
  assert.deepEqual(spans(await timed(gate, "cv", "outer.two", "", false)), []);
  // At most MAX_CALL_SPANS.
  const many = await timed(gate, "cv", "outer.many", "", true);
  assert.equal(many.calls.length, MAX_CALL_SPANS);
  assert.deepEqual(
    spans(many).slice(0, 6),
    [...once, ...once],
    "whole calls in the order their results came back",
  );
  // A handler that fails still reports its calls.
  const failed = await timed(gate, "cv", "outer.fails", "", true);
  assert.equal(failed.code, Status.HANDLER_ERROR);
  assert.deepEqual(spans(failed), ["leaf.x 200 1"]);
  await Promise.all(workers.map((w) => w.drain()));
});

test("with timing, the worker's own 408 lists the calls whose results came back by then", async () => {
  const [nc, gate, callee] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const bank = new Callee(callee, "cw", "bank");
  await callee.flush();
  const service = new Service("slow").rawMethod("x", async (ctx) => {
    await ctx.call("bank.pay");
    await new Promise<never>(() => {}); // never answers
    return "";
  });
  const worker = await Worker.start(nc, service, { prefix: "cw" });
  const request = create(RpcRequestSchema, { route: "slow.x", timing: true, timeoutMs: 300 });
  const pending = gate.request("cw.svc.slow.x", toBinary(RpcRequestSchema, request), { timeout: DEADLINE_MS });
  answer((await bank.next()).msg, "", Status.CONFLICT);
  const response = fromBinary(RpcResponseSchema, (await pending).data);
  assert.deepEqual([response.code, spans(response)], [Status.TIMEOUT, ["bank.pay 409 1"]]);
  bank.stop();
  await worker.drain();
});
