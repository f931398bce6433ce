/**
 * A resumable session's side of the count (docs/protocol.md, "Resume"): the latest
 * resume token, the highest `seq` handled, and when to acknowledge it. Pure, so its
 * rules are tested alone; the client owns the sockets and sends what this asks for.
 *
 * One stream per session, not per socket: a resumed session keeps its stream across
 * the link it lost, while a gate drained from keeps its own (its retiring connection
 * still delivers that session's frames) beside the new gate's.
 */

/**
 * Acknowledge at least this often (frames handled): the protocol's bound. The gate
 * keeps every frame until it is acknowledged, within its `--resume-buffer`.
 */
export const ACK_EVERY = 64;

export class Stream {
  /** Frames handled since the last ack went out. */
  private unacked = 0;

  /**
   * @param token the latest ack's resume token; empty when the gate keeps no session
   *   for resuming (an older gate, `--resume-window 0`): then nothing is acknowledged
   *   and a drop is not resumed
   * @param lastSeq the highest `seq` handled so far
   */
  constructor(
    public token: string,
    private _lastSeq = 0,
  ) {}

  /** The gate gave a token: this session can be resumed, and is acknowledged. */
  get resumable(): boolean {
    return this.token !== "";
  }

  /** The highest `seq` handled, for acks and for the resume's handshake. */
  get lastSeq(): number {
    return this._lastSeq;
  }

  /**
   * Whether a push or response with `seq` is to be handled: a frame without one (0,
   * outside resumable sessions) always is; a frame whose `seq` is not above the last is
   * a repeat (a replay's, or a re-sent request's answer again) and is dropped.
   */
  accept(seq: number): boolean {
    if (seq === 0) return true;
    if (seq <= this._lastSeq) return false;
    this._lastSeq = seq;
    return true;
  }

  /** An accepted frame with `seq` has been handled: true when an ack is due now. */
  handled(seq: number): boolean {
    return seq !== 0 && this.resumable && ++this.unacked >= ACK_EVERY;
  }

  /** The `seq` to acknowledge now (the count starts again), or undefined when there is nothing to. */
  ack(): number | undefined {
    if (!this.resumable) return undefined;
    this.unacked = 0;
    return this._lastSeq;
  }
}
