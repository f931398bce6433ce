/**
 * One handshaken connection to a gate: its socket, its heartbeat, and the count of the
 * session it carries. The client has one current connection and, after a move off a
 * draining gate, retiring ones; it decides what each frame means and when a connection
 * ends. A connection ends one of two ways: `close` (a close frame: the session ends at
 * the gate) or `cut` (none where the WebSocket allows: the session stays for a resume).
 */
import type { Stream } from "./resume.js";
import { cut, shut, type WebSocketLike } from "./websocket.js";

export class Conn {
  /** When a frame last came from the gate. */
  lastHeard = Date.now();
  /** The gate's kick, for the close that follows it. */
  kickReason: string | undefined;
  /** The gate said it is draining. */
  drained = false;
  private heartbeat: ReturnType<typeof setInterval> | undefined;

  /**
   * @param id numbers the connection (from 1): requests remember the one they went out on
   * @param stream its session's count of pushes and responses; a resumed session's is
   *   the one its lost link had
   */
  constructor(
    readonly socket: WebSocketLike,
    readonly id: number,
    readonly stream: Stream,
  ) {}

  /**
   * Calls `beat` once every `heartbeatMs`: the gate closes after two silent intervals,
   * so one beat an interval leaves a whole interval for a late timer, and each beat
   * costs the gate a wake-up, a read and an answer (docs/capacity.md). Checks every
   * half interval, and calls `silent` instead once two intervals pass without a frame
   * from the gate: it answers every heartbeat, so it is gone.
   */
  startHeartbeat(heartbeatMs: number, beat: () => void, silent: (reason: string) => void): void {
    if (heartbeatMs <= 0) return;
    let ticks = 0;
    this.heartbeat = setInterval(() => {
      if (Date.now() - this.lastHeard > 2 * heartbeatMs) silent(`no frame from the gate in ${2 * heartbeatMs} ms`);
      else if (++ticks % 2 === 0) beat();
    }, heartbeatMs / 2);
  }

  /** Ends the connection with a close frame: its session ends at the gate. */
  close(reason: string): void {
    shut(this.socket, reason);
    clearInterval(this.heartbeat);
  }

  /** Drops the link without a close frame where the WebSocket allows it: the session stays at the gate, to resume. */
  cut(reason: string): void {
    cut(this.socket, reason);
    clearInterval(this.heartbeat);
  }
}
