/**
 * A call to another service as a handler sees it (docs/workers.md, "Calling other
 * services"): what it asks for (`OutgoingCall`), who makes it (`Caller`: the worker, or
 * a test's stand-in), and what comes back (`CallResult`). The worker's side, subjects
 * and deadlines, is `calls.ts`.
 */
import { fromBinary } from "@bufbuild/protobuf";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { HandlerError } from "./errors.js";
import type { Session } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import { isValidName } from "./subjects.js";

/** The results a calling worker makes itself, when the callee gave none. */
export const CallFailure = {
  /** 503: no worker of the service was subscribed (the bus's no-responders). */
  NO_WORKER: "no worker available now",
  /** 503: the worker has `maxCalls` calls in flight already. */
  TOO_MANY: "too many calls in flight",
  /** 503: the call could not be published (or there is no bus: a service called directly). */
  NO_BUS: "bus unavailable",
  /** 408: no answer by the call's deadline. */
  TIMED_OUT: "call timed out",
  /** 400: the route is not two names. */
  BAD_ROUTE: "a call's route is service.method",
} as const;

/** A call as a handler asked for it, for the worker to send. */
export interface OutgoingCall {
  /** `service.method`, checked. */
  readonly route: string;
  readonly body: Uint8Array;
  /** The caller's session, with its own changes so far; none outside a client's request. */
  readonly session: Session | undefined;
  /** When the caller's own caller stops waiting (`performance.now()` ms), if it said. */
  readonly deadline: number | undefined;
}

/** Makes a handler's calls: the worker's, or a test's stand-in. It never rejects. */
export type Caller = (call: OutgoingCall) => Promise<CallResult>;

/** Whether `route` is `service.method`, two valid names. */
export function isValidRoute(route: string): boolean {
  const dot = route.indexOf(".");
  return dot > 0 && isValidName(route.slice(0, dot)) && isValidName(route.slice(dot + 1));
}

/**
 * What a call came back with: the callee's answer (its `RpcResponse` code, body and
 * message), or the calling worker's own when there was none (`CallFailure`: 503, 408,
 * 400). Nothing is retried: the handler decides.
 */
export class CallResult {
  constructor(
    /** The callee's status (200 when handled), or the worker's 503, 408 or 400. */
    readonly code: number,
    readonly body: Uint8Array,
    readonly message: string,
  ) {}

  /** A result the worker makes itself. */
  static error(code: number, message: string): CallResult {
    return new CallResult(code, new Uint8Array(), message);
  }

  /** Whether the callee handled the call (200). */
  get ok(): boolean {
    return this.code === Status.OK;
  }

  /**
   * The body of a 200; anything else is thrown as a `HandlerError` with the same code
   * and message, so a handler that lets it go answers with the callee's failure as it is.
   */
  orThrow(): Uint8Array {
    if (!this.ok) throw new HandlerError(this.code, this.message);
    return this.body;
  }

  /** The body of a 200 decoded as `schema`; a failure thrown as by `orThrow`, a body that does not decode as a 500. */
  decode<T extends DescMessage>(schema: T): MessageShape<T> {
    const body = this.orThrow();
    try {
      return fromBinary(schema, body);
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      throw new HandlerError(Status.HANDLER_ERROR, `bad answer from a call: ${why}`);
    }
  }
}

/** The caller of a context no worker serves: there is no bus to call on. */
export const noBus: Caller = () => Promise.resolve(CallResult.error(Status.UNAVAILABLE, CallFailure.NO_BUS));
