// What docs/workers.md ("Keyed services") promises a worker in any language about the
// keyed subjects and about leaving, on a real nats-server: a plain worker following
// "Serving requests" (`<prefix>.svc.<service>.>` in the queue group) never receives a
// keyed request, and a drained worker (TypeScript, or any whose last heartbeat says
// leaving with nothing held) is never counted dead by its peers; and, with standbys
// ("Standbys"), an owner sends a batch's state to the partition's standby as a
// `Replica` before the batch's answer leaves, and a standby refuses what it cannot keep.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { Msg } from "@nats-io/transport-node";
import {
  Service,
  Status,
  Worker,
  handoverSubject,
  membersSubject,
  partitionOf,
  partitionSubject,
  replicaSubject,
} from "../src/index.js";
import {
  KeyedMemberSchema,
  PartitionStateSchema,
  ReplicaSchema,
  RpcRequestSchema,
  RpcResponseSchema,
} from "../src/gen/rpc_pb.js";
import { tallyService } from "../src/services/tally.js";
import { startBus, until } from "./bus.js";
import type { Bus } from "./bus.js";

const PARTITIONS = 8;
/** Fast heartbeats and a short member timeout: a peer is forgotten in well under a second. */
const TIMES = { keyedHeartbeatMs: 50, keyedMemberTimeoutMs: 300 };

let bus: Bus;

before(async () => {
  bus = await startBus();
});
after(() => bus.stop());

/** A keyed worker of `tally` answering `add` with its name; `errors` what it told `onError`. */
async function start(prefix: string, name: string): Promise<{ worker: Worker; errors: string[] }> {
  const service = new Service("tally").keyed({ partitions: PARTITIONS }).rawMethod("add", () => name);
  const errors: string[] = [];
  const onError = (error: unknown, where: string): void => void errors.push(`${where}: ${String(error)}`);
  const worker = await Worker.start(await bus.connect(), service, { prefix, ...TIMES, onError });
  return { worker, errors };
}

const heldBy = (worker: Worker): number => worker.keyed?.held.length ?? 0;

/** A key of each partition. */
const keys = Array.from({ length: PARTITIONS }, (_, partition) => {
  for (let n = 0; ; n++) if (partitionOf(`k${n}`, PARTITIONS) === partition) return `k${n}`;
});

test("a plain worker's wildcard in the queue group receives no keyed request", async () => {
  const prefix = "c1";
  // A worker of another language, written from "Serving requests".
  const plain = await bus.connect();
  const caught: string[] = [];
  plain.subscribe(`${prefix}.svc.tally.>`, { queue: "tally", callback: (_e, msg) => void caught.push(msg.subject) });
  let barrier = false;
  plain.subscribe(`${prefix}.barrier`, { callback: () => void (barrier = true) });
  await plain.flush();
  const { worker } = await start(prefix, "owner");
  await until("the keyed worker holds every partition", () => heldBy(worker) === PARTITIONS);

  const client = await bus.connect();
  const answers: Msg[][] = keys.map(() => []);
  const inbox = `${prefix}.inbox`;
  client.subscribe(`${inbox}.>`, { callback: (_e, msg) => void answers[Number(msg.subject.split(".").at(-1))]?.push(msg) });
  keys.forEach((key, n) => {
    const request = create(RpcRequestSchema, { route: "tally.add", key, origin: `${prefix}.gw.g1.1`, seq: BigInt(n + 1) });
    const subject = `${partitionSubject(prefix, "tally", partitionOf(key, PARTITIONS))}.add`;
    client.publish(subject, toBinary(RpcRequestSchema, request), { reply: `${inbox}.${n}` });
  });
  await until("every request is answered", () => answers.every((list) => list.length > 0));
  // nats.js calls a connection's callbacks in the order it reads the messages: once the
  // barrier, published after every request, has reached the plain worker, a keyed
  // request it caught would have too.
  client.publish(`${prefix}.barrier`);
  await until("the barrier reaches the plain worker", () => barrier);
  assert.deepEqual(caught, [], "a plain worker's wildcard caught keyed requests");
  for (const list of answers) {
    assert.equal(list.length, 1, "answered once");
    const response = fromBinary(RpcResponseSchema, list[0]?.data ?? new Uint8Array());
    assert.equal(response.code, Status.OK, response.message);
  }
  await worker.drain();
});

test("a drained worker is never counted dead: its peers count it left", async () => {
  const prefix = "c2";
  const stays = await start(prefix, "stays");
  await until("the first worker holds every partition", () => heldBy(stays.worker) === PARTITIONS);
  const drained = await start(prefix, "drained");
  await until("the second takes a share", () => heldBy(drained.worker) > 0);
  await drained.worker.drain();
  const stats = (): { peersDead: number; peersLeft: number } =>
    stays.worker.keyed?.stats ?? { peersDead: 0, peersLeft: 0 };
  await until("the drained worker is forgotten", () => stats().peersDead + stats().peersLeft > 0);
  assert.deepEqual([stats().peersDead, stats().peersLeft], [0, 1]);
  assert.deepEqual(
    stays.errors.filter((e) => e.includes("counted dead")),
    [],
  );
  assert.equal(heldBy(stays.worker), PARTITIONS);
  await stays.worker.drain();
});

