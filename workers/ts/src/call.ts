/**
 * A call to another service as a handler sees it (docs/workers.md, "Calling other
 * services"): what it asks for (`OutgoingCall`), who makes it (`Caller`: the worker, or
 * a test's stand-in), and what comes back (`CallResult`). The worker's side, subjects
 * and deadlines, is `calls.ts`.
 */
import { fromBinary } from "@bufbuild/protobuf";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { HandlerError } from "./errors.js";
import type { CallSpan, Session } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import { isValidName } from "./subjects.js";

/**
 * The most routes a call's trace may hold (docs/workers.md, "Calling other services"):
 * a call made for a request whose trace already holds this many, counting the request's
 * own route, is refused with 500 `CallFailure.TOO_DEEP`. A cycle of calls ends there.
 */
export const MAX_CALL_DEPTH = 8;
/** The most `CallSpan`s one `RpcResponse.calls` holds; the rest are dropped (timing only). */
export const MAX_CALL_SPANS = 32;
/** The longest key a keyed service's call may be routed by, in UTF-8 bytes (the gates' bound). */
export const MAX_KEY_LEN = 256;

/** The results a calling worker makes itself, when the callee gave none. */
export const CallFailure = {
  /** 503: no worker of the service was subscribed (the bus's no-responders). */
  NO_WORKER: "no worker available now",
  /** 503: the worker has `maxCalls` calls in flight already. */
  TOO_MANY: "too many calls in flight",
  /** 503: the call could not be published (or there is no bus: a service called directly). */
  NO_BUS: "bus unavailable",
  /** 500: the answer has no status code (code 0; an empty payload decodes so). */
  MALFORMED_NO_CODE: "malformed answer to a call: no status code",
  /** 408: no answer by the call's deadline. */
  TIMED_OUT: "call timed out",
  /** 400: the route is not two names. */
  BAD_ROUTE: "a call's route is service.method",
  /** 400: the callee is keyed, and the call has no key: none given, no session value, no uid. */
  NO_KEY: "keyed route: give a key, or log in first",
  /** 400: the key is longer than `MAX_KEY_LEN` bytes. */
  KEY_TOO_LONG: "key too long",
  /** 500: the call's trace would pass `MAX_CALL_DEPTH` routes. */
  TOO_DEEP: `calls nested deeper than ${MAX_CALL_DEPTH}: a cycle of calls?`,
} as const;

/** How a call is made, beyond its route and body. */
export interface CallOptions {
  /**
   * The key to route a call to a keyed service by, first of all (else the caller's
   * session value the service names, else its uid). Ignored for other services; empty
   * counts as none.
   */
  readonly key?: string;
  /**
   * The most the call waits for its answer, ms (then 408 `call timed out`): for a
   * handler that must still answer with a fallback when the call fails. Never past the
   * caller's deadline less the worker's `callMarginMs`, whatever is asked; without it the
   * call waits until then (`callTimeoutMs` when the caller has no deadline).
   */
  readonly timeoutMs?: number;
}

/** A call as a handler asked for it, for the worker to send. */
export interface OutgoingCall {
  /** `service.method`, checked. */
  readonly route: string;
  readonly body: Uint8Array;
  /** The caller's session, with its own changes so far; none outside a client's request. */
  readonly session: Session | undefined;
  /** When the caller's own caller stops waiting (`performance.now()` ms), if it said. */
  readonly deadline: number | undefined;
  /** The key the caller gave, for a keyed callee (`CallOptions.key`); empty or `undefined`: none. */
  readonly key: string | undefined;
  /** The call's own timeout, ms (`CallOptions.timeoutMs`), if it has one. */
  readonly timeoutMs: number | undefined;
  /** The routes of the requests the call is made for, outermost first (`RpcRequest.trace`). */
  readonly trace: readonly string[];
  /** Whether the request it is made for asked for timings (`RpcRequest.timing`). */
  readonly timing: boolean;
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
 * 400, 500). Nothing is retried: the handler decides.
 */
export class CallResult {
  constructor(
    /** The callee's status (200 when handled), or the worker's 503, 408, 400 or 500. */
    readonly code: number,
    readonly body: Uint8Array,
    readonly message: string,
    /** The calls the callee made for this one, as it reported them (`RpcResponse.calls`: with timing only). */
    readonly calls: readonly CallSpan[] = [],
    /** The worker refused the call at once: it never went out (its span then takes 0 µs). */
    readonly refused = false,
  ) {}

  /** A result the worker makes itself, for a call that went out (a timeout, no worker). */
  static error(code: number, message: string): CallResult {
    return new CallResult(code, new Uint8Array(), message);
  }

  /** A result the worker makes at once, for a call it did not send. */
  static refusal(code: number, message: string): CallResult {
    return new CallResult(code, new Uint8Array(), message, [], true);
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
export const noBus: Caller = () => Promise.resolve(CallResult.refusal(Status.UNAVAILABLE, CallFailure.NO_BUS));
