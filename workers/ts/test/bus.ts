// A real nats-server for the tests, on a random port, killed when the test ends. Found
// on PATH or in $(go env GOPATH)/bin, where scripts/test.sh installs it.
import { execFileSync, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync } from "node:fs";
import { delimiter, join } from "node:path";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/transport-node";

export const DEADLINE_MS = 10_000;

/** Polls `condition` until it holds, failing after the deadline. */
export async function until(what: string, condition: () => boolean): Promise<void> {
  const deadline = Date.now() + DEADLINE_MS;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

export function findNatsServer(): string {
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    const candidate = join(dir, "nats-server");
    if (dir !== "" && existsSync(candidate)) return candidate;
  }
  const gopath = execFileSync("go", ["env", "GOPATH"], { encoding: "utf8" }).trim().split(delimiter)[0] ?? "";
  const candidate = join(gopath, "bin", "nats-server");
  if (existsSync(candidate)) return candidate;
  throw new Error("nats-server not found on PATH or in $(go env GOPATH)/bin (scripts/test.sh installs it)");
}

export interface Bus {
  readonly url: string;
  connect(): Promise<NatsConnection>;
  /** Kills the server; resolves once it has exited. */
  stop(): Promise<void>;
}

/** Starts nats-server on 127.0.0.1, port chosen by the server, and waits until it is ready. */
export async function startBus(): Promise<Bus> {
  const child: ChildProcess = spawn(findNatsServer(), ["-a", "127.0.0.1", "-p", "-1"], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let log = "";
    let port: string | undefined;
    const timer = setTimeout(() => reject(new Error(`nats-server did not start:\n${log}`)), DEADLINE_MS);
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      log += chunk;
      port ??= /Listening for client connections on [^:]+:(\d+)/.exec(log)?.[1];
      if (port !== undefined && log.includes("Server is ready")) {
        clearTimeout(timer);
        resolve(`nats://127.0.0.1:${port}`);
      }
    });
    child.on("exit", (code) => reject(new Error(`nats-server exited (${code}):\n${log}`)));
  });
  const clients: NatsConnection[] = [];
  return {
    url,
    async connect() {
      const nc = await connect({ servers: url });
      clients.push(nc);
      return nc;
    },
    async stop() {
      for (const nc of clients) void nc.close();
      const exited = child.exitCode === null ? once(child, "exit") : Promise.resolve();
      child.kill();
      await exited;
    },
  };
}

/**
 * Collects a child process's stdout: `ready` resolves once it has printed `line`, and
 * rejects if the child exits first or the deadline passes; `printed()` is all of it so
 * far.
 */
export function watchOutput(child: ChildProcess, line: string): { ready: Promise<void>; printed: () => string } {
  let out = "";
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`never printed ${line}:\n${out}`)), DEADLINE_MS);
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      out += chunk;
      if (out.includes(line)) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited (${code}) before it printed ${line}:\n${out}`));
    });
  });
  return { ready, printed: () => out };
}
