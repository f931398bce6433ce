// Keyed services on a real nats-server: TypeScript workers of a per-key counter, with a
// bare NATS client in the gate's place publishing each request on its key's partition
// subject (the partition from the library's own FNV-1a) and sending it again, as a
// gate does, while a partition is between owners (no responders).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { NatsConnection } from "@nats-io/transport-node";
import { Service, Status, Worker, partitionOf, score } from "../src/index.js";
import type { HandOver } from "../src/gen/rpc_pb.js";
import {
  HandOverSchema,
  KeyedMemberSchema,
  RpcRequestSchema,
  RpcResponseSchema,
  ServiceSchemaSchema,
  SessionSchema,
} from "../src/gen/rpc_pb.js";
import { DEADLINE_MS, startBus } from "./bus.js";
import type { Bus } from "./bus.js";

/** Enough partitions that a second worker wins some, whatever the two random ids. */
const PARTITIONS = 32;
const KEYS = Array.from({ length: 24 }, (_, n) => `match-${n}`);
/** Fast heartbeats, so workers find each other and move partitions in milliseconds. */
const TIMES = { keyedHeartbeatMs: 50, keyedMemberTimeoutMs: 1_000, handoverTimeoutMs: 1_000 };

const utf8 = new TextDecoder();
const encoder = new TextEncoder();
let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** Counts per key, moved with their partition; `fresh` counts partitions taken stateless. */
function tally(worker: string): { service: Service; fresh: () => number } {
  const counts = new Map<string, number>();
  let fresh = 0;
  const service = new Service("tally")
    .keyed({
      partitions: PARTITIONS,
      handOver: (_ctx, partition) => {
        let state = "";
        for (const [key, count] of counts) {
          if (partitionOf(key, PARTITIONS) === partition) {
            state += `${key}=${count}\n`;
            counts.delete(key);
          }
        }
        return state;
      },
      takeOver: (_ctx, _partition, state) => {
        if (state === undefined) {
          fresh += 1;
          return;
        }
        for (const line of utf8.decode(state).split("\n").filter(Boolean)) {
          const [key, count] = line.split("=");
          counts.set(key ?? "", Number(count));
        }
      },
    })
    .rawMethod("add", (ctx) => {
      const key = ctx.key ?? "";
      const count = (counts.get(key) ?? 0) + 1;
      counts.set(key, count);
      return `${worker} ${count}`;
    });
  return { service, fresh: () => fresh };
}

interface Started {
  readonly worker: Worker;
  readonly fresh: () => number;
  readonly nc: NatsConnection;
  readonly errors: string[];
}

async function start(prefix: string, name: string, options = {}): Promise<Started> {
  const { service, fresh } = tally(name);
  const nc = await bus.connect();
  const errors: string[] = [];
  const onError = (error: unknown, where: string): void => void errors.push(`${where}: ${String(error)}`);
  const worker = await Worker.start(nc, service, { prefix, ...TIMES, onError, ...options });
  return { worker, fresh, nc, errors };
}

