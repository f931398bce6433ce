/**
 * A worker's options (`WorkerOptions`), with the defaults of the worker's own; the keyed
 * ones' defaults are in `keyed-settings.ts`, the calls' in `calls.ts`.
 */

/** Default for `WorkerOptions.queueCapacity`: about 10 ms of small requests. */
export const DEFAULT_QUEUE_CAPACITY = 1024;
/** Default for `WorkerOptions.frameBudget`: requests handled before yielding to I/O. */
export const DEFAULT_FRAME_BUDGET = 64;
/** Default for `WorkerOptions.answerTimeoutMs`: the gates' default request timeout. */
export const DEFAULT_ANSWER_TIMEOUT_MS = 5_000;

/** How a worker serves. */
export interface WorkerOptions {
  /** Subject prefix shared with the gates (default `shaddock`). */
  prefix?: string;
  /** Requests queued before the worker answers 503 (at least 1). */
  queueCapacity?: number;
  /** Turns (requests, events, calls' results) in a row before the loop yields to I/O (at least 1). */
  frameBudget?: number;
  /**
   * Calls to other services in flight at most (default 1024); past it a call gets 503
   * `too many calls in flight` at once. Bounds the handlers, and the sessions they hold,
   * waiting on callees that are slow to answer.
   */
  maxCalls?: number;
  /**
   * How long a call waits for its answer, ms, when the request it is made for has no
   * deadline (an event's call, or a caller that did not say): default 5000.
   */
  callTimeoutMs?: number;
  /**
   * How much sooner than the deadline of the request it is made for a call times out,
   * ms (default 250), so the handler's answer, its fallback, still reaches the gate
   * before the gate's 408; 0 shares the deadline.
   */
  callMarginMs?: number;
  /**
   * How long a request's handler may take to answer, ms, when its caller did not say
   * (`timeout_ms` 0): default 5000, the gates' request timeout. Then the worker answers
   * 408 itself.
   */
  answerTimeoutMs?: number;
  /** Told about failures nobody else hears of (a failed event, a publish that failed). */
  onError?: (error: unknown, where: string) => void;
  /**
   * A keyed service's heartbeat, ms (default 500): how often the worker tells its peers
   * it lives and what it holds. A starting worker listens for two before it takes
   * partitions nobody holds.
   */
  keyedHeartbeatMs?: number;
  /**
   * A keyed service's member timeout, ms (default 2000, more than two heartbeats): a
   * peer unheard for longer is dead, and its partitions are taken fresh.
   */
  keyedMemberTimeoutMs?: number;
  /**
   * A keyed service's hand-over timeout, ms (default 2000): how long a partition's old
   * owner waits for each answer of the new one: a prepare unanswered keeps the partition
   * (tried again later); a state unanswered is sent again at this pace while the new
   * owner lives.
   */
  handoverTimeoutMs?: number;
  /**
   * A keyed service's hand-over overlap, ms (default 200): how long a partition's old
   * owner keeps serving it once the new owner has subscribed it, long enough for every
   * server of a cluster to learn of the new subscription.
   */
  handoverOverlapMs?: number;
  /**
   * A keyed service's hand-over buffer (default 4096): requests the new owner of a
   * partition holds while it waits for the state; past it, it drops what arrives
   * (counted in `keyed.stats.handoverOverflow`, and told to `onError`).
   */
  handoverBuffer?: number;
  /**
   * Whether a keyed service that gives snapshots has standbys (default true): each
   * partition's next worker in rendezvous order holds its latest state, and takes it
   * with that state when its owner dies (docs/workers.md, "Standbys").
   */
  standby?: boolean;
  /**
   * With standbys, how long a batch's answers wait for its standbys to hold what it
   * changed, ms (default 100, as Rust's `--replica-timeout`); past it they leave anyway,
   * the partitions count as unreplicated (`keyed.stats.unreplicated`), and batches stop
   * waiting for that standby for one keyed heartbeat.
   */
  replicaTimeoutMs?: number;
}
