// Workers on a real nats-server, with a bare NATS client in the gate's place: requests
// are RpcRequests on <prefix>.svc.<service>.<method>, answers RpcResponses.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import type { NatsConnection } from "@nats-io/transport-node";
import { Service, Status, Worker } from "../src/index.js";
import { EchoRequestSchema, EchoResponseSchema } from "../src/gen/echo_pb.js";
import type { RpcResponse } from "../src/gen/rpc_pb.js";
import {
  RpcRequestSchema,
  RpcResponseSchema,
  ServerPushSchema,
  ServiceSchemaSchema,
  SessionClosedSchema,
  SessionSchema,
} from "../src/gen/rpc_pb.js";
import { echoService } from "../src/services/echo.js";
import { DEADLINE_MS, startBus } from "./bus.js";
import type { Bus } from "./bus.js";

const text = new TextEncoder();
let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** Sends `body` to `<prefix>.svc.<route>` as a gate would and decodes the answer. */
async function call(nc: NatsConnection, prefix: string, route: string, body: Uint8Array, timing = false): Promise<RpcResponse> {
  const request = create(RpcRequestSchema, {
    route,
    body,
    timing,
    session: create(SessionSchema, { gate: "g1", sid: 1n }),
  });
  const reply = await nc.request(`${prefix}.svc.${route}`, toBinary(RpcRequestSchema, request), { timeout: DEADLINE_MS });
  return fromBinary(RpcResponseSchema, reply.data);
}

