#!/usr/bin/env node
/**
 * The echo service as a worker process, written with `@shaddock/worker`:
 *
 *     node dist/echo.js --nats nats://127.0.0.1:4222 [--prefix shaddock] [--queue 1024]
 *         [--drain-grace 10s]
 *
 * Prints `Worker is ready` once it serves. On SIGTERM or SIGINT it drains (stops taking
 * requests, answers those it took), prints `Worker stopped: served=N rejected=M`, and
 * exits 0; or, when the drain has not ended within its grace (the bus is down), says
 * what it could not deliver and exits 1.
 */
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { echoService } from "./services/echo.js";
import { DRAIN_GRACE_OPTION, DRAIN_GRACE_USAGE, drainGraceMs, runMain, serveUntilSignalled } from "./process.js";
import { DEFAULT_PREFIX } from "./subjects.js";
import { DEFAULT_QUEUE_CAPACITY, Worker } from "./worker.js";

const USAGE = `usage: echo [--nats URL[,URL...]] [--prefix PREFIX] [--queue N] [--drain-grace D]

  --nats            NATS server URLs, comma-separated (env SHADDOCK_NATS; nats://127.0.0.1:4222)
  --prefix          subject prefix shared with the gates (env SHADDOCK_PREFIX; ${DEFAULT_PREFIX})
  --queue           requests queued before answering 503 (${DEFAULT_QUEUE_CAPACITY})
  --drain-grace     ${DRAIN_GRACE_USAGE}`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      nats: { type: "string", default: process.env["SHADDOCK_NATS"] ?? "nats://127.0.0.1:4222" },
      prefix: { type: "string", default: process.env["SHADDOCK_PREFIX"] ?? DEFAULT_PREFIX },
      queue: { type: "string", default: String(DEFAULT_QUEUE_CAPACITY) },
      "drain-grace": DRAIN_GRACE_OPTION,
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const queueCapacity = Number(values.queue);
  if (!Number.isInteger(queueCapacity) || queueCapacity < 1) {
    throw new Error(`--queue must be a positive integer, not ${JSON.stringify(values.queue)}`);
  }
  const graceMs = drainGraceMs(values["drain-grace"]);
  const nc = await connect({
    servers: values.nats.split(","),
    name: "shaddock-worker-echo-ts",
    maxReconnectAttempts: -1,
  });
  const worker = await Worker.start(nc, echoService(), {
    prefix: values.prefix,
    queueCapacity,
    onError: (error, where) => console.error(`warning: ${where}: ${String(error)}`),
  });
  // The signal handlers are in place before the ready line: a supervisor that stops the
  // worker the moment it reads it gets a drain, not the default SIGTERM's death.
  const serving = serveUntilSignalled(nc, worker, {
    draining: "draining",
    stopped: () => {
      const { served, rejected } = worker.stats;
      return `Worker stopped: served=${served} rejected=${rejected}`;
    },
  }, graceMs);
  console.log(`Worker is ready: serving ${worker.subject} in queue group echo`);
  await serving;
}

runMain(main);
