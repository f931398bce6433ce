/**
 * Durations on the worker processes' command lines, in the Rust workers' grammar
 * (`net::duration`): a number and a unit, repeated, e.g. `100ms`, `1.5s`, `1m30s`.
 */

/** Milliseconds per unit of a duration. */
const UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  "µs": 1e-3,
  ms: 1,
  s: 1_000,
  m: 60_000,
  min: 60_000,
  h: 3_600_000,
};

/**
 * A duration in the Rust workers' grammar (`net::duration`), in milliseconds; positive,
 * or also zero (`0`, `0s`) when `zero` says a flag may be.
 */
export function durationMs(flag: string, text: string, zero = false): number {
  if (zero && text.trim() === "0") return 0;
  const pairs = [...text.trim().matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|min|s|m|h)/gy)];
  const whole = pairs.map((p) => p[0]).join("");
  const ms = pairs.reduce((sum, [, n = "", unit = ""]) => sum + Number(n) * (UNIT_MS[unit] ?? Number.NaN), 0);
  if (pairs.length === 0 || whole !== text.trim() || !(ms > 0 || (zero && ms === 0))) {
    const why = `is not a ${zero ? "" : "positive "}duration: write e.g. 500ms, 2s or 1m30s`;
    throw new Error(`--${flag}: ${JSON.stringify(text)} ${why}`);
  }
  return ms;
}