/** Polls `condition` until it holds, failing after the deadline. */
async function until(what: string, condition: () => boolean): Promise<void> {
  const deadline = Date.now() + DEADLINE_MS;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const heldBy = (worker: Worker): readonly number[] => worker.keyed?.held ?? [];

/** Every partition is held, by exactly one of `workers`, and none is moving. */
function settled(...workers: Worker[]): boolean {
  const held = workers.flatMap(heldBy).sort((a, b) => a - b);
  const moving = workers.some((w) => (w.keyed?.moving.length ?? 0) > 0);
  return !moving && held.length === PARTITIONS && held.every((p, i) => p === i);
}

interface Answer {
  readonly worker: string;
  readonly count: number;
}

/**
 * One `tally.add` for `key`, as a gate sends it: on the key's partition subject, with
 * the key; sent again after a short back-off while nobody serves the partition.
 */
async function add(nc: NatsConnection, prefix: string, key: string): Promise<Answer> {
  const request = create(RpcRequestSchema, {
    route: "tally.add",
    key,
    session: create(SessionSchema, { gate: "g1", sid: 1n }),
  });
  const subject = `${prefix}.svc.tally.p${partitionOf(key, PARTITIONS)}.add`;
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    try {
      const reply = await nc.request(subject, toBinary(RpcRequestSchema, request), { timeout: DEADLINE_MS });
      const response = fromBinary(RpcResponseSchema, reply.data);
      assert.equal(response.code, Status.OK, response.message);
      const [worker = "", count = ""] = utf8.decode(response.body).split(" ");
      return { worker, count: Number(count) };
    } catch (error) {
      const noResponders = /no responders/i.test(`${String(error)} ${String((error as Error).cause)}`);
      if (!noResponders || Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
  }
}

/** Each key's answers, one request at a time per key, until `stop()`. */
function load(nc: NatsConnection, prefix: string): { answers: Map<string, Answer[]>; stop: () => Promise<void> } {
  const answers = new Map(KEYS.map((key) => [key, [] as Answer[]]));
  let stopping = false;
  const loops = KEYS.map(async (key) => {
    while (!stopping) answers.get(key)?.push(await add(nc, prefix, key));
  });
  const stop = async (): Promise<void> => {
    stopping = true;
    await Promise.all(loops);
  };
  return { answers, stop };
}

/** Waits until every key has `more` answers beyond what it had when called. */
async function progress(answers: Map<string, Answer[]>, more: number): Promise<void> {
  const from = new Map([...answers].map(([key, list]) => [key, list.length]));
  await until(`every key has ${more} more answers`, () =>
    [...answers].every(([key, list]) => list.length >= (from.get(key) ?? 0) + more),
  );
}

/** Every key counted 1, 2, 3, ... with no gap and no repeat: nothing lost or run twice. */
function assertCountsContinue(answers: Map<string, Answer[]>): void {
  for (const [key, list] of answers) {
    assert.deepEqual(
      list.map((a) => a.count),
      list.map((_, i) => i + 1),
      `${key}: ${list.map((a) => `${a.worker} ${a.count}`).join(", ")}`,
    );
  }
}

/** Who holds `key`'s partition. */
function holder(key: string, workers: Record<string, Worker>): string | undefined {
  const partition = partitionOf(key, PARTITIONS);
  return Object.entries(workers).find(([, w]) => heldBy(w).includes(partition))?.[0];
}

test("a key's requests reach the one worker holding its partition, with the key", async () => {
  const prefix = "k1";
  const listener = await bus.connect();
  const schemas: Uint8Array[] = [];
  listener.subscribe(`${prefix}.schema.svc.tally`, { callback: (_e, msg) => void schemas.push(msg.data) });
  await listener.flush();
  const [a, b] = await Promise.all([start(prefix, "a"), start(prefix, "b")]);
  assert.equal(a.worker.subject, `${prefix}.svc.tally.*`);
  await until("a and b hold every partition between them", () => settled(a.worker, b.worker));
  assert.equal(a.fresh() + b.fresh(), PARTITIONS, "each partition taken fresh once");
  // Owners by the rendezvous score: every worker computes the same.
  const [idA, idB] = [a.worker.keyed?.id ?? "", b.worker.keyed?.id ?? ""];
  assert.match(idA, /^[0-9a-f]{16}$/);
  const wonByA = Array.from({ length: PARTITIONS }, (_, p) => p).filter((p) => {
    const [sa, sb] = [score(idA, p), score(idB, p)];
    return sa > sb || (sa === sb && idA > idB);
  });
  assert.deepEqual(heldBy(a.worker), wonByA);

  const client = await bus.connect();
  for (let round = 1; round <= 3; round++) {
    for (const key of KEYS) {
      const answer = await add(client, prefix, key);
      assert.deepEqual(answer, { worker: holder(key, { a: a.worker, b: b.worker }), count: round }, key);
    }
  }
  // A gate that has not learnt yet that the service is keyed publishes on the service's
  // subject, without a key: 503, retry.
  const keyless = create(RpcRequestSchema, { route: "tally.add", session: create(SessionSchema, { gate: "g1" }) });
  const reply = await client.request(`${prefix}.svc.tally.add`, toBinary(RpcRequestSchema, keyless), {
    timeout: DEADLINE_MS,
  });
  const response = fromBinary(RpcResponseSchema, reply.data);
  assert.equal(response.code, Status.UNAVAILABLE);
  assert.equal(response.message, 'service "tally" is keyed and the request has no key: retry');
  // The schema announcement says keyed, with no typed method.
  await until("both announced", () => schemas.length >= 2);
  const schema = fromBinary(ServiceSchemaSchema, schemas[0] ?? new Uint8Array());
  assert.deepEqual([schema.service, schema.keyed?.partitions, schema.methods.length], ["tally", PARTITIONS, 0]);
  await Promise.all([a.worker.drain(), b.worker.drain()]);
});

test("a worker added under load takes a share, and the counts move with it", async () => {
  const prefix = "k2";
  const a = await start(prefix, "a");
  await until("a holds every partition", () => settled(a.worker));
  const traffic = load(await bus.connect(), prefix);
  await progress(traffic.answers, 3);
  const b = await start(prefix, "b");
  await until("b takes a share", () => heldBy(b.worker).length > 0 && settled(a.worker, b.worker));
  await progress(traffic.answers, 3);
  await traffic.stop();

  assertCountsContinue(traffic.answers);
  const moved = heldBy(b.worker).length;
  assert.ok(moved < PARTITIONS, "a keeps its own");
  assert.equal(b.fresh(), 0, "b takes nothing fresh: every partition was held");
  assert.deepEqual([b.worker.keyed?.stats.takenHanded, a.worker.keyed?.stats.handedOk], [moved, moved]);
  // After the move, each key is answered where its partition is.
  const workers = { a: a.worker, b: b.worker };
  for (const [key, list] of traffic.answers) assert.equal(list.at(-1)?.worker, holder(key, workers), key);
  await Promise.all([a.worker.drain(), b.worker.drain()]);
});

test("a stopped worker hands its partitions over with their state; the last one drains", async () => {
  const prefix = "k3";
  const [a, b] = await Promise.all([start(prefix, "a"), start(prefix, "b")]);
  await until("a and b hold every partition between them", () => settled(a.worker, b.worker));
  const heldByA = heldBy(a.worker).length;
  assert.ok(heldByA > 0 && heldByA < PARTITIONS);
  const traffic = load(await bus.connect(), prefix);
  await progress(traffic.answers, 3);
  await a.worker.drain();
  assert.deepEqual(a.worker.keyed?.held, []);
  assert.equal(a.worker.keyed?.leaving, true);
  assert.ok(settled(b.worker), "b holds everything once a has left");
  const since = new Map([...traffic.answers].map(([key, list]) => [key, list.length]));
  await progress(traffic.answers, 3);
  await traffic.stop();

  assertCountsContinue(traffic.answers);
  for (const [key, list] of traffic.answers) {
    assert.ok(list.slice(since.get(key)).every((answer) => answer.worker === "b"), key);
  }
  assert.deepEqual([a.worker.keyed?.stats.handedOk, b.worker.keyed?.stats.takenHanded], [heldByA, heldByA]);
  // The last worker has nobody to hand to: its partitions drain, and nobody serves them.
  await b.worker.drain();
  assert.deepEqual(b.worker.keyed?.held, []);
  const client = await bus.connect();
  await assert.rejects(
    client.request(`${prefix}.svc.tally.p0.add`, new Uint8Array(), { timeout: DEADLINE_MS }),
    /no responders/i,
  );
});

test("a refused hand-over keeps the partition here, with its state", async () => {
  const prefix = "k4";
  const a = await start(prefix, "a");
  await until("a holds every partition", () => settled(a.worker));
  const client = await bus.connect();
  for (const key of KEYS) assert.equal((await add(client, prefix, key)).count, 1);

  // A peer that wins some partitions but refuses every hand-over.
  const peer = await bus.connect();
  const fake = "fffffffffffffff0";
  const offered: HandOver[] = [];
  peer.subscribe(`${prefix}.keyed.tally.handover.${fake}`, {
    callback: (_e, msg) => {
      offered.push(fromBinary(HandOverSchema, msg.data));
      msg.respond(encoder.encode("no"));
    },
  });
  const say = (leaving: boolean): void => {
    const member = create(KeyedMemberSchema, { id: fake, leaving });
    peer.publish(`${prefix}.keyed.tally.members`, toBinary(KeyedMemberSchema, member));
  };
  await peer.flush();
  say(false);
  await until("a hand-over is refused", () => (a.worker.keyed?.stats.handedKept ?? 0) > 0);
  say(true); // the peer leaves: a keeps everything
  await until("a holds every partition again", () => settled(a.worker));

  const idA = a.worker.keyed?.id ?? "";
  const wonByFake = new Set(
    Array.from({ length: PARTITIONS }, (_, p) => p).filter((p) => score(fake, p) > score(idA, p)),
  );
  assert.ok(offered.length > 0);
  for (const handover of offered) {
    assert.equal(handover.from, idA);
    assert.ok(wonByFake.has(handover.partition), `offered ${handover.partition}, which a owns`);
    // The state offered is the partition's counts.
    const keys = KEYS.filter((key) => partitionOf(key, PARTITIONS) === handover.partition);
    const lines = utf8.decode(handover.state).split("\n").filter(Boolean).sort();
    assert.deepEqual(lines, keys.map((key) => `${key}=1`).sort());
  }
  // Kept with its state: every count continues on a.
  for (const key of KEYS) assert.deepEqual(await add(client, prefix, key), { worker: "a", count: 2 }, key);
  assert.equal(a.fresh(), PARTITIONS, "taken back with its state, not fresh");
  await a.worker.drain();
});

test("a dead worker's partitions are taken fresh after the member timeout", async () => {
  const prefix = "k5";
  const options = { keyedMemberTimeoutMs: 300 };
  const [a, b] = await Promise.all([start(prefix, "a", options), start(prefix, "b", options)]);
  await until("a and b hold every partition between them", () => settled(a.worker, b.worker));
  const lost = new Set(heldBy(b.worker));
  const client = await bus.connect();
  for (const key of KEYS) assert.equal((await add(client, prefix, key)).count, 1);
  // b's process dies: no leaving, no hand-over, its heartbeats just stop.
  await b.nc.close();
  await until("a holds every partition", () => settled(a.worker));
  assert.equal(a.fresh(), PARTITIONS, "a took b's partitions fresh");
  assert.ok(a.errors.some((e) => e.includes("counted dead")), a.errors.join("\n"));
  for (const key of KEYS) {
    const count = lost.has(partitionOf(key, PARTITIONS)) ? 1 : 2; // b's state died with it
    assert.deepEqual(await add(client, prefix, key), { worker: "a", count }, key);
  }
  await a.worker.drain();
});
