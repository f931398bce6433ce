/**
 * When to try the next connection, and to which gate: exponential back-off with equal
 * jitter over a list of URLs (centrifuge-js's scheme). Pure, so it is tested alone.
 */

export interface ReconnectOptions {
  /** The first retry's delay, before jitter (ms). Default 100. */
  initialDelayMs?: number;
  /** The longest delay, before jitter (ms). Default 5000. */
  maxDelayMs?: number;
  /** Consecutive failed attempts before the client gives up and closes. Default: never. */
  maxAttempts?: number;
}

export const DEFAULT_RECONNECT: Required<ReconnectOptions> = {
  initialDelayMs: 100,
  maxDelayMs: 5_000,
  maxAttempts: Number.POSITIVE_INFINITY,
};

/** Floor for any delay, so a zero `initialDelayMs` cannot spin. */
const MIN_DELAY_MS = 1;

/**
 * The delay before retry number `attempt` (0 for the first): `initial * 2^attempt`,
 * capped at `max`, then jittered to between half and all of it, so a fleet of clients
 * dropped at once does not come back at once.
 */
export function backoffDelay(
  attempt: number,
  options: Required<ReconnectOptions>,
  random: () => number = Math.random,
): number {
  const max = Math.max(options.maxDelayMs, MIN_DELAY_MS);
  const base = Math.min(max, Math.max(options.initialDelayMs, MIN_DELAY_MS) * 2 ** Math.min(attempt, 52));
  return base / 2 + (random() * base) / 2;
}

/** The URL after `index` in `urls`: a dropped client moves to the next gate at once. */
export function nextUrlIndex(index: number, urls: readonly string[]): number {
  return (index + 1) % urls.length;
}
