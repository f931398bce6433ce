// Standbys on a real nats-server (docs/workers.md, "Standbys"): the TypeScript tally
// (src/services/tally.ts, which gives snapshots) as an owner and as a standby. A worker
// in another process is SIGKILLed, and the one standing by takes its partitions with
// their counts; a standby that never answers costs one batch the replica timeout, then
// batches do not wait for it.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { NatsConnection } from "@nats-io/transport-node";
import { Service, Status, Worker, handoverSubject, membersSubject, partitionOf, replicaSubject, score } from "../src/index.js";
import { KeyedMemberSchema, ReplicaSchema, RpcRequestSchema, RpcResponseSchema } from "../src/gen/rpc_pb.js";
import type { Replica } from "../src/gen/rpc_pb.js";
import { TALLY_PARTITIONS, tallyService } from "../src/services/tally.js";
import type { TallyStats } from "../src/services/tally.js";
import { DEADLINE_MS, startBus, until, watchOutput } from "./bus.js";
import type { Bus } from "./bus.js";

const utf8 = new TextDecoder();
let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** A key of each partition. */
const KEYS = Array.from({ length: TALLY_PARTITIONS }, (_, partition) => {
  for (let n = 0; ; n++) if (partitionOf(`k${n}`, TALLY_PARTITIONS) === partition) return `k${n}`;
});

/** A tally answer: who counted, and the count. */
interface Answer {
  readonly worker: string;
  readonly count: number;
}

/** How long one `add` waits for its answer before it is sent again (see `add`). */
const ATTEMPT_MS = 2_000;

/**
 * One `tally.add` for `key`, as a gate sends it (on the key's partition subject, the
 * next `seq` of the key's own origin), sent again while nobody serves the partition,
 * and after [`ATTEMPT_MS`] without an answer: right after a SIGKILL, the server may
 * route a request to the dead worker's subscription before it has noticed the closed
 * connection, and that request is lost with it, as a gate's would be (the gate answers
 * 408 and the client asks again). Never applied, it is not counted: a request applied
 * twice would show in the count the caller checks.
 */