test("a peer whose last heartbeat leaves holding nothing is not counted dead", async () => {
  const prefix = "c3";
  const { worker, errors } = await start(prefix, "ts");
  // A worker of another language: heard, then its last word, then silence.
  const peer = await bus.connect();
  for (const leaving of [false, true]) {
    const member = create(KeyedMemberSchema, { id: "0123456789abcdef", leaving });
    peer.publish(membersSubject(prefix, "tally"), toBinary(KeyedMemberSchema, member));
  }
  await peer.flush();
  const stats = (): { peersDead: number; peersLeft: number } =>
    worker.keyed?.stats ?? { peersDead: 0, peersLeft: 0 };
  await until("the peer is forgotten", () => stats().peersDead + stats().peersLeft > 0);
  assert.deepEqual([stats().peersDead, stats().peersLeft], [0, 1]);
  assert.deepEqual(errors, []);
  await worker.drain();
});

/**
 * A standby of another language, written from "Standbys": alive in its heartbeats,
 * refusing hand-overs (so the owner keeps every partition, and it is every one's
 * standby), answering each replica empty once it has noted it in `events`.
 */
async function answeringStandby(prefix: string, id: string, events: string[]): Promise<{ stop: () => void }> {
  const nc = await bus.connect();
  nc.subscribe(handoverSubject(prefix, "tally", id), {
    callback: (_e, msg) => void msg.respond(new TextEncoder().encode("refused")),
  });
  nc.subscribe(replicaSubject(prefix, "tally", id), {
    callback: (_e, msg) => {
      const replica = fromBinary(ReplicaSchema, msg.data);
      for (const { partition, state } of replica.partitions) {
        events.push(`replica ${replica.from} ${replica.seq} ${partition} ${new TextDecoder().decode(state)}`);
      }
      msg.respond(new Uint8Array());
    },
  });
  const heartbeat = toBinary(KeyedMemberSchema, create(KeyedMemberSchema, { id }));
  const say = (): void => nc.publish(membersSubject(prefix, "tally"), heartbeat);
  say();
  await nc.flush();
  const timer = setInterval(say, TIMES.keyedHeartbeatMs);
  return { stop: () => clearInterval(timer) };
}

test("an owner's Replica holds the batch's state before the batch's answer leaves", async () => {
  const prefix = "c4";
  const owner = await Worker.start(await bus.connect(), tallyService("owner"), { prefix, ...TIMES });
  const ownerId = owner.keyed?.id ?? "";
  await until("the owner holds every partition", () => heldBy(owner) === PARTITIONS);
  const events: string[] = [];
  const standby = await answeringStandby(prefix, "0123456789abcdef", events);
  try {
    // A new standby gets every partition whole.
    await until("the standby holds every partition", () => events.length === PARTITIONS);
    const key = keys[3] ?? "";
    const partition = partitionOf(key, PARTITIONS);
    const client = await bus.connect();
    let answered = false;
    const inbox = `${prefix}.inbox.1`;
    client.subscribe(inbox, {
      callback: (_e, msg) => {
        const response = fromBinary(RpcResponseSchema, msg.data);
        events.push(`answer ${response.code} ${new TextDecoder().decode(response.body)}`);
        answered = true;
      },
    });
    const request = create(RpcRequestSchema, { route: "tally.add", key, origin: `${prefix}.gw.g1.1`, seq: 1n });
    const subject = `${partitionSubject(prefix, "tally", partition)}.add`;
    client.publish(subject, toBinary(RpcRequestSchema, request), { reply: inbox });
    await until("the add is answered", () => answered);
    const last = events.slice(PARTITIONS);
    assert.deepEqual(last.at(-1), "answer 200 owner 1");
    const replicated = last.slice(0, -1);
    assert.equal(replicated.length, 1, `one replica before the answer: ${replicated.join(" | ")}`);
    const [, from, seq, replicaPartition, ...state] = (replicated[0] ?? "").split(" ");
    assert.deepEqual([from, replicaPartition, state.join(" ")], [ownerId, String(partition), `${key}=1\n`]);
    assert.ok(BigInt(seq ?? "0") > BigInt(events[0]?.split(" ")[2] ?? "0"), "its seq rises");
  } finally {
    standby.stop();
    await owner.drain();
  }
});

test("a standby refuses a replica of a partition out of range, and one that does not decode", async () => {
  const prefix = "c5";
  const worker = await Worker.start(await bus.connect(), tallyService("ts"), { prefix, ...TIMES });
  const id = worker.keyed?.id ?? "";
  const client = await bus.connect();
  const ask = async (payload: Uint8Array): Promise<string> => {
    const answer = await client.request(replicaSubject(prefix, "tally", id), payload, { timeout: 2_000 });
    return new TextDecoder().decode(answer.data);
  };
  const state = (partition: number) => create(PartitionStateSchema, { partition, state: new Uint8Array([1]) });
  const replica = (partitions: number[]) =>
    toBinary(ReplicaSchema, create(ReplicaSchema, { from: "fedcba9876543210", seq: 1n, partitions: partitions.map(state) }));
  assert.match(await ask(replica([1, PARTITIONS])), /partition 8 out of range/);
  assert.match(await ask(new Uint8Array([0xff, 0xff, 0xff])), /does not decode/);
  assert.deepEqual(worker.keyed?.standbyFor, [], "nothing of a refused replica is kept");
  assert.equal(await ask(replica([1])), "", "a replica in range is held: answered empty");
  await worker.drain();
});
