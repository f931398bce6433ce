/** Signed player tokens for tests: HS256 JWTs made with node's own HMAC, and a gate that checks them. */
import { createHmac } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startGate, type Gate } from "./gate.js";

/** A compact JWS: base64url(header).base64url(claims).base64url(HMAC-SHA256 with `secret`). */
export function signToken(claims: Record<string, unknown>, secret: string): string {
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const input = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`;
  return `${input}.${createHmac("sha256", secret).update(input).digest("base64url")}`;
}

/** Now, in the whole seconds of `exp`, plus `seconds`. */
export function inSeconds(seconds: number): number {
  return Math.floor(Date.now() / 1000) + seconds;
}

/** A gate started with `--jwt-secret-file` (a file written here, with a trailing newline that is not part of the secret); `stop()` also removes the file. */
export async function startJwtGate(secret: string, args: readonly string[] = []): Promise<Gate> {
  const dir = await mkdtemp(join(tmpdir(), "shaddock-jwt-"));
  const secretFile = join(dir, "secret");
  await writeFile(secretFile, `${secret}\n`, { mode: 0o600 });
  let gate: Gate;
  try {
    gate = await startGate({ args: ["--jwt-secret-file", secretFile, ...args] });
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  return {
    ...gate,
    stop: async () => {
      await gate.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
