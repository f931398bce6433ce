// Keyed services on a real nats-server: TypeScript workers of a per-key counter, with a
// bare NATS client in the gate's place publishing each request on its key's partition
// subject (the partition from the library's own FNV-1a), numbered per origin as a gate
// numbers a session's (`origin`, `seq`), and sending it again, as a gate does, while
// nobody serves the partition (no responders).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { MessageInitShape } from "@bufbuild/protobuf";
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
import { DEADLINE_MS, startBus, until, watchOutput } from "./bus.js";
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

/** The last `seq` of each origin: a gate numbers each session's keyed requests. */
const sequences = new Map<string, bigint>();

/** The next place in `origin`'s stream. */
function next(origin: string): { origin: string; seq: bigint } {
  const seq = (sequences.get(origin) ?? 0n) + 1n;
  sequences.set(origin, seq);
  return { origin, seq };
}

/** A gate's `tally.add` request for `key`, at its place in an origin's stream (or with none). */
function addRequest(key: string, order: { origin: string; seq: bigint } | undefined): Uint8Array {
  const session = create(SessionSchema, { gate: "g1", sid: 1n });
  return toBinary(RpcRequestSchema, create(RpcRequestSchema, { route: "tally.add", key, session, ...order }));
}

const addSubject = (prefix: string, key: string): string =>
  `${prefix}.part.tally.${partitionOf(key, PARTITIONS)}.add`;

/** A tally answer: who counted, and the count. */
function answerOf(data: Uint8Array): Answer {
  const response = fromBinary(RpcResponseSchema, data);
  assert.equal(response.code, Status.OK, response.message);
  const [worker = "", count = ""] = utf8.decode(response.body).split(" ");
  return { worker, count: Number(count) };
}

/**
 * One `tally.add` for `key`, as a gate sends it: on the key's partition subject, with
 * the key, from one session per key; sent again after a short back-off while nobody
 * serves the partition.
 */
async function add(nc: NatsConnection, prefix: string, key: string): Promise<Answer> {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    try {
      const request = addRequest(key, next(`${prefix}.gw.g1.${key}`));
      const reply = await nc.request(addSubject(prefix, key), request, { timeout: DEADLINE_MS });
      return answerOf(reply.data);
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
    client.request(`${prefix}.part.tally.0.add`, new Uint8Array(), { timeout: DEADLINE_MS }),
    /no responders/i,
  );
});

/**
 * A peer in a's place that wins some partitions and answers each hand-over request with
 * `answer` (`undefined`: never answers), recording what it was offered.
 */
async function fakeNewOwner(
  prefix: string,
  answer: (handover: HandOver) => string | undefined,
): Promise<{ id: string; offered: HandOver[]; say: (leaving: boolean) => void }> {
  const peer = await bus.connect();
  const id = "fffffffffffffff0";
  const offered: HandOver[] = [];
  peer.subscribe(`${prefix}.keyed.tally.handover.${id}`, {
    callback: (_e, msg) => {
      const handover = fromBinary(HandOverSchema, msg.data);
      offered.push(handover);
      const text = answer(handover);
      if (text !== undefined) msg.respond(encoder.encode(text));
    },
  });
  const say = (leaving: boolean): void => {
    const member = create(KeyedMemberSchema, { id, leaving });
    peer.publish(`${prefix}.keyed.tally.members`, toBinary(KeyedMemberSchema, member));
  };
  await peer.flush();
  return { id, offered, say };
}

/** The partitions `fake` wins over `worker`. */
function wonBy(fake: string, worker: Worker): Set<number> {
  const id = worker.keyed?.id ?? "";
  return new Set(Array.from({ length: PARTITIONS }, (_, p) => p).filter((p) => score(fake, p) > score(id, p)));
}

