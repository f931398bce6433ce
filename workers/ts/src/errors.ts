/**
 * Status codes a worker answers with (HTTP's meanings, as the gates use them), and the
 * error a handler throws to answer with one.
 */

/** The codes of `RpcResponse.code` a worker uses. */
export const Code = {
  OK: 200,
  BAD_REQUEST: 400,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  HANDLER_ERROR: 500,
  OVERLOADED: 503,
} as const;

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
    return new HandlerError(Code.BAD_REQUEST, message);
  }

  /** 403: the session may not do this. */
  static forbidden(message: string): HandlerError {
    return new HandlerError(Code.FORBIDDEN, message);
  }
}
