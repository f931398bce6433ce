/**
 * The worker's side of calls between services (docs/workers.md, "Calling other
 * services"): where they go, and how their results come back.
 *
 * A call for route `service.method` is an `RpcRequest` published on
 * `<prefix>.svc.<service>.<method>`, the subject a gate's request for that route takes
 * (for a keyed service, its key's partition's: `routes.ts`), with reply subject
 * `<prefix>.call.<worker id>.<call id>`. The worker subscribes
 * `<prefix>.call.<worker id>.*` plainly (its id is random per start, so no other worker
 * shares it) and hands each answer to whoever made the call whose id is the last token;
 * the bus's "no responders" (no worker of that service) is a 503. The request carries
 * the caller's session, its trace and timing, and, as `timeout_ms`, what is left of the
 * caller's deadline (or the call timeout), and the call times out then. The callee's
 * answer comes back with the spans it reported (`RpcResponse.calls`). At most
 * `maxCalls` are in flight.
 *
 * A call to a keyed service carries its order (docs/workers.md, "Hand-over"): `origin`
 * `<prefix>.call.<worker id>`, and as `seq` its call id, which rises with each call in
 * the order they are published.
 */
import { randomBytes } from "node:crypto";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { CallFailure, CallResult } from "./call.js";
import type { OutgoingCall } from "./call.js";
import type { Deadlines, Due } from "./deadlines.js";
import { Routes } from "./routes.js";
import type { KeyedRoute } from "./routes.js";
import { RpcRequestSchema, RpcResponseSchema } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";

/** Default for `WorkerOptions.maxCalls`. */
export const DEFAULT_MAX_CALLS = 1024;
/** Default for `WorkerOptions.callTimeoutMs`. */
export const DEFAULT_CALL_TIMEOUT_MS = 5_000;
/**
 * Default for `WorkerOptions.callMarginMs`: how much sooner than its caller's deadline a
 * call times out. The caller's deadline is the gate's, whose 408 an answer made at it
 * would follow; this leaves the handler's answer (its fallback) time to reach the gate.
 */
export const DEFAULT_CALL_MARGIN_MS = 250;
/** The most `timeout_ms` carries (a uint32). */
const MAX_TIMEOUT_MS = 0xffff_ffff;

/** A call in flight: who gets its result, and its deadline. */
interface InFlight {
  readonly deliver: (result: CallResult) => void;
  readonly due: Due;
}

/** A worker's calls in flight, and the subscription their answers come back on. */
export class Calls {
  readonly #nc: NatsConnection;
  readonly #routes: Routes;
  /** `<prefix>.call.<worker id>`: a keyed call's `origin`. */
  readonly #origin: string;
  /** `<prefix>.call.<worker id>.`: a call's reply subject is this and its id. */
  readonly #replyPrefix: string;
  readonly #max: number;
  readonly #timeoutMs: number;
  readonly #marginMs: number;
  readonly #deadlines: Deadlines;
  readonly #inFlight = new Map<number, InFlight>();
  #next = 1;
  #sub: Subscription | undefined;

  constructor(
    nc: NatsConnection,
    prefix: string,
    limits: { max: number; timeoutMs: number; marginMs: number },
    deadlines: Deadlines,
  ) {
    this.#nc = nc;
    this.#routes = new Routes(nc, prefix);
    this.#origin = `${prefix}.call.${randomBytes(8).toString("hex")}`;
    this.#replyPrefix = `${this.#origin}.`;
    this.#max = limits.max;
    this.#timeoutMs = limits.timeoutMs;
    this.#marginMs = limits.marginMs;
    this.#deadlines = deadlines;
  }

