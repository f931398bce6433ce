#!/usr/bin/env node
/**
 * The tally service (`services/tally.ts`: a keyed per-key counter) as a worker process,
 * written with `@shaddock/worker`; it serves beside the Rust tally of
 * `tests/mixed_keyed.rs`, partitions moving between them with their counts:
 *
 *     node dist/tally.js --nats nats://127.0.0.1:4222 [--prefix shaddock] [--name ts]
 *         [--queue 1024] [--keyed-heartbeat 500ms] [--keyed-member-timeout 2s]
 *         [--handover-timeout 2s] [--handover-overlap 200ms] [--handover-buffer 4096]
 *         [--standby true] [--replica-timeout 100ms] [--drain-grace 10s]
 *
 * Prints `Worker is ready: ... id=<its keyed id>` once it is subscribed and has said its
 * first heartbeat (its partitions follow: handed over by their holders, or taken fresh
 * after two heartbeats). On SIGTERM or SIGINT it hands its partitions to the other
 * workers with their counts, drains, prints `Worker stopped: served=N rejected=M fresh=F
 * handed=H standby=S handed_ok=O handed_kept=K`, and exits 0 (or 1, saying what it could not
 * deliver, when the drain has not ended within its grace).
 */
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { durationMs } from "./duration.js";
import {
  DEFAULT_HANDOVER_BUFFER,
  DEFAULT_HANDOVER_OVERLAP_MS,
  DEFAULT_HANDOVER_TIMEOUT_MS,
  DEFAULT_KEYED_HEARTBEAT_MS,
  DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
  DEFAULT_REPLICA_TIMEOUT_MS,
  checkKeyedTimes,
} from "./keyed-settings.js";
import { TALLY, TALLY_PARTITIONS, tallyService } from "./services/tally.js";
import type { TallyStats } from "./services/tally.js";
import { DRAIN_GRACE_OPTION, DRAIN_GRACE_USAGE, drainGraceMs, runMain, serveUntilSignalled } from "./process.js";
import { DEFAULT_PREFIX, isValidName } from "./subjects.js";
import { DEFAULT_QUEUE_CAPACITY, Worker } from "./worker.js";

const USAGE = `usage: tally [--nats URL[,URL...]] [--prefix PREFIX] [--name NAME] [--queue N]
             [--keyed-heartbeat D] [--keyed-member-timeout D] [--handover-timeout D]
             [--handover-overlap D] [--handover-buffer N] [--standby BOOL]
             [--replica-timeout D] [--drain-grace D]

  --nats                  NATS server URLs, comma-separated
                          (env SHADDOCK_NATS; nats://127.0.0.1:4222)
  --prefix                subject prefix shared with the gates (env SHADDOCK_PREFIX; ${DEFAULT_PREFIX})
  --name                  this worker's name in its answers, "<name> <count>" (ts)
  --queue                 requests queued before answering 503 (${DEFAULT_QUEUE_CAPACITY})
  --keyed-heartbeat       how often it tells its peers what it holds
                          (env SHADDOCK_KEYED_HEARTBEAT; ${DEFAULT_KEYED_HEARTBEAT_MS}ms)
  --keyed-member-timeout  a peer unheard this long is dead
                          (env SHADDOCK_KEYED_MEMBER_TIMEOUT; ${DEFAULT_KEYED_MEMBER_TIMEOUT_MS}ms)
  --handover-timeout      how long a hand-over waits for each answer of the new owner
                          (env SHADDOCK_HANDOVER_TIMEOUT; ${DEFAULT_HANDOVER_TIMEOUT_MS}ms)
  --handover-overlap      how long the old owner serves a partition the new one has subscribed
                          (env SHADDOCK_HANDOVER_OVERLAP; ${DEFAULT_HANDOVER_OVERLAP_MS}ms)
  --handover-buffer       requests a new owner holds per partition until its state comes
                          (env SHADDOCK_HANDOVER_BUFFER; ${DEFAULT_HANDOVER_BUFFER})
  --standby               whether each partition's next worker holds its counts, and takes
                          them when this worker dies (env SHADDOCK_STANDBY; true)
  --replica-timeout       how long a batch's answers wait for its standbys
                          (env SHADDOCK_REPLICA_TIMEOUT; ${DEFAULT_REPLICA_TIMEOUT_MS}ms)
  --drain-grace           ${DRAIN_GRACE_USAGE}

Durations as the Rust workers write them: a number and a unit, e.g. 100ms, 1.5s, 1m30s.
Service "${TALLY}", keyed over ${TALLY_PARTITIONS} partitions; method "add" (raw) answers "<name> <count>".`;

