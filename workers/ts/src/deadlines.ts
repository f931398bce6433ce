/**
 * A worker's deadlines on one timer: its calls' (then 408 `call timed out`) and its
 * requests' (then the worker's own 408), in `performance.now()` milliseconds.
 *
 * Most requests are answered long before their deadline, so adding and removing one
 * must cost next to nothing: a deadline is an entry in a set, and the one timer is armed
 * for the earliest entry only when a new one comes before it by more than the timer's
 * resolution (deadlines mostly grow with arrival, so that is rare). A removal leaves the
 * timer as it is; when it fires it expires what is due, scanning what is still open (the
 * handlers waiting on a call, at most a few thousand), and arms itself for the earliest
 * left. A deadline may so pass up to `RESOLUTION_MS` before it expires, never before.
 *
 * At one instant, calls expire before requests: a call made for a request times out at
 * that request's deadline, and its result must reach the handler before the request's
 * 408, so the handler can still answer.
 */

/**
 * Node's timers count whole milliseconds: a deadline within one of the armed timer's is
 * expired by it, rather than re-arming (the gates' `timeout_ms` is what is left of
 * their timeout, so requests' deadlines jitter by fractions of one).
 */
const RESOLUTION_MS = 1;

/** What expires first at one instant. */
export type Rank = "call" | "request";

/** One deadline. */
export interface Due {
  readonly at: number;
  readonly rank: Rank;
  readonly expire: () => void;
}

export class Deadlines {
  readonly #calls = new Set<Due>();
  readonly #requests = new Set<Due>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** When the timer fires; `Infinity` when it is not armed. */
  #armedAt = Number.POSITIVE_INFINITY;
  #closed = false;

  /** Calls `expire` at `at`, unless the entry is removed first. */
  add(rank: Rank, at: number, expire: () => void): Due {
    const due = { at, rank, expire };
    (rank === "call" ? this.#calls : this.#requests).add(due);
    if (at < this.#armedAt - RESOLUTION_MS) this.#arm(at);
    return due;
  }

  remove(due: Due): void {
    (due.rank === "call" ? this.#calls : this.#requests).delete(due);
  }

  /** Forgets every deadline and stops the timer. */
  close(): void {
    this.#closed = true;
    this.#calls.clear();
    this.#requests.clear();
    clearTimeout(this.#timer);
    this.#armedAt = Number.POSITIVE_INFINITY;
  }

  #arm(at: number): void {
    if (this.#closed) return;
    clearTimeout(this.#timer);
    this.#armedAt = at;
    this.#timer = setTimeout(() => this.#fire(), Math.max(0, Math.ceil(at - performance.now())));
  }

  #fire(): void {
    this.#timer = undefined;
    this.#armedAt = Number.POSITIVE_INFINITY;
    const now = performance.now();
    let next = Number.POSITIVE_INFINITY;
    for (const set of [this.#calls, this.#requests]) {
      for (const due of set) {
        if (due.at <= now) {
          set.delete(due);
          due.expire();
        } else {
          next = Math.min(next, due.at);
        }
      }
    }
    if (next < this.#armedAt) this.#arm(next);
  }
}
