// The TypeScript SDK (clients/ts, built by scripts/test.sh before deploy/test.sh runs)
// with `ws` as Node 20's WebSocket, for the fleet checks.
import { createRequire } from "node:module";

const sdkDir = new URL("../../clients/ts/", import.meta.url);
const { WebSocket } = createRequire(new URL("package.json", sdkDir))("ws");
const sdk = await import(new URL("dist/index.js", sdkDir).href);

export const { chat, echo, ShaddockError } = sdk;

/** A connected client on `servers` (one URL or a list: reconnects go to the next). */
export function connect(servers, options = {}) {
  return sdk.Client.connect({ WebSocket, servers, ...options });
}

/** Resolves when `check()` is true, polling; rejects after `timeoutMs`. */
export async function waitFor(what, check, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