async function main(): Promise<void> {
  const env = (name: string, fallback: string): string => process.env[name] ?? fallback;
  const { values } = parseArgs({
    options: {
      nats: { type: "string", default: env("SHADDOCK_NATS", "nats://127.0.0.1:4222") },
      prefix: { type: "string", default: env("SHADDOCK_PREFIX", DEFAULT_PREFIX) },
      name: { type: "string", default: "ts" },
      queue: { type: "string", default: String(DEFAULT_QUEUE_CAPACITY) },
      "keyed-heartbeat": {
        type: "string",
        default: env("SHADDOCK_KEYED_HEARTBEAT", `${DEFAULT_KEYED_HEARTBEAT_MS}ms`),
      },
      "keyed-member-timeout": {
        type: "string",
        default: env("SHADDOCK_KEYED_MEMBER_TIMEOUT", `${DEFAULT_KEYED_MEMBER_TIMEOUT_MS}ms`),
      },
      "handover-timeout": {
        type: "string",
        default: env("SHADDOCK_HANDOVER_TIMEOUT", `${DEFAULT_HANDOVER_TIMEOUT_MS}ms`),
      },
      "handover-overlap": {
        type: "string",
        default: env("SHADDOCK_HANDOVER_OVERLAP", `${DEFAULT_HANDOVER_OVERLAP_MS}ms`),
      },
      "handover-buffer": {
        type: "string",
        default: env("SHADDOCK_HANDOVER_BUFFER", String(DEFAULT_HANDOVER_BUFFER)),
      },
      standby: { type: "string", default: env("SHADDOCK_STANDBY", "true") },
      "replica-timeout": {
        type: "string",
        default: env("SHADDOCK_REPLICA_TIMEOUT", `${DEFAULT_REPLICA_TIMEOUT_MS}ms`),
      },
      "drain-grace": DRAIN_GRACE_OPTION,
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const queueCapacity = positiveInteger("queue", values.queue);
  const handoverBuffer = positiveInteger("handover-buffer", values["handover-buffer"]);
  // The name is one word: the answer is "<name> <count>".
  if (!isValidName(values.name)) {
    throw new Error(`--name must be 1..=64 of [a-z0-9_-], not ${JSON.stringify(values.name)}`);
  }
  const keyedHeartbeatMs = durationMs("keyed-heartbeat", values["keyed-heartbeat"]);
  const keyedMemberTimeoutMs = durationMs("keyed-member-timeout", values["keyed-member-timeout"]);
  const handoverTimeoutMs = durationMs("handover-timeout", values["handover-timeout"]);
  const handoverOverlapMs = durationMs("handover-overlap", values["handover-overlap"]);
  const graceMs = drainGraceMs(values["drain-grace"]);
  const replicaTimeoutMs = durationMs("replica-timeout", values["replica-timeout"]);
  const standby = bool("standby", values.standby);
  checkKeyedTimes({
    heartbeatMs: keyedHeartbeatMs,
    memberTimeoutMs: keyedMemberTimeoutMs,
    handoverTimeoutMs,
    handoverOverlapMs,
  });

  const nc = await connect({
    servers: values.nats.split(","),
    name: `shaddock-worker-${TALLY}-ts`,
    maxReconnectAttempts: -1,
  });
  const stats: TallyStats = { fresh: 0, handed: 0 };
  const worker = await Worker.start(nc, tallyService(values.name, stats), {
    prefix: values.prefix,
    queueCapacity,
    keyedHeartbeatMs,
    keyedMemberTimeoutMs,
    handoverTimeoutMs,
    handoverOverlapMs,
    handoverBuffer,
    standby,
    replicaTimeoutMs,
    onError: (error, where) => console.error(`warning: ${where}: ${String(error)}`),
  });
  const id = worker.keyed?.id ?? "";
  // The signal handlers are in place before the ready line: a supervisor that stops the
  // worker the moment it reads it gets a drain, not the default SIGTERM's death.
  const serving = serveUntilSignalled(nc, worker, {
    draining: "handing the partitions over, then draining",
    stopped: () => {
      const { served, rejected } = worker.stats;
      const keyed = worker.keyed?.stats;
      return (
        `Worker stopped: served=${served} rejected=${rejected} fresh=${stats.fresh} handed=${stats.handed} ` +
        `standby=${keyed?.takenStandby ?? 0} handed_ok=${keyed?.handedOk ?? 0} handed_kept=${keyed?.handedKept ?? 0}`
      );
    },
  }, graceMs);
  console.log(`Worker is ready: serving ${TALLY} (${TALLY_PARTITIONS} partitions) as ${values.name} id=${id}`);
  await serving;
}

/** `value`, given to option `--<name>`, as `true` or `false`; else an error naming the option. */
function bool(name: string, value: string): boolean {
  if (value === "true" || value === "false") return value === "true";
  throw new Error(`--${name} must be true or false, not ${JSON.stringify(value)}`);
}

/** `value`, given to option `--<name>`, as a positive integer; else an error naming the option. */
function positiveInteger(name: string, value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`--${name} must be a positive integer, not ${JSON.stringify(value)}`);
  }
  return n;
}

runMain(main);
