/**
 * A request's or event's handling as the worker's loop sees it, from its handler's start
 * until it settles (the worker's module docs, "Calls").
 *
 * The loop runs one *turn* at a time: a handler's start, or handing it one call's
 * result. A turn lasts while the handler runs, and while it awaits anything but a call,
 * so handlers take turns as they always did and state needs no lock. It ends when the
 * handler settles, makes a call (it is waiting on the bus now, and the loop goes on to
 * the next request), or passes its deadline. A call's result does not resume the
 * handler where it arrives: the worker queues it, and its turn resumes the handler, so
 * continuations run one at a time too, in the order their results arrive.
 */
import type { CallResult, Caller } from "./call.js";
import type { Calls } from "./calls.js";
import type { Due } from "./deadlines.js";

export class Task {
  /** Calls its handler made whose results it has not been handed yet. */
  inFlight = 0;
  /** Of those, the results waiting in the worker's queue. */
  queued = 0;
  /** Answered (by its handler, or the worker's 408); for an event, settled. */
  done = false;
  /** Its deadline has passed. */
  expired = false;
  /** A request's deadline; none for an event. */
  due: Due | undefined;
  /** Ends the loop's wait on the current turn: the handler settled, made a call, or expired. */
  #wake: (() => void) | undefined;

  /**
   * Runs `step` (the handler's start, or handing it a call's result) as one turn. With
   * other calls still in flight (or past its deadline) the handler holds the loop only
   * until what the step made runnable has run: then it is waiting on another result.
   */
  async turn(step: () => void): Promise<void> {
    step();
    if (this.done) return;
    await new Promise<void>((wake) => {
      this.#wake = wake;
      if (this.inFlight > 0 || this.expired) setImmediate(wake);
    });
    this.#wake = undefined;
  }

  /** Ends the current turn, if there is one. */
  wake(): void {
    this.#wake?.();
  }

  /**
   * The caller of this task's handler: each call goes out through `calls`, and its result
   * is handed to `queue`, for the worker to give back in a later turn (`resolve` it then).
   * A refused call resolves at once, in this turn.
   */
  caller(calls: Calls, queue: (resolve: (result: CallResult) => void, result: CallResult) => void): Caller {
    return (call) =>
      new Promise<CallResult>((resolve) => {
        const refused = calls.start(call, (result) => {
          this.queued += 1;
          queue(resolve, result);
        });
        if (refused !== undefined) {
          resolve(refused);
          return;
        }
        this.inFlight += 1;
        this.wake();
      });
  }

  /** A queued result's turn has come: it is the handler's now. */
  handed(): void {
    this.queued -= 1;
    this.inFlight -= 1;
  }
}
