/**
 * What every worker process (echo, shop, tally) does around its service: serve until
 * SIGTERM or SIGINT, then drain the worker (it answers what it took, a keyed one hands
 * its partitions over) and the connection, and print how it went; and end with status 1
 * and one line when `main` fails, or when the drain does not end within its grace (the
 * bus is down, say), saying what could not be delivered.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { durationMs } from "./duration.js";
import type { Worker } from "./worker.js";

/**
 * How long a worker told to stop has to drain before it exits anyway, as the Rust
 * workers' `--drain-grace` (docs/workers.md, "Draining on shutdown"): more than a
 * healthy drain takes (its handlers' calls and answers time out within 5 s by default).
 */
export const DEFAULT_DRAIN_GRACE_MS = 10_000;

/** The `--drain-grace` option, for `parseArgs`, with its `SHADDOCK_DRAIN_GRACE` fallback. */
export const DRAIN_GRACE_OPTION = {
  type: "string",
  default: process.env["SHADDOCK_DRAIN_GRACE"] ?? `${DEFAULT_DRAIN_GRACE_MS}ms`,
} as const;

/** The usage line of `--drain-grace`. */
export const DRAIN_GRACE_USAGE = `the longest drain, then exit 1 (env SHADDOCK_DRAIN_GRACE; ${DEFAULT_DRAIN_GRACE_MS}ms)`;

/** `--drain-grace`'s value, in milliseconds. */
export function drainGraceMs(text: string): number {
  return durationMs("drain-grace", text);
}

/** Lines printed on the way out: when the signal comes, and once drained. */
export interface StopLines {
  draining: string;
  stopped: () => string;
}

/**
 * Listens for SIGTERM and SIGINT before it first yields, so a caller that prints its
 * ready line after calling it (not after awaiting it) is never killed by a signal's
 * default action once that line is out.
 * Resolves once the connection has closed after a signal's drain; throws what closed it
 * otherwise. A drain that fails, or has not ended `graceMs` after the signal, ends the
 * process with status 1 and a line saying what the worker could not deliver.
 */
export async function serveUntilSignalled(
  nc: NatsConnection,
  worker: Worker,
  lines: StopLines,
  graceMs = DEFAULT_DRAIN_GRACE_MS,
): Promise<void> {
  let stopping = false;
  const stop = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: ${lines.draining}`);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const grace = new Promise<string>((resolve) => {
      timer = setTimeout(() => resolve(`did not end within its grace of ${graceMs}ms`), graceMs);
    });
    const drained = (async () => {
      await worker.drain();
      await nc.drain();
    })().then(
      () => undefined,
      (error: unknown) => `failed (${error instanceof Error ? error.message : String(error)})`,
    );
    const failed = await Promise.race([drained, grace]);
    clearTimeout(timer);
    if (failed === undefined) {
      console.log(lines.stopped());
      return;
    }
    const { answers, pushes } = worker.undelivered;
    console.error(
      `error: the drain ${failed} (is the bus down?): ${answers} answers and ${pushes} pushes not delivered`,
    );
    process.exit(1);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
  const closed = await nc.closed();
  if (closed instanceof Error) throw closed;
}

/** Runs a process's `main`, exiting 1 with `error: ...` when it fails. */
export function runMain(main: () => Promise<void>): void {
  main().catch((error: unknown) => {
    console.error(`error: ${error instanceof Error ? error.message : String(error)}`);
    process.exit(1);
  });
}
