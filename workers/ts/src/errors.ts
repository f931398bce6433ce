/**
 * The error a handler throws to answer with a status code: `Status`, generated from
 * proto/proto/status.proto (HTTP's meanings, as the gates use them), or any other.
 */
import { Status } from "./gen/status_pb.js";

/**
 * Thrown by a handler to answer with `code` and `message` instead of a body. Anything
 * else a handler throws is answered 500. Either way the handler's effects and pushes
 * are dropped: a request either succeeds with its effects or changes nothing.
 */
export class HandlerError extends Error {
  override readonly name = "HandlerError";

  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }

  /** 400: the request is malformed. */
  static badRequest(message: string): HandlerError {
    return new HandlerError(Status.BAD_REQUEST, message);
  }

  /** 403: the session may not do this. */
  static forbidden(message: string): HandlerError {
    return new HandlerError(Status.FORBIDDEN, message);
  }
}
