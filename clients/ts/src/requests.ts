/**
 * What the client awaits from the gate: requests by id (sent or still waiting for a
 * connection, each with its own deadline) and token refreshes in send order (their
 * acks carry no id). The client decides when to send; this table settles promises.
 * Each sent request remembers the connection it went out on (the client numbers them
 * from 1), so a connection retiring after a move knows when nothing waits on it.
 *
 * When a resumable session's link drops, what was sent on it is *detached*: it waits,
 * within its own deadline, for the resume's outcome. Resumed, it is sent again with
 * the same frame (same id, route, body and key), and the gate answers each id once;
 * not resumed, it fails as after any lost connection. Ids are never reused, so they
 * stay unique across a resumed session.
 */
import type { Body } from "./body.js";
import type { Frame, Timing } from "./codec/codec.js";
import { describe } from "./codec/codec.js";
import { DRAINING_MESSAGE, ShaddockError } from "./errors.js";
import { Status } from "./gen/status_pb.js";

/** An answer with what came with it. */
export interface Reply {
  body: Body;
  /** Present when the handshake asked for server timing. */
  timing?: Timing;
}

type Timer = ReturnType<typeof setTimeout>;

/** `Pending.sentOn` of a request sent on a link that dropped, awaiting the resume's outcome. */
const DETACHED = -1;

export interface Pending {
  readonly route: string;
  readonly frame: Frame;
  /** False for a notify: sent, never answered. */
  readonly answered: boolean;
  /** The connection it went out on; 0 while it waits for one; DETACHED while its session is being resumed. */
  sentOn: number;
  readonly timer: Timer;
  readonly resolve: (reply: Reply) => void;
  readonly reject: (error: ShaddockError) => void;
}

interface Refreshing {
  readonly token: string;
  /** Timed out already: its ack, when it comes, is consumed and ignored. */
  done: boolean;
  readonly timer: Timer;
  readonly resolve: () => void;
  readonly reject: (error: ShaddockError) => void;
}

export class Requests {
  /** In the order made, so requests waiting for a connection go out in that order. */
  private readonly pending = new Map<number, Pending>();
  private refreshes: Refreshing[] = [];
  private nextId = 1;

  /**
   * @param max requests pending at most
   * @param settled called when a request sent on connection `conn` stops waiting on it
   *   (answered, timed out, or refused by a draining gate to be sent again elsewhere)
   */
  constructor(
    private readonly max: number,
    private readonly settled: (conn: number) => void,
  ) {}

  /**
   * Registers a request (or a notify) whose frame `encode` makes from its wire id;
   * returns its id, or undefined when it was rejected at once (too many pending, a
   * body the encoding cannot carry).
   */
  add(
    route: string,
    answered: boolean,
    timeoutMs: number,
    encode: (wireId: number) => Frame,
    resolve: (reply: Reply) => void,
    reject: (error: ShaddockError) => void,
  ): number | undefined {
    if (this.pending.size >= this.max) {
      reject(new ShaddockError(Status.TOO_MANY_REQUESTS, `${this.pending.size} requests pending already`, true, route));
      return undefined;
    }
    const id = this.nextId++;
    let frame: Frame;
    try {
      frame = encode(answered ? id : 0);
    } catch (error) {
      reject(error instanceof ShaddockError ? error : new ShaddockError(Status.BAD_REQUEST, describe(error), true, route));
      return undefined;
    }
    const timer = setTimeout(() => {
      const entry = this.pending.get(id);
      if (entry === undefined) return;
      this.pending.delete(id);
      const what = entry.sentOn !== 0 ? `no answer within ${timeoutMs} ms` : `not connected within ${timeoutMs} ms`;
      entry.reject(new ShaddockError(Status.TIMEOUT, what, true, route));
      if (entry.sentOn > 0) this.settled(entry.sentOn);
    }, timeoutMs);
    this.pending.set(id, { route, frame, answered, sentOn: 0, timer, resolve, reject });
    return id;
  }

  /** The frame of request `id` if it still waits to be sent. */
  unsentFrame(id: number): Frame | undefined {
    const entry = this.pending.get(id);
    return entry !== undefined && entry.sentOn === 0 ? entry.frame : undefined;
  }

  /** Ids of the requests waiting for a connection, oldest first. */
  unsent(): number[] {
    return [...this.pending].filter(([, entry]) => entry.sentOn === 0).map(([id]) => id);
  }

