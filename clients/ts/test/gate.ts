/**
 * Starts a real gate for a test: `shaddock up` (embedded broker, gate, echo and chat
 * workers) as a child process, from env SHADDOCK_BIN or the repository's debug build.
 * Readiness is read from its log, with a deadline; `stop()` ends exactly that child.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import { createServer } from "node:net";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** clients/ts (this file runs compiled, from dist-test/test/). */
export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

export const SHADDOCK_BIN = process.env["SHADDOCK_BIN"] ?? resolve(PACKAGE_DIR, "../../target/debug/shaddock");

const READY_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 10_000;
const PAUSE_TIMEOUT_MS = 5_000;

export interface Gate {
  readonly port: number;
  /** `ws://127.0.0.1:PORT/` */
  readonly url: string;
  readonly child: ChildProcess;
  /** Everything the gate logged so far. */
  log(): string;
  /**
   * SIGSTOP, resolved once every thread of the gate has stopped, so that nothing sent
   * after it is answered until `resume()`. `kill(2)` returns before that: one thread
   * takes the signal and then stops the others, and on a busy machine the rest go on
   * serving for milliseconds, long enough to answer a request sent right after the kill.
   */
  pause(): Promise<void>;
  /** SIGCONT after `pause()`. */
  resume(): void;
  /** SIGTERM, then SIGKILL if it has not exited within the deadline; resolves when it has exited. */
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
// A test runner that exits early (a failed assertion, an uncaught error) must not leave
// gates behind: kill exactly the children this module started.
process.on("exit", () => {
  for (const child of running) child.kill("SIGKILL");
});

/** Starts a gate on `gatePort` (0: any free port) and resolves once it is ready. */
export async function startGate(options: { gatePort?: number; args?: readonly string[] } = {}): Promise<Gate> {
  const args = [
    "up",
    "--broker-port", "0",
    "--monitor-port", "0",
    "--metrics-port", "0",
    "--gate-port", String(options.gatePort ?? 0),
    // Tests run side by side: no two share the default data directory.
    "--store", "memory",
    ...(options.args ?? []),
  ];
  const child = spawn(SHADDOCK_BIN, args, { stdio: ["ignore", "pipe", "pipe"] });
  running.add(child);
  const exited = new Promise<void>((done) => child.once("exit", () => {
    running.delete(child);
    done();
  }));
  let log = "";
  let port: number | undefined;
  const ready = new Promise<number>((resolveReady, rejectReady) => {
    const timer = setTimeout(() => rejectReady(new Error(`gate not ready within ${READY_TIMEOUT_MS} ms:\n${log}`)), READY_TIMEOUT_MS);
    const onData = (chunk: Buffer) => {
      log += chunk.toString();
      const listening = /Gate listening for WebSocket clients on [0-9.:\[\]a-f]*:(\d+)/.exec(log);
      if (listening) port = Number(listening[1]);
      if (port !== undefined && log.includes("Server is ready")) {
        clearTimeout(timer);
        resolveReady(port);
      }
    };
    child.stderr!.on("data", onData);
    child.stdout!.on("data", onData);
    child.once("error", (error) => {
      clearTimeout(timer);
      rejectReady(new Error(`cannot start ${SHADDOCK_BIN}: ${error.message} (set SHADDOCK_BIN)`));
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      rejectReady(new Error(`gate exited before it was ready (${code ?? signal}):\n${log}`));
    });
  });
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
    await exited;
    clearTimeout(timer);
  };
  let readyPort: number;
  try {
    readyPort = await ready;
  } catch (error) {
    await stop();
    throw error;
  }
  const pause = async () => {
    const pid = child.pid;
    if (pid === undefined || !child.kill("SIGSTOP")) throw new Error("cannot stop the gate: it is not running");
    const deadline = Date.now() + PAUSE_TIMEOUT_MS;
    for (;;) {
      const states = await threadStates(pid);
      if (/^[Tt]+$/.test(states)) return;
      if (Date.now() > deadline) {
        throw new Error(`gate ${pid} not stopped within ${PAUSE_TIMEOUT_MS} ms after SIGSTOP (thread states ${states})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
  };
  const resume = () => {
    child.kill("SIGCONT");
  };
  return { port: readyPort, url: `ws://127.0.0.1:${readyPort}/`, child, log: () => log, stop, pause, resume };
}

/** The state letter (`R`, `S`, `T`...) of each thread of process `pid`, from Linux's /proc. */
async function threadStates(pid: number): Promise<string> {
  let tasks: string[];
  try {
    tasks = await readdir(`/proc/${pid}/task`);
  } catch (error) {
    throw new Error(`cannot read the threads of gate ${pid} (the tests that stop a gate need Linux's /proc): ${String(error)}`);
  }
  const states = await Promise.all(tasks.map(async (task) => {
    try {
      const stat = await readFile(`/proc/${pid}/task/${task}/stat`, "utf8");
      // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
      return stat.charAt(stat.lastIndexOf(")") + 2);
    } catch {
      return ""; // the thread exited meanwhile
    }
  }));
  return states.join("");
}

/** A port that was free a moment ago (for a gate that must come back on the same port). */
export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}