const sequences = new Map<string, bigint>();
async function add(nc: NatsConnection, prefix: string, key: string): Promise<Answer> {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const seq = (sequences.get(key) ?? 0n) + 1n;
    sequences.set(key, seq);
    const request = create(RpcRequestSchema, { route: "tally.add", key, origin: `${prefix}.gw.${key}`, seq });
    const subject = `${prefix}.part.tally.${partitionOf(key, TALLY_PARTITIONS)}.add`;
    try {
      const reply = await nc.request(subject, toBinary(RpcRequestSchema, request), { timeout: ATTEMPT_MS });
      const response = fromBinary(RpcResponseSchema, reply.data);
      assert.equal(response.code, Status.OK, response.message);
      const [worker = "", count = ""] = utf8.decode(response.body).split(" ");
      return { worker, count: Number(count) };
    } catch (error) {
      const text = `${String(error)} ${String((error as Error).cause)}`;
      const again = /no responders|timeout/i.test(text);
      if (!again || Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
  }
}

/** The owner of `partition` among `ids`: the highest score, ties to the greater id. */
function ownerOf(ids: readonly string[], partition: number): string {
  return ids.reduce((a, b) => {
    const [sa, sb] = [score(a, partition), score(b, partition)];
    return sa > sb || (sa === sb && a > b) ? a : b;
  });
}

/** The tally worker of `src/tally.ts` in its own process, answering as `name`. */
async function tallyProcess(prefix: string, name: string, args: string[]): Promise<{ child: ChildProcess; id: string }> {
  const script = fileURLToPath(new URL("../src/tally.js", import.meta.url));
  const flags = ["--nats", bus.url, "--prefix", prefix, "--name", name, ...args];
  const child = spawn(process.execPath, [script, ...flags], { stdio: ["ignore", "pipe", "inherit"] });
  const output = watchOutput(child, "Worker is ready");
  await output.ready;
  const id = /id=([0-9a-f]{16})/.exec(output.printed())?.[1] ?? "";
  assert.equal(id.length, 16, output.printed());
  return { child, id };
}

async function kill(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  const exited = child.exitCode === null && child.signalCode === null ? once(child, "exit") : Promise.resolve();
  child.kill(signal);
  await exited;
}

test("a SIGKILLed owner's partitions are taken by their standby, the counts going on", async () => {
  const prefix = "s1";
  const times = ["--keyed-heartbeat", "50ms", "--keyed-member-timeout", "500ms"];
  const stats: TallyStats = { fresh: 0, handed: 0 };
  const nc = await bus.connect();
  const a = await Worker.start(nc, tallyService("a", stats), {
    prefix,
    keyedHeartbeatMs: 50,
    keyedMemberTimeoutMs: 500,
  });
  const aId = a.keyed?.id ?? "";
  // A worker in another process that wins some partitions, and not all: with random
  // ids one may win none or all (1 time in 128), which leaves nothing to check.
  let b: { child: ChildProcess; id: string } | undefined;
  let bOwns: number[] = [];
  for (let attempt = 0; attempt < 10 && b === undefined; attempt++) {
    const started = await tallyProcess(prefix, "b", times);
    const owns = KEYS.map((_, p) => p).filter((p) => ownerOf([aId, started.id], p) === started.id);
    if (owns.length > 0 && owns.length < TALLY_PARTITIONS) [b, bOwns] = [started, owns];
    else await kill(started.child, "SIGTERM");
  }
  assert.ok(b !== undefined, "no worker split the partitions with a");
  try {
    await takenOverFromB(a, b.child, bOwns, prefix, stats);
  } finally {
    await kill(b.child, "SIGKILL");
    await a.drain();
  }
});

/** The partitions `bOwns` counted on `a` and `b`, then `b` SIGKILLed: `a` takes them, the counts going on. */
async function takenOverFromB(
  a: Worker,
  b: ChildProcess,
  bOwns: number[],
  prefix: string,
  stats: TallyStats,
): Promise<void> {
  const aOwns = KEYS.map((_, p) => p).filter((p) => !bOwns.includes(p));
  await until("a holds its own partitions, and stands by for b's", () => {
    const view = a.keyed;
    return view?.held.join() === aOwns.join() && view.standbyFor.join() === bOwns.join();
  });
  const client = await bus.connect();
  for (let round = 1; round <= 3; round++) {
    for (const key of KEYS) {
      const owner = bOwns.includes(partitionOf(key, TALLY_PARTITIONS)) ? "b" : "a";
      assert.deepEqual(await add(client, prefix, key), { worker: owner, count: round }, key);
    }
  }
  const freshBefore = stats.fresh;
  // b's process dies at once: no leaving, no hand-over, its heartbeats just stop.
  await kill(b, "SIGKILL");
  for (const key of KEYS) {
    assert.deepEqual(await add(client, prefix, key), { worker: "a", count: 4 }, `${key}: the count goes on`);
  }
  assert.equal(a.keyed?.held.length, TALLY_PARTITIONS);
  assert.equal(a.keyed?.stats.takenStandby, bOwns.length, "each of b's partitions taken with its replica");
  assert.equal(stats.fresh, freshBefore, "nothing taken fresh");
}

/**
 * A peer of another language that stands by and never answers (unless `answer`): alive
 * in its heartbeats, refusing every hand-over (so the worker keeps its partitions, and
 * the peer is every one's standby), taking replicas without a word.
 */
async function silentStandby(
  prefix: string,
  id: string,
  answer = false,
): Promise<{ replicas: Received[]; stop: () => void }> {
  const nc = await bus.connect();
  const replicas: Received[] = [];
  nc.subscribe(handoverSubject(prefix, "tally", id), { callback: (_e, msg) => void msg.respond(utf8Encode("no")) });
  nc.subscribe(replicaSubject(prefix, "tally", id), {
    callback: (_e, msg) => {
      replicas.push({ replica: fromBinary(ReplicaSchema, msg.data), at: performance.now() });
      if (answer) msg.respond(new Uint8Array());
    },
  });
  const heartbeat = toBinary(KeyedMemberSchema, create(KeyedMemberSchema, { id }));
  const say = (): void => nc.publish(membersSubject(prefix, "tally"), heartbeat);
  say();
  await nc.flush();
  const timer = setInterval(say, 100);
  return { replicas, stop: () => clearInterval(timer) };
}

/** A replica as the fake standby received it, and when. */
interface Received {
  readonly replica: Replica;
  readonly at: number;
}

function utf8Encode(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

test("a standby that never answers costs one batch the replica timeout, then batches do not wait", async () => {
  const prefix = "s2";
  const replicaTimeoutMs = 300;
  const heartbeatMs = 500; // the rest a failed standby gets
  const a = await Worker.start(await bus.connect(), tallyService("a"), {
    prefix,
    keyedHeartbeatMs: heartbeatMs,
    keyedMemberTimeoutMs: 2_000,
    replicaTimeoutMs,
  });
  await until("a holds every partition", () => a.keyed?.held.length === TALLY_PARTITIONS);
  assert.equal(a.keyed?.stats.unreplicated, TALLY_PARTITIONS, "alone: no standby");
  const standby = await silentStandby(prefix, "0123456789abcdef");
  try {
    await standbyRests(a, standby.replicas, prefix, replicaTimeoutMs);
  } finally {
    standby.stop();
    await a.drain();
  }
});

/** `a`'s batches wait for its silent standby once, then not while it rests, then it is sent all again. */
async function standbyRests(a: Worker, replicas: Received[], prefix: string, replicaTimeoutMs: number): Promise<void> {
  const failures = (): number => a.keyed?.stats.replicaFailures ?? 0;
  // The new standby is sent every partition whole, and does not answer.
  await until("the standby is sent the partitions", () => replicas.length === 1);
  await until("the replica fails", () => failures() === 1);
  const waited = performance.now() - (replicas[0]?.at ?? 0);
  assert.ok(waited >= replicaTimeoutMs - 20, `the batch waited ${waited} ms for its standby`);
  assert.deepEqual(
    replicas[0]?.replica.partitions.map((s) => s.partition),
    KEYS.map((_, p) => p),
  );
  // Resting, the standby is not waited for: each answer comes at once.
  const client = await bus.connect();
  for (const [n, key] of KEYS.slice(0, 4).entries()) {
    const asked = performance.now();
    assert.deepEqual(await add(client, prefix, key), { worker: "a", count: 1 });
    const took = performance.now() - asked;
    assert.ok(took < replicaTimeoutMs / 2, `answer ${n} waited ${took} ms`);
  }
  assert.equal(replicas.length, 1, "nothing sent to a resting standby");
  assert.equal(failures(), 1);
  assert.equal(a.keyed?.stats.unreplicated, TALLY_PARTITIONS);
  // After the rest, every partition it missed is sent whole again.
  await until("the standby is sent the partitions again", () => replicas.length === 2);
  assert.equal(replicas[1]?.replica.partitions.length, TALLY_PARTITIONS);
}

test("a silent peer is counted dead the moment its member timeout runs out, not at the next heartbeat", async () => {
  const prefix = "s3";
  const [heartbeatMs, memberTimeoutMs] = [800, 2_000];
  const a = await Worker.start(await bus.connect(), tallyService("a"), {
    prefix,
    keyedHeartbeatMs: heartbeatMs,
    keyedMemberTimeoutMs: memberTimeoutMs,
  });
  try {
    const peer = await bus.connect();
    const heartbeat = toBinary(KeyedMemberSchema, create(KeyedMemberSchema, { id: "0123456789abcdef" }));
    // The peer's last word comes right after one of a's heartbeats: its member timeout
    // then runs out half a heartbeat before a's third tick from there.
    let ticks = 0;
    const aId = a.keyed?.id ?? "";
    peer.subscribe(membersSubject(prefix, "tally"), {
      callback: (_e, msg) => {
        if (fromBinary(KeyedMemberSchema, msg.data).id === aId) ticks += 1;
      },
    });
    await peer.flush();
    await until("a ticks", () => ticks >= 1);
    peer.publish(membersSubject(prefix, "tally"), heartbeat);
    await peer.flush();
    const lastWord = performance.now();
    await until("a counts the peer dead", () => (a.keyed?.stats.peersDead ?? 0) === 1);
    const after = performance.now() - lastWord;
    assert.ok(after >= memberTimeoutMs, `counted dead ${after} ms after its last word`);
    assert.ok(after < memberTimeoutMs + heartbeatMs / 4, `counted dead ${after} ms after its last word`);
  } finally {
    await a.drain();
  }
});

test("an event that says ctx.changed(partition) sends that partition to its standby", async () => {
  const prefix = "s4";
  const bumps = new Map<number, number>();
  const service = new Service("tally")
    .keyed({ partitions: TALLY_PARTITIONS, snapshot: (partition) => `bumps=${bumps.get(partition) ?? 0}` })
    .rawMethod("add", () => "")
    // A tick of sorts: it changes a partition no request of it came on.
    .onEvent("bump", "all", (ctx, payload) => {
      const partition = Number(utf8.decode(payload));
      bumps.set(partition, (bumps.get(partition) ?? 0) + 1);
      ctx.changed(partition);
    });
  const a = await Worker.start(await bus.connect(), service, { prefix, keyedHeartbeatMs: 50, keyedMemberTimeoutMs: 500 });
  await until("a holds every partition", () => a.keyed?.held.length === TALLY_PARTITIONS);
  const standby = await silentStandby(prefix, "0123456789abcdef", true);
  try {
    await until("the standby holds every partition", () => standby.replicas.length === 1);
    const client = await bus.connect();
    client.publish(`${prefix}.bump`, "5");
    await until("the bumped partition reaches the standby", () => standby.replicas.length === 2);
    const [state] = standby.replicas[1]?.replica.partitions ?? [];
    assert.deepEqual([state?.partition, utf8.decode(state?.state)], [5, "bumps=1"]);
  } finally {
    standby.stop();
    await a.drain();
  }
});

test("the replica timeout must be positive: 0 is refused, 1 ms is taken", async () => {
  const nc = await bus.connect();
  await assert.rejects(
    Worker.start(nc, tallyService("a"), { prefix: "s5", replicaTimeoutMs: 0 }),
    /the replica timeout must be positive, not 0/,
  );
  const worker = await Worker.start(nc, tallyService("a"), { prefix: "s5", replicaTimeoutMs: 1 });
  await worker.drain();
});