test("a refused prepare changes nothing: the partition stays here, and is offered again later", async () => {
  const prefix = "k4";
  const a = await start(prefix, "a");
  await until("a holds every partition", () => settled(a.worker));
  const client = await bus.connect();
  for (const key of KEYS) assert.equal((await add(client, prefix, key)).count, 1);

  const fake = await fakeNewOwner(prefix, () => "no");
  fake.say(false);
  await until("prepares are refused", () => (a.worker.keyed?.stats.handedKept ?? 0) > 1);
  fake.say(true); // the peer leaves: a keeps everything
  await until("a holds every partition again", () => settled(a.worker));

  const wonByFake = wonBy(fake.id, a.worker);
  assert.ok(fake.offered.length > 1);
  for (const handover of fake.offered) {
    assert.equal(handover.from, a.worker.keyed?.id);
    assert.ok(wonByFake.has(handover.partition), `offered ${handover.partition}, which a owns`);
    // A prepare, refused: the partition never left, so no state went.
    assert.deepEqual([handover.prepare, handover.state.length, Object.keys(handover.seen)], [true, 0, []]);
  }
  // Every count continues on a, which never let a partition go.
  for (const key of KEYS) assert.deepEqual(await add(client, prefix, key), { worker: "a", count: 2 }, key);
  assert.deepEqual([a.fresh(), a.worker.keyed?.stats.takenHanded], [PARTITIONS, 0]);
  await a.worker.drain();
});

test("a state its new owner never answers is taken back once that one is dead, with its counts", async () => {
  const prefix = "k6";
  const a = await start(prefix, "a", { handoverTimeoutMs: 200, handoverOverlapMs: 0 });
  await until("a holds every partition", () => settled(a.worker));
  const client = await bus.connect();
  for (const key of KEYS) assert.equal((await add(client, prefix, key)).count, 1);

  // Prepares, then never answers the state; heard once, so counted dead after the
  // member timeout.
  const fake = await fakeNewOwner(prefix, (handover) => (handover.prepare ? "" : undefined));
  fake.say(false);
  await until("a takes a partition back", () => (a.worker.keyed?.stats.takenHanded ?? 0) > 0);
  assert.ok(a.errors.some((e) => e.includes("counted dead")), a.errors.join("\n"));
  fake.say(true);
  await until("a holds every partition again", () => settled(a.worker));

  const states = fake.offered.filter((handover) => !handover.prepare);
  assert.ok(states.length > 0);
  for (const handover of states) {
    // Sent again, the same hand-over each time: the id of its prepare.
    const prepares = fake.offered.filter((h) => h.prepare && h.partition === handover.partition);
    assert.deepEqual(
      prepares.map((h) => h.id),
      [handover.id],
    );
    // The partition's counts, and nothing seen: no request came meanwhile.
    const keys = KEYS.filter((key) => partitionOf(key, PARTITIONS) === handover.partition);
    const lines = utf8.decode(handover.state).split("\n").filter(Boolean).sort();
    assert.deepEqual(lines, keys.map((key) => `${key}=1`).sort());
    assert.deepEqual(handover.seen, {});
  }
  for (const key of KEYS) assert.deepEqual(await add(client, prefix, key), { worker: "a", count: 2 }, key);
  assert.equal(a.worker.keyed?.stats.handedOk, 0);
  await a.worker.drain();
});

