// Load across both gates while one of them is stopped, or while the bus's nodes are
// restarted: every request must be answered.
//
//   node drain-load.mjs GATE1_URL GATE2_URL [CLIENTS] [INTERVAL_MS]
//
// Each client is given both gates' URLs (half of them gate 1 first, half gate 2 first)
// and sends echo requests one after another, INTERVAL_MS apart. Once every client has
// had an answer it prints `loaded`. Then it reads stdin: a line naming a gate URL means
// "that gate has been stopped", the line `bus` "the bus's nodes have been restarted";
// the load goes on for AFTER_MS more, then stops and reports. It fails (exit 1) when any
// request failed, or a client had no answer after the stop, or a client still names the
// stopped gate. The whole run is bounded by MAX_RUN_MS.
import { createInterface } from "node:readline";
import { connect, echo, waitFor } from "./sdk.mjs";

const AFTER_MS = 2_000;
const MAX_RUN_MS = 240_000;
const [url1, url2, clientsArg = "20", intervalArg = "10"] = process.argv.slice(2);
if (!url1 || !url2) {
  console.error("usage: node drain-load.mjs GATE1_URL GATE2_URL [CLIENTS] [INTERVAL_MS]");
  process.exit(2);
}
const clientCount = Number(clientsArg);
const intervalMs = Number(intervalArg);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const hardStop = setTimeout(() => {
  console.error(`drain-load: still running after ${MAX_RUN_MS} ms, giving up`);
  process.exit(1);
}, MAX_RUN_MS);

const stats = { sent: 0, ok: 0, failed: 0, errors: new Map() };
let stoppedUrl;
let stoppedAt;
let finishing = false;

const clients = await Promise.all(
  Array.from({ length: clientCount }, (_, i) => connect(i % 2 === 0 ? [url1, url2] : [url2, url1])),
);
const okAfterStop = clients.map(() => 0);
const okAny = clients.map(() => 0);

async function run(i) {
  const e = echo(clients[i]);
  for (let n = 0; !finishing; n++) {
    const body = `client ${i} request ${n}`;
    stats.sent++;
    try {
      const answer = new TextDecoder().decode(await e.echo(body));
      if (answer !== body) throw new Error(`answered ${JSON.stringify(answer)}`);
      stats.ok++;
      okAny[i]++;
      if (stoppedAt !== undefined) okAfterStop[i]++;
    } catch (err) {
      stats.failed++;
      const key = String(err?.message ?? err);
      stats.errors.set(key, (stats.errors.get(key) ?? 0) + 1);
    }
    await sleep(intervalMs);
  }
}

const loops = clients.map((_, i) => run(i));
await waitFor("an answer on every client", () => okAny.every((n) => n > 0), 30_000);
console.log("loaded");

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  stoppedUrl = line.trim();
  stoppedAt = Date.now();
  break;
}
if (stoppedAt === undefined) {
  console.error("drain-load: stdin closed before a stopped gate was named");
  process.exit(1);
}
await sleep(AFTER_MS);
finishing = true;
await Promise.all(loops);
clearTimeout(hardStop);

const what = stoppedUrl === "bus" ? "bus nodes restarted under load" : `gate stopped under load (${stoppedUrl})`;
const stillOnStopped = clients.filter((c) => c.url === stoppedUrl).length;
const idleAfterStop = okAfterStop.filter((n) => n === 0).length;
for (const c of clients) c.close();
const errors = [...stats.errors].map(([message, count]) => `${count}× ${message}`).join("; ");
const summary = `${clientCount} clients, ${stats.sent} requests, ${stats.ok} answered, ${stats.failed} failed`;
if (stats.failed > 0 || idleAfterStop > 0 || stillOnStopped > 0) {
  console.error(
    `FAIL  ${what}: ${summary}` +
      (errors ? ` (${errors})` : "") +
      `; ${idleAfterStop} clients had no answer after the stop, ${stillOnStopped} still name the stopped gate`,
  );
  process.exit(1);
}
const after = stoppedUrl === "bus" ? "every client answered after the restarts" : "every client answered on the other gate after the stop";
console.log(`ok    ${what}: ${summary}; ${after}`);
process.exit(0);
