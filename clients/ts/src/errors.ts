/**
 * The one error type the SDK rejects with.
 *
 * Its codes are the gate's: `Status`, generated from proto/proto/status.proto (HTTP's
 * meanings; each value says who sends it and whether to retry). Errors the client makes
 * itself use the same codes, so a caller switches on one number either way:
 * 408 for a local timeout, 503 when the connection is lost or the client is closed,
 * 429 when too many requests are pending, 400 for a body the session cannot carry and
 * 500 for an answer whose body does not decode.
 */

/**
 * The message of a draining gate's 503 for a request it did not forward: safe to send
 * again on another gate, which the client does itself.
 */
export const DRAINING_MESSAGE = "gate draining";

/** A request that did not succeed: the gate's or worker's code and message, or the client's own. */
export class ShaddockError extends Error {
  override readonly name = "ShaddockError";

  /**
   * @param code the status code (a number, so codes this SDK does not list still arrive)
   * @param message why, as the gate, the worker or the client said it
   * @param local true when the client made this error itself (timeout, lost connection)
   * @param route the request's route, when the error belongs to a request
   */
  constructor(
    readonly code: number,
    message: string,
    readonly local = false,
    readonly route?: string,
  ) {
    super(route === undefined ? `${code} ${message}` : `${route}: ${code} ${message}`);
    this.reason = message;
  }

  /** The message alone, without the code and route. */
  readonly reason: string;
}

/**
 * Bad input from the server: a frame that does not decode, a packet kind a client does
 * not expect. The client closes the connection with this as its reason.
 */
export class ProtocolError extends Error {
  override readonly name = "ProtocolError";
}
