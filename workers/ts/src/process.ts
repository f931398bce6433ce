/**
 * What every worker process (echo, shop, tally) does around its service: serve until
 * SIGTERM or SIGINT, then drain the worker (it answers what it took, a keyed one hands
 * its partitions over) and the connection, and print how it went; and end with status 1
 * and one line when `main` fails.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type { Worker } from "./worker.js";

/** Lines printed on the way out: when the signal comes, and once drained. */
export interface StopLines {
  draining: string;
  stopped: () => string;
}

/** Resolves once the connection has closed after a signal's drain; throws what closed it otherwise. */
export async function serveUntilSignalled(nc: NatsConnection, worker: Worker, lines: StopLines): Promise<void> {
  let stopping = false;
  const stop = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: ${lines.draining}`);
    await worker.drain();
    await nc.drain();
    console.log(lines.stopped());
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