  /** Requests sent on connection `conn` and not yet answered. */
  pendingOn(conn: number): number {
    let count = 0;
    for (const entry of this.pending.values()) if (entry.sentOn === conn) count++;
    return count;
  }

  /** Request `id` went out on connection `conn`; a notify is done then. */
  sent(id: number, conn: number): void {
    const entry = this.pending.get(id);
    if (entry === undefined) return;
    entry.sentOn = conn;
    if (!entry.answered) {
      this.pending.delete(id);
      clearTimeout(entry.timer);
      entry.resolve({ body: "" });
    }
  }

  /**
   * Settles request `id` with the gate's answer; returns true when a draining gate
   * refused it without forwarding it (503 `gate draining`): then it waits to be sent
   * again, on another connection, within its own deadline.
   */
  answer(id: number, code: number, body: Body, message: string, timing: Timing | undefined): boolean {
    const entry = this.pending.get(id);
    // Gone already (answered after its local timeout), or not out on any connection.
    if (entry === undefined || entry.sentOn <= 0) return false;
    const conn = entry.sentOn;
    const refused = code === Status.UNAVAILABLE && message === DRAINING_MESSAGE;
    if (refused) {
      entry.sentOn = 0;
    } else {
      this.pending.delete(id);
      clearTimeout(entry.timer);
      if (code === Status.OK) entry.resolve(timing === undefined ? { body } : { body, timing });
      else entry.reject(new ShaddockError(code, message || `status ${code}`, false, entry.route));
    }
    this.settled(conn);
    return refused;
  }

  addRefresh(token: string, timeoutMs: number, resolve: () => void, reject: (error: ShaddockError) => void): void {
    const entry: Refreshing = {
      token,
      done: false,
      timer: setTimeout(() => {
        entry.done = true;
        reject(new ShaddockError(Status.TIMEOUT, `no refresh ack within ${timeoutMs} ms`, true));
      }, timeoutMs),
      resolve,
      reject,
    };
    this.refreshes.push(entry);
  }

  /**
   * Settles the oldest refresh with the gate's ack; returns its token when accepted,
   * undefined otherwise, or false when no refresh was awaiting one (bad input).
   */
  refreshAcked(code: number, message: string): string | undefined | false {
    const entry = this.refreshes.shift();
    if (entry === undefined) return false;
    clearTimeout(entry.timer);
    if (entry.done) return undefined;
    if (code !== Status.OK) {
      entry.reject(new ShaddockError(code, message || `status ${code}`));
      return undefined;
    }
    entry.resolve();
    return entry.token;
  }

  /**
   * Connection `conn` dropped and its session may be resumed: what was sent on it
   * waits for the outcome (`reattach` or `failDetached`).
   */
  detach(conn: number): void {
    for (const entry of this.pending.values()) if (entry.sentOn === conn) entry.sentOn = DETACHED;
  }

  /** The session was resumed: the detached requests wait to be sent again (`unsent`), in order. */
  reattach(): void {
    for (const entry of this.pending.values()) if (entry.sentOn === DETACHED) entry.sentOn = 0;
  }

  /** The session was not resumed: the detached requests fail, their answers cannot come. */
  failDetached(message: string): void {
    this.failSent(DETACHED, message);
  }

  /** Fails what was sent on connection `conn`, which is gone: its answers cannot come. */
  failSent(conn: number, message: string): void {
    for (const [id, entry] of this.pending) {
      if (entry.sentOn !== conn) continue;
      this.pending.delete(id);
      clearTimeout(entry.timer);
      entry.reject(new ShaddockError(Status.UNAVAILABLE, message, true, entry.route));
    }
  }

  /** Fails everything: the client closed. */
  failAll(message: string): void {
    this.failRefreshes(message);
    for (const entry of this.pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(new ShaddockError(Status.UNAVAILABLE, message, true, entry.route));
    }
    this.pending.clear();
  }

  /** Fails the refreshes awaiting an ack: the connection they went out on is gone. */
  failRefreshes(message: string): void {
    for (const entry of this.refreshes.splice(0)) {
      clearTimeout(entry.timer);
      if (!entry.done) entry.reject(new ShaddockError(Status.UNAVAILABLE, message, true));
    }
  }
}