  /**
   * Subscribes the reply subjects, and the announcements that say which services are
   * keyed (asking for them); the caller flushes.
   */
  subscribe(): void {
    this.#routes.subscribe();
    this.#sub = this.#nc.subscribe(`${this.#replyPrefix}*`, {
      callback: (error, msg) => {
        if (error === null) this.#returned(msg);
      },
    });
  }

  /** Calls in flight. */
  get size(): number {
    return this.#inFlight.size;
  }

  /** The keyed services heard of so far, by name: calls to them are routed by key. */
  get keyed(): ReadonlyMap<string, KeyedRoute> {
    return this.#routes.keyed;
  }

  /**
   * Sends `call`; `deliver` gets its result later, exactly once. Returns the result at
   * once instead, without sending, when the call is refused: 503 over `max` calls in
   * flight or without a bus, 408 when no more than the margin is left of the caller's
   * deadline, 400 for a keyed callee without a usable key.
   */
  start(call: OutgoingCall, deliver: (result: CallResult) => void): CallResult | undefined {
    const now = performance.now();
    const { deadline, left } = this.#deadlineOf(call, now);
    const destination = this.#routes.destination(call);
    if (destination instanceof CallResult) return destination;
    if (this.#inFlight.size >= this.#max) return CallResult.refusal(Status.UNAVAILABLE, CallFailure.TOO_MANY);
    if (left <= 0) return CallResult.refusal(Status.TIMEOUT, CallFailure.TIMED_OUT);
    // Published at once, in id order: the id is a keyed call's `seq`.
    const id = this.#next++;
    const keyed = destination.key !== undefined;
    const request = create(RpcRequestSchema, {
      route: call.route,
      body: call.body,
      session: call.session,
      timing: call.timing,
      key: destination.key ?? "",
      // Whole milliseconds, rounded up: at least 1, since 0 says "unknown".
      timeoutMs: Math.min(MAX_TIMEOUT_MS, Math.ceil(left)),
      trace: [...call.trace],
      origin: keyed ? this.#origin : "",
      seq: keyed ? BigInt(id) : 0n,
    });
    try {
      this.#nc.publish(destination.subject, toBinary(RpcRequestSchema, request), {
        reply: `${this.#replyPrefix}${id}`,
      });
    } catch {
      // The connection is closed or draining.
      return CallResult.refusal(Status.UNAVAILABLE, CallFailure.NO_BUS);
    }
    const due = this.#deadlines.add("call", deadline, () =>
      this.#finish(id, CallResult.error(Status.TIMEOUT, CallFailure.TIMED_OUT)),
    );
    this.#inFlight.set(id, { deliver, due });
    return undefined;
  }

  /**
   * When a call made at `now` times out, and how long that leaves it: at its own
   * timeout (`callTimeoutMs` if it has none and its caller no deadline), and never later
   * than the caller's deadline less the margin, so the handler still answers in time.
   */
  #deadlineOf(call: OutgoingCall, now: number): { deadline: number; left: number } {
    const own = call.timeoutMs ?? (call.deadline === undefined ? this.#timeoutMs : Number.POSITIVE_INFINITY);
    if (call.deadline !== undefined) {
      const cap = call.deadline - this.#marginMs;
      if (cap <= now + own) return { deadline: cap, left: cap - now };
    }
    // Not `deadline - now`: (now + t) - now may round to a hair over t.
    return { deadline: now + own, left: own };
  }

  /** Unsubscribes; calls still in flight get no result. */
  close(): void {
    this.#sub?.unsubscribe();
    this.#routes.close();
    for (const { due } of this.#inFlight.values()) this.#deadlines.remove(due);
    this.#inFlight.clear();
  }

  #returned(msg: Msg): void {
    const id = Number(msg.subject.slice(this.#replyPrefix.length));
    if (msg.data.length === 0 && msg.headers?.code === Status.UNAVAILABLE) {
      this.#finish(id, CallResult.error(Status.UNAVAILABLE, CallFailure.NO_WORKER));
      return;
    }
    let result: CallResult;
    try {
      const response = fromBinary(RpcResponseSchema, msg.data);
      // An empty payload that is not the no-responders status decodes with code 0.
      result =
        response.code === 0
          ? CallResult.error(Status.HANDLER_ERROR, CallFailure.MALFORMED_NO_CODE)
          : new CallResult(response.code, response.body, response.message, response.calls);
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      result = CallResult.error(Status.HANDLER_ERROR, `malformed answer to a call: ${why}`);
    }
    this.#finish(id, result);
  }

  /** Hands call `id` its result, unless it has had one (a late or repeated answer is dropped). */
  #finish(id: number, result: CallResult): void {
    const call = this.#inFlight.get(id);
    if (call === undefined) return;
    this.#inFlight.delete(id);
    this.#deadlines.remove(call.due);
    call.deliver(result);
  }
}