test("a state answered late is sent again, never taken back while its new owner lives", async () => {
  const prefix = "k13";
  const a = await start(prefix, "a", { handoverTimeoutMs: 200, handoverOverlapMs: 0 });
  await until("a holds every partition", () => settled(a.worker));
  const client = await bus.connect();
  for (const key of KEYS) assert.equal((await add(client, prefix, key)).count, 1);

  // Takes every state, but answers each partition's first one too late (never).
  const answered = new Set<number>();
  const fake = await fakeNewOwner(prefix, (handover) => {
    if (handover.prepare || answered.has(handover.partition)) return "";
    answered.add(handover.partition);
    return undefined;
  });
  fake.say(false);
  const alive = setInterval(() => fake.say(false), TIMES.keyedHeartbeatMs).unref();
  const wonByFake = wonBy(fake.id, a.worker);
  await until("a hands the fake's partitions over", () => a.worker.keyed?.stats.handedOk === wonByFake.size);

  assert.equal(a.worker.keyed?.stats.takenHanded, 0, "nothing taken back");
  for (const partition of wonByFake) {
    const offered = fake.offered.filter((handover) => handover.partition === partition);
    // A prepare, then its state twice, the same: no hand-over begun again in between.
    assert.deepEqual(
      offered.map((h) => h.prepare),
      [true, false, false],
    );
    const [prepare, first, again] = offered;
    assert.ok(prepare && first && again && prepare.id > 0n);
    assert.equal(first.id, prepare.id);
    assert.deepEqual(again, first);
    assert.ok(!heldBy(a.worker).includes(partition));
  }
  // a serves none of the partitions it handed over: nobody does (the new owner is made
  // up). Asked while that one still lives: once it leaves, a owns them again and takes
  // them fresh.
  const key = KEYS.find((k) => wonByFake.has(partitionOf(k, PARTITIONS))) ?? "";
  await assert.rejects(
    client.request(addSubject(prefix, key), addRequest(key, undefined), { timeout: DEADLINE_MS }),
    /no responders/i,
  );
  clearInterval(alive);
  fake.say(true);
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

/**
 * Requests for every key, published without waiting for their answers, as a gate
 * forwards its sessions' (each key its own origin), until `stop()`; their answers by
 * key and seq.
 */
function stream(nc: NatsConnection, prefix: string): {
  received: () => number;
  stop: () => Promise<Map<string, Map<bigint, Uint8Array[]>>>;
} {
  const inbox = `${prefix}.inbox`;
  const answers = new Map(KEYS.map((key) => [key, new Map<bigint, Uint8Array[]>()]));
  let [published, received] = [0, 0];
  nc.subscribe(`${inbox}.>`, {
    callback: (_e, msg) => {
      const [key = "", seq = ""] = msg.subject.slice(inbox.length + 1).split(".");
      const bySeq = answers.get(key);
      bySeq?.set(BigInt(seq), [...(bySeq.get(BigInt(seq)) ?? []), msg.data]);
      received += 1;
    },
  });
  let stopping = false;
  const publishing = (async () => {
    while (!stopping) {
      for (const key of KEYS) {
        const order = next(`${prefix}.gw.g2.${key}`);
        nc.publish(addSubject(prefix, key), addRequest(key, order), { reply: `${inbox}.${key}.${order.seq}` });
        published += 1;
      }
      await new Promise((resolve) => setTimeout(resolve, 2)); // a pace, not a wait for anything
    }
  })();
  const stop = async (): Promise<Map<string, Map<bigint, Uint8Array[]>>> => {
    stopping = true;
    await publishing;
    await until("every request is answered", () => received >= published);
    await nc.flush(); // an answer twice would be here by now
    return answers;
  };
  return { received: () => received, stop };
}

test("hand-overs under pipelined requests: each answered once, each origin's in order", async () => {
  const prefix = "k7";
  // Room for every request held during a move: none is answered 503.
  const options = { queueCapacity: 1 << 16 };
  const a = await start(prefix, "a", options);
  await until("a holds every partition", () => settled(a.worker));
  const traffic = stream(await bus.connect(), prefix);
  const more = async (n: number): Promise<void> => {
    const from = traffic.received();
    await until(`${n} more answers`, () => traffic.received() >= from + n);
  };
  await more(500);
  const b = await start(prefix, "b", options);
  await until("b takes a share", () => heldBy(b.worker).length > 0 && settled(a.worker, b.worker));
  await more(500);
  await a.worker.drain(); // a hands the rest to b
  await more(500);
  const answers = await traffic.stop();

  for (const [key, bySeq] of answers) {
    const seqs = [...bySeq.keys()].sort((x, y) => (x < y ? -1 : 1));
    assert.deepEqual(seqs, seqs.map((_, i) => BigInt(i + 1)), `${key}: every request answered`);
    for (const [seq, replies] of bySeq) {
      assert.equal(replies.length, 1, `${key} #${seq}: answered once`);
      // The count is the request's place among its key's: each origin's handled in order.
      assert.equal(answerOf(replies[0] ?? new Uint8Array()).count, Number(seq), `${key} #${seq}`);
    }
  }
  assert.deepEqual([b.fresh(), b.worker.keyed?.stats.takenHanded], [0, PARTITIONS]);
  await b.worker.drain();
});

/**
 * A peer in an old owner's place: it says it holds every partition (so the worker takes
 * none fresh), and sends hand-over requests and requests on one connection, so the
 * worker receives them in the order sent.
 */
async function fakeOldOwner(prefix: string): Promise<{
  id: string;
  nc: NatsConnection;
  handOver: (to: string, handover: MessageInitShape<typeof HandOverSchema>) => Promise<string>;
  die: () => void;
  leave: () => void;
}> {
  const nc = await bus.connect();
  const id = "fffffffffffffff1";
  const all = Array.from({ length: PARTITIONS }, (_, p) => p);
  const say = (leaving: boolean): void => {
    const member = create(KeyedMemberSchema, { id, held: all, leaving });
    nc.publish(`${prefix}.keyed.tally.members`, toBinary(KeyedMemberSchema, member));
  };
  say(false);
  // Unref'd: a failed test's process still ends.
  const heartbeat = setInterval(() => say(false), TIMES.keyedHeartbeatMs).unref();
  await nc.flush();
  return {
    id,
    nc,
    async handOver(to, handover) {
      const payload = toBinary(HandOverSchema, create(HandOverSchema, { from: id, ...handover }));
      const answer = await nc.request(`${prefix}.keyed.tally.handover.${to}`, payload, { timeout: DEADLINE_MS });
      return utf8.decode(answer.data);
    },
    die: () => clearInterval(heartbeat),
    leave: () => {
      clearInterval(heartbeat);
      say(true);
    },
  };
}

/** A partition `worker` wins over peer `other`, and a key of it. */
function wonPartition(worker: Worker, other: string): { partition: number; key: string } {
  const id = worker.keyed?.id ?? "";
  const partition = Array.from({ length: PARTITIONS }, (_, p) => p).find((p) => score(id, p) > score(other, p)) ?? 0;
  const key = Array.from({ length: 1000 }, (_, n) => `key-${n}`).find((k) => partitionOf(k, PARTITIONS) === partition);
  return { partition, key: key ?? "" };
}

/**
 * Publishes `tally.add` requests for `key` from `nc`, labelled `<origin>-<seq>` (no
 * origin: `none`); the answers' `<label> <count>`, in the order they arrive.
 */
function publishLabelled(
  nc: NatsConnection,
  prefix: string,
  key: string,
  requests: readonly [origin: string, seq: number][],
): string[] {
  const inbox = `${prefix}.inbox.${key}`;
  const answers: string[] = [];
  nc.subscribe(`${inbox}.*`, {
    callback: (_e, msg) => void answers.push(`${msg.subject.slice(inbox.length + 1)} ${answerOf(msg.data).count}`),
  });
  for (const [origin, seq] of requests) {
    const order = origin === "" ? undefined : { origin, seq: BigInt(seq) };
    const label = origin === "" ? "none" : `${origin}-${seq}`;
    nc.publish(addSubject(prefix, key), addRequest(key, order), { reply: `${inbox}.${label}` });
  }
  return answers;
}

test("the new owner drops the held requests its old owner took (seen), and serves the rest in order", async () => {
  const prefix = "k8";
  const old = await fakeOldOwner(prefix);
  const b = await start(prefix, "b");
  const idB = b.worker.keyed?.id ?? "";
  const { partition, key } = wonPartition(b.worker, old.id);
  assert.equal(await old.handOver(idB, { partition, prepare: true }), "");
  assert.deepEqual(b.worker.keyed?.preparing, [partition]);
  assert.notEqual(await old.handOver(idB, { partition, prepare: true }), "", "a partition prepared already: refused");

  const answers = publishLabelled(old.nc, prefix, key, [
    ["o1", 1],
    ["o2", 1],
    ["o1", 2],
    ["", 0],
    ["o1", 3],
    ["o2", 2],
    ["o1", 4],
    ["o1", 5],
  ]);
  // The old owner took o1 up to 3: the new owner holds them too, and drops them.
  const state = encoder.encode(`${key}=10\n`);
  assert.equal(await old.handOver(idB, { partition, state, seen: { o1: 3n } }), "");
  assert.deepEqual([b.worker.keyed?.held, b.worker.keyed?.preparing], [[partition], []]);
  // Answered after everything queued before it: the held requests' answers are in.
  assert.equal((await add(old.nc, prefix, key)).count, 16);
  assert.deepEqual(answers, ["o2-1 11", "none 12", "o2-2 13", "o1-4 14", "o1-5 15"]);
  assert.deepEqual([b.fresh(), b.worker.keyed?.stats.takenHanded], [0, 1]);
  old.leave();
  await b.worker.drain();
});

test("a state sent again (its answer lost or late) is taken once: the count goes on", async () => {
  const prefix = "k14";
  const old = await fakeOldOwner(prefix);
  const b = await start(prefix, "b");
  const idB = b.worker.keyed?.id ?? "";
  const { partition, key } = wonPartition(b.worker, old.id);
  assert.equal(await old.handOver(idB, { partition, prepare: true, id: 7n }), "");
  const state = { partition, state: encoder.encode(`${key}=10\n`), id: 7n };
  assert.equal(await old.handOver(idB, state), "");
  assert.deepEqual(await add(old.nc, prefix, key), { worker: "b", count: 11 });
  assert.equal(await old.handOver(idB, state), "", "taken already");
  assert.deepEqual(await add(old.nc, prefix, key), { worker: "b", count: 12 }, "not replaced by the state again");
  assert.deepEqual([b.worker.keyed?.stats.takenHanded, b.worker.keyed?.stats.conflicts], [1, 0]);
  old.leave();
  await b.worker.drain();
});

test("a prepare for a partition held already (two views disagreed) is taken as it is; the state settles it", async () => {
  const prefix = "k12";
  const b = await start(prefix, "b");
  await until("b holds every partition", () => settled(b.worker));
  const old = await fakeOldOwner(prefix);
  const idB = b.worker.keyed?.id ?? "";
  const { partition, key } = wonPartition(b.worker, old.id);
  assert.equal(await old.handOver(idB, { partition, prepare: true }), "", "held: not refused");
  assert.deepEqual(b.worker.keyed?.preparing, []);
  const state = encoder.encode(`${key}=10\n`);
  assert.equal(await old.handOver(idB, { partition, state }), "");
  // The count handed over replaces b's own and goes on.
  assert.deepEqual(await add(old.nc, prefix, key), { worker: "b", count: 11 });
  old.leave();
  await b.worker.drain();
});

test("a prepared partition holds at most the buffer, and is let go when its state does not come", async () => {
  const prefix = "k9";
  const old = await fakeOldOwner(prefix);
  const b = await start(prefix, "b", { handoverBuffer: 2, handoverOverlapMs: 0, handoverTimeoutMs: 500 });
  const idB = b.worker.keyed?.id ?? "";
  const { partition, key } = wonPartition(b.worker, old.id);
  assert.equal(await old.handOver(idB, { partition, prepare: true }), "");
  const answers = publishLabelled(old.nc, prefix, key, [["o1", 1], ["o1", 2], ["o1", 3]]);
  await until("the third is dropped", () => b.worker.keyed?.stats.handoverOverflow === 1);
  assert.ok(b.errors.some((e) => e.includes(`partition ${partition}: 2 requests held`)), b.errors.join("\n"));
  // No state within the overlap, twice the hand-over timeout and the member timeout:
  // let go, nothing served.
  await until("b lets the partition go", () => b.worker.keyed?.preparing.length === 0);
  assert.ok(b.errors.some((e) => e.includes(`partition ${partition} was prepared`)), b.errors.join("\n"));
  // b's UNSUB at the server before the request, or the server may still route it to b,
  // whose client drops it (a timeout, not no responders).
  await b.nc.flush();
  await assert.rejects(
    old.nc.request(addSubject(prefix, key), addRequest(key, undefined), { timeout: DEADLINE_MS }),
    /no responders/i,
  );
  assert.deepEqual([answers, b.worker.keyed?.held], [[], []]);
  old.leave();
  await b.worker.drain();
});

test("a partition taken fresh while prepared (its old owner died) serves everything held, in order", async () => {
  const prefix = "k10";
  const old = await fakeOldOwner(prefix);
  const b = await start(prefix, "b", { keyedMemberTimeoutMs: 300 });
  const idB = b.worker.keyed?.id ?? "";
  const { partition, key } = wonPartition(b.worker, old.id);
  assert.equal(await old.handOver(idB, { partition, prepare: true }), "");
  const answers = publishLabelled(old.nc, prefix, key, [["o1", 1], ["", 0], ["o1", 2]]);
  await old.nc.flush();
  old.die();
  await until("b holds every partition", () => settled(b.worker));
  assert.equal((await add(old.nc, prefix, key)).count, 4);
  assert.deepEqual(answers, ["o1-1 1", "none 2", "o1-2 3"]);
  assert.deepEqual([b.fresh(), b.worker.keyed?.stats.takenHanded], [PARTITIONS, 0]);
  await b.worker.drain();
});

/**
 * A peer in another process: `id`'s heartbeat (alive, holding nothing) published every
 * 50 ms from its own connection, so it reaches this process's sockets even while this
 * process's event loop is blocked. Resolves once the first one is on the server.
 */
async function peerInAnotherProcess(prefix: string, id: string): Promise<{ stop: () => void }> {
  const heartbeat = toBinary(KeyedMemberSchema, create(KeyedMemberSchema, { id }));
  const script = `
    import { connect } from "@nats-io/transport-node";
    const [url, subject, payload] = process.argv.slice(1);
    const nc = await connect({ servers: url });
    const data = Buffer.from(payload, "base64");
    const say = () => nc.publish(subject, data);
    say();
    await nc.flush();
    setInterval(say, 50);
    console.log("ready");
  `;
  const args = ["--input-type=module", "-e", script, bus.url, `${prefix}.keyed.tally.members`];
  const child = spawn(process.execPath, [...args, Buffer.from(heartbeat).toString("base64")], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await watchOutput(child, "ready").ready;
  return { stop: () => child.kill() };
}

test("a handler blocking the loop past the member timeout counts no peer dead that heartbeat meanwhile", async () => {
  const prefix = "k10";
  const memberTimeoutMs = 300;
  const a = await start(prefix, "a", { keyedMemberTimeoutMs: memberTimeoutMs });
  await until("a holds every partition", () => settled(a.worker));
  const peer = await peerInAnotherProcess(prefix, "fffffffffffffff2");
  try {
    // a has heard the peer once it offers it the partitions the peer wins.
    await until("a offers the peer its partitions", () => (a.worker.keyed?.moving.length ?? 0) > 0);
    // A handler's work, three member timeouts long, holding this process's event loop:
    // meanwhile the peer's heartbeats reach a's socket, unread.
    const end = performance.now() + 3 * memberTimeoutMs;
    while (performance.now() < end) {
      // busy
    }
    // The overdue tick fires as the block ends, and its review runs in that same turn of
    // the loop, before anything awaited here completes; two more of a's heartbeats seen
    // here make sure ticks have gone on since.
    const watcher = await bus.connect();
    let said = 0;
    const id = a.worker.keyed?.id ?? "";
    watcher.subscribe(`${prefix}.keyed.tally.members`, {
      callback: (_e, msg) => {
        if (fromBinary(KeyedMemberSchema, msg.data).id === id) said += 1;
      },
    });
    await until("a has ticked twice more", () => said >= 2);
    const dead = a.errors.filter((e) => e.includes("counted dead"));
    assert.deepEqual(dead, [], "a live peer was counted dead for the worker's own block");
  } finally {
    peer.stop();
  }
  await a.worker.drain();
});
