/**
 * A keyed worker's settings (docs/workers.md, "Keyed services"): its heartbeat, member
 * timeout, hand-over bounds and replica timeout, with their defaults (the Rust workers'
 * flags'), and the check that a live worker is never counted dead.
 */

/** Default heartbeat: how often a keyed worker tells its peers it lives and what it holds. */
export const DEFAULT_KEYED_HEARTBEAT_MS = 500;
/** Default member timeout: a peer unheard for longer is dead (more than two heartbeats). */
export const DEFAULT_KEYED_MEMBER_TIMEOUT_MS = 2_000;
/** Default hand-over timeout: how long the old owner waits for each answer of the new one. */
export const DEFAULT_HANDOVER_TIMEOUT_MS = 2_000;
/** Default overlap: how long the old owner serves a partition after the new one has subscribed it. */
export const DEFAULT_HANDOVER_OVERLAP_MS = 200;
/** Default hand-over buffer: requests a new owner holds per partition while it waits for the state. */
export const DEFAULT_HANDOVER_BUFFER = 4096;
/** Default replica timeout: how long a batch's answers wait for its standbys (as Rust's `--replica-timeout`). */
export const DEFAULT_REPLICA_TIMEOUT_MS = 100;

/** A keyed worker's timings, in milliseconds. */
export interface KeyedTimes {
  readonly heartbeatMs: number;
  readonly memberTimeoutMs: number;
  readonly handoverTimeoutMs: number;
  readonly handoverOverlapMs: number;
}

/** A keyed worker's settings: its timings, and what it holds of a partition it prepares to take. */
export interface KeyedSettings extends KeyedTimes {
  /** Requests held per prepared partition at most; past it they are dropped (and counted). */
  readonly handoverBuffer: number;
  /**
   * With standbys (the service gives snapshots, and they are not turned off): how long a
   * batch's answers wait for its standbys, ms. `undefined`: no standbys.
   */
  readonly replicaTimeoutMs: number | undefined;
}

/** Checks that a live worker, heard every heartbeat, is never counted dead. */
export function checkKeyedTimes(times: KeyedTimes): void {
  const { heartbeatMs, memberTimeoutMs, handoverTimeoutMs, handoverOverlapMs } = times;
  if (!(heartbeatMs > 0)) throw new Error(`the keyed heartbeat must be positive, not ${heartbeatMs}`);
  if (!(handoverTimeoutMs > 0)) throw new Error(`the hand-over timeout must be positive, not ${handoverTimeoutMs}`);
  if (!(handoverOverlapMs >= 0)) throw new Error(`the hand-over overlap must be 0 or more, not ${handoverOverlapMs}`);
  if (!(memberTimeoutMs > 2 * heartbeatMs)) {
    const why = `must be more than two heartbeats (${heartbeatMs} ms)`;
    throw new Error(`the keyed member timeout (${memberTimeoutMs} ms) ${why}`);
  }
}
