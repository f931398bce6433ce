#!/usr/bin/env node
/**
 * The shop or the bank (`services/shop.ts`: the shop's `buy` calls `bank.pay`) as a
 * worker process, written with `@shaddock/worker`; `tests/mixed_calls.rs` runs it beside
 * the Rust shop and bank, so calls go from Rust to TypeScript and back:
 *
 *     node dist/shop.js --service shop|bank --nats nats://127.0.0.1:4222
 *         [--prefix shaddock] [--queue 1024] [--max-calls 1024] [--call-timeout 5s]
 *         [--call-margin 250ms] [--answer-timeout 5s] [--drain-grace 10s]
 *
 * Prints `Worker is ready` once it serves. On SIGTERM or SIGINT it drains (answers what
 * it took, a request waiting on a call included), prints `Worker stopped: served=N
 * rejected=M expired=E`, and exits 0 (or 1, saying what it could not deliver, when the
 * drain has not ended within its grace).
 */
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { durationMs } from "./duration.js";
import { BANK, SHOP, bankService, shopService } from "./services/shop.js";
import { DRAIN_GRACE_OPTION, DRAIN_GRACE_USAGE, drainGraceMs, runMain, serveUntilSignalled } from "./process.js";
import { DEFAULT_PREFIX } from "./subjects.js";
import {
  DEFAULT_ANSWER_TIMEOUT_MS,
  DEFAULT_CALL_MARGIN_MS,
  DEFAULT_CALL_TIMEOUT_MS,
  DEFAULT_MAX_CALLS,
  DEFAULT_QUEUE_CAPACITY,
  Worker,
} from "./worker.js";

const USAGE = `usage: shop --service shop|bank [--nats URL[,URL...]] [--prefix PREFIX] [--queue N]
            [--max-calls N] [--call-timeout D] [--call-margin D] [--answer-timeout D]
            [--drain-grace D]

  --service         which to serve: "${SHOP}" (buy calls ${BANK}.pay) or "${BANK}" (pay)
  --nats            NATS server URLs, comma-separated (env SHADDOCK_NATS; nats://127.0.0.1:4222)
  --prefix          subject prefix shared with the gates (env SHADDOCK_PREFIX; ${DEFAULT_PREFIX})
  --queue           requests queued before answering 503 (${DEFAULT_QUEUE_CAPACITY})
  --max-calls       calls to other services in flight at most, then 503 at once
                    (env SHADDOCK_MAX_CALLS; ${DEFAULT_MAX_CALLS})
  --call-timeout    how long a call waits when its request has no deadline
                    (env SHADDOCK_CALL_TIMEOUT; ${DEFAULT_CALL_TIMEOUT_MS}ms)
  --call-margin     how much sooner than its request's deadline a call times out, so
                    the handler still answers in time; 0s shares the deadline
                    (env SHADDOCK_CALL_MARGIN; ${DEFAULT_CALL_MARGIN_MS}ms)
  --answer-timeout  how long a request may take when its caller did not say, then 408
                    (env SHADDOCK_ANSWER_TIMEOUT; ${DEFAULT_ANSWER_TIMEOUT_MS}ms)
  --drain-grace     ${DRAIN_GRACE_USAGE}

Durations as the Rust workers write them: a number and a unit, e.g. 100ms, 1.5s, 1m30s.`;

function positiveInteger(flag: string, text: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`--${flag} must be a positive integer, not ${JSON.stringify(text)}`);
  }
  return n;
}

async function main(): Promise<void> {
  const env = (name: string, fallback: string): string => process.env[name] ?? fallback;
  const { values } = parseArgs({
    options: {
      service: { type: "string", default: "" },
      nats: { type: "string", default: env("SHADDOCK_NATS", "nats://127.0.0.1:4222") },
      prefix: { type: "string", default: env("SHADDOCK_PREFIX", DEFAULT_PREFIX) },
      queue: { type: "string", default: String(DEFAULT_QUEUE_CAPACITY) },
      "max-calls": { type: "string", default: env("SHADDOCK_MAX_CALLS", String(DEFAULT_MAX_CALLS)) },
      "call-timeout": { type: "string", default: env("SHADDOCK_CALL_TIMEOUT", `${DEFAULT_CALL_TIMEOUT_MS}ms`) },
      "call-margin": { type: "string", default: env("SHADDOCK_CALL_MARGIN", `${DEFAULT_CALL_MARGIN_MS}ms`) },
      "answer-timeout": { type: "string", default: env("SHADDOCK_ANSWER_TIMEOUT", `${DEFAULT_ANSWER_TIMEOUT_MS}ms`) },
      "drain-grace": DRAIN_GRACE_OPTION,
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const services = new Map([
    [SHOP, shopService],
    [BANK, bankService],
  ]);
  const service = services.get(values.service)?.();
  if (service === undefined) {
    throw new Error(`--service must be "${SHOP}" or "${BANK}", not ${JSON.stringify(values.service)}`);
  }
  const queueCapacity = positiveInteger("queue", values.queue);
  const maxCalls = positiveInteger("max-calls", values["max-calls"]);
  const callTimeoutMs = durationMs("call-timeout", values["call-timeout"]);
  const callMarginMs = durationMs("call-margin", values["call-margin"], true);
  const answerTimeoutMs = durationMs("answer-timeout", values["answer-timeout"]);
  const graceMs = drainGraceMs(values["drain-grace"]);

  const nc = await connect({
    servers: values.nats.split(","),
    name: `shaddock-worker-${service.name}-ts`,
    maxReconnectAttempts: -1,
  });
  const worker = await Worker.start(nc, service, {
    prefix: values.prefix,
    queueCapacity,
    maxCalls,
    callTimeoutMs,
    callMarginMs,
    answerTimeoutMs,
    onError: (error, where) => console.error(`warning: ${where}: ${String(error)}`),
  });
  // The signal handlers are in place before the ready line: a supervisor that stops the
  // worker the moment it reads it gets a drain, not the default SIGTERM's death.
  const serving = serveUntilSignalled(nc, worker, {
    draining: "draining",
    stopped: () => {
      const { served, rejected, expired } = worker.stats;
      return `Worker stopped: served=${served} rejected=${rejected} expired=${expired}`;
    },
  }, graceMs);
  console.log(`Worker is ready: serving ${worker.subject} in queue group ${service.name}`);
  await serving;
}

runMain(main);