/** A promise and the function that resolves it. */
function latch(): { promise: Promise<void>; open: () => void } {
  let open = (): void => {};
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

test("serves typed and raw methods, 404 for unknown ones, with timings", async () => {
  const [nc, client] = [await bus.connect(), await bus.connect()];
  const worker = await Worker.start(nc, echoService(), { prefix: "a" });
  const body = toBinary(EchoRequestSchema, create(EchoRequestSchema, { body: text.encode("hi") }));
  const echoed = await call(client, "a", "echo.echo", body, true);
  assert.equal(echoed.code, Status.OK);
  assert.deepEqual(Buffer.from(fromBinary(EchoResponseSchema, echoed.body).body), Buffer.from("hi"));
  assert.ok(echoed.queueUs >= 0 && echoed.handlerUs >= 0);
  const raw = await call(client, "a", "echo.raw", text.encode("as is"));
  assert.deepEqual([raw.code, Buffer.from(raw.body)], [Status.OK, Buffer.from("as is")]);
  const unknown = await call(client, "a", "echo.nope", new Uint8Array());
  assert.equal(unknown.code, Status.NOT_FOUND);
  assert.deepEqual(worker.stats, { served: 3, rejected: 0, events: 0, expired: 0, late: 0 });
  await worker.drain();
});

test("pushes are published before the answer, on the gates' subjects", async () => {
  const [nc, client] = [await bus.connect(), await bus.connect()];
  const service = new Service("room").rawMethod("say", (ctx, body) => {
    ctx.broadcast("lobby", "room.said", body);
    ctx.pushToUser("bob", "room.whisper", "psst");
    return "said";
  });
  const worker = await Worker.start(nc, service, { prefix: "b" });
  const seen: string[] = [];
  client.subscribe("b.grp.lobby", {
    callback: (_e, msg) => void seen.push(`push ${fromBinary(ServerPushSchema, msg.data).route}`),
  });
  client.subscribe("b.user.bob", { callback: () => void seen.push("user bob") });
  await client.flush();
  const answer = await call(client, "b", "room.say", text.encode("hello"));
  seen.push(`answer ${answer.code}`);
  assert.deepEqual(seen, ["push room.said", "user bob", "answer 200"]);
  await worker.drain();
});

test("a full queue is answered 503 at once, and what was queued is still served", async () => {
  const [nc, client] = [await bus.connect(), await bus.connect()];
  const held = latch();
  const entered = latch();
  const service = new Service("slow").rawMethod("hold", async (_ctx, body) => {
    entered.open();
    await held.promise;
    return body;
  });
  const worker = await Worker.start(nc, service, { prefix: "c", queueCapacity: 2 });
  const first = call(client, "c", "slow.hold", text.encode("0"));
  await entered.promise;
  const rest = [1, 2, 3, 4].map((i) => call(client, "c", "slow.hold", text.encode(String(i))));
  // Two fit in the queue behind the held one; two are refused without waiting for it.
  const refused = await Promise.race([Promise.all(rest.slice(2)), new Promise((r) => setTimeout(r, DEADLINE_MS))]);
  assert.ok(Array.isArray(refused), "the refusals did not come at once");
  for (const response of refused as RpcResponse[]) {
    assert.equal(response.code, Status.UNAVAILABLE);
    assert.match(response.message, /overloaded/);
  }
  held.open();
  const served = await Promise.all([first, ...rest.slice(0, 2)]);
  assert.deepEqual(served.map((r) => r.code), [200, 200, 200]);
  assert.deepEqual(worker.stats, { served: 3, rejected: 2, events: 0, expired: 0, late: 0 });
  await worker.drain();
});

test("announces its schema at start and again when asked", async () => {
  const [nc, listener] = [await bus.connect(), await bus.connect()];
  const heard: Uint8Array[] = [];
  let wake = (): void => {};
  listener.subscribe("d.schema.svc.*", {
    callback: (_e, msg) => {
      heard.push(msg.data);
      wake();
    },
  });
  await listener.flush();
  const next = async (): Promise<Uint8Array> => {
    while (heard.length === 0) await new Promise<void>((resolve) => (wake = resolve));
    return heard.shift() as Uint8Array;
  };
  const worker = await Worker.start(nc, echoService(), { prefix: "d" });
  const first = fromBinary(ServiceSchemaSchema, await next());
  assert.equal(first.service, "echo");
  assert.equal(first.methods[0]?.requestType, "shaddock.echo.EchoRequest");
  const files = fromBinary(FileDescriptorSetSchema, first.descriptors).file;
  assert.deepEqual(
    files.flatMap((f) => f.messageType.map((m) => `${f.package}.${m.name}`)),
    ["shaddock.echo.EchoRequest", "shaddock.echo.EchoResponse"],
  );
  listener.publish("d.schema.ask");
  assert.deepEqual(Buffer.from(await next()), Buffer.from(toBinary(ServiceSchemaSchema, first)));
  await worker.drain();
});

test("drain answers what it took, then the bus has no responder left", async () => {
  const [nc, client] = [await bus.connect(), await bus.connect()];
  const held = latch();
  const entered = latch();
  const service = new Service("drn").rawMethod("hold", async (_ctx, body) => {
    entered.open();
    await held.promise;
    return body;
  });
  const worker = await Worker.start(nc, service, { prefix: "e" });
  const pending = [0, 1, 2].map((i) => call(client, "e", "drn.hold", text.encode(String(i))));
  await entered.promise;
  await client.flush();
  const drained = worker.drain();
  held.open();
  await drained;
  assert.deepEqual((await Promise.all(pending)).map((r) => r.code), [200, 200, 200]);
  await assert.rejects(call(client, "e", "drn.hold", new Uint8Array()), /no responders/i);
});

test("session-closed events reach one worker of the service", async () => {
  const [a, b, gate] = [await bus.connect(), await bus.connect(), await bus.connect()];
  const closed: bigint[] = [];
  const got = latch();
  const service = (): Service =>
    new Service("watch").onSessionClosed((_ctx, event) => {
      closed.push(event.sid);
      got.open();
    });
  const workers = [await Worker.start(a, service(), { prefix: "f" }), await Worker.start(b, service(), { prefix: "f" })];
  gate.publish("f.evt.session.closed", toBinary(SessionClosedSchema, create(SessionClosedSchema, { gate: "g1", sid: 9n })));
  await got.promise;
  await gate.flush();
  await Promise.all(workers.map((w) => w.drain()));
  assert.deepEqual(closed, [9n]);
});
