/**
 * What a handler sees of its request beyond the body (the session that asked) and what
 * it asks for: effects on that session, and messages for players and other workers.
 *
 * Workers keep no session state: the gate sends the session with every request, and a
 * handler changes it only through effects, which travel back in `RpcResponse.effects`
 * and which the gate applies, in order, before it answers the client. Pushes, kicks of
 * other players and a service's own messages are published by the worker right after
 * the handler returns and before its answer, so what a handler pushed is on its way to
 * every gate before its answer is.
 *
 * A handler that needs another service awaits a call (`ctx.call`): the worker sends it
 * with the session, the request's trace and timing, and what is left of the request's
 * time, and the handler goes on with the result (docs/workers.md, "Calling other
 * services"). With timing, each call's span (and its callee's) is kept for the answer.
 */
import { clone, create, toBinary } from "@bufbuild/protobuf";
import type { DescMessage, MessageInitShape } from "@bufbuild/protobuf";
import { CallFailure, CallResult, MAX_CALL_DEPTH, MAX_CALL_SPANS, isValidRoute, noBus } from "./call.js";
import type { CallOptions, Caller } from "./call.js";
import type { CallSpan, Effect, ServerPush, Session, UserCommand } from "./gen/rpc_pb.js";
import { CallSpanSchema, EffectSchema, ServerPushSchema, SessionSchema, UserCommandSchema } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import { HandlerError } from "./errors.js";
import { isValidName, isValidSubject } from "./subjects.js";

/** A body: bytes, or text sent as UTF-8. */
export type Body = Uint8Array | string;

/** One message a handler asked to publish, not yet prefixed. */
export type Outbound =
  | { readonly kind: "group"; readonly group: string; readonly push: ServerPush }
  | { readonly kind: "user"; readonly uid: string; readonly command: UserCommand }
  | { readonly kind: "publish"; readonly subject: string; readonly payload: Uint8Array };

const encoder = new TextEncoder();

/** `body` as bytes. */
export function bytesOf(body: Body): Uint8Array {
  return typeof body === "string" ? encoder.encode(body) : body;
}

function check(what: string, name: string): void {
  if (!isValidName(name)) {
    // Names often come from a player's input: a 400, never a wider subject.
    throw HandlerError.badRequest(`invalid ${what} ${JSON.stringify(name)}: use 1..=64 of [a-z0-9_-]`);
  }
}

/** What a context gets from whoever runs its handler: how to call, and until when. */
export interface ContextOptions {
  /** Makes the handler's calls (without one, every call gets 503 `bus unavailable`). */
  readonly caller?: Caller;
  /** When the request's caller stops waiting (`performance.now()` ms), if it said. */
  readonly deadline?: number;
  /** The request's trace (`RpcRequest.trace`): the routes of the requests it was made for. */
  readonly trace?: readonly string[];
  /**
   * The request's route: the handler's calls carry `trace` and it (none for events). A
   * call whose trace would pass `MAX_CALL_DEPTH` routes is refused.
   */
  readonly route?: string;
  /**
   * Given when the request asked for timings: the handler's calls ask for them too, and
   * each call's span, followed by its callee's (a hop deeper), is appended here as its
   * result arrives, `MAX_CALL_SPANS` at most.
   */
  readonly spans?: CallSpan[];
}

/** The session of one request, and everything its handler asks for. */
export class Context {
  /** The session as the gate sent it, with this handler's own changes applied. */
  readonly session: Session;
  /** Whether the request came from a client session (false for events and direct callers). */
  readonly hasSession: boolean;
  /**
   * The key a keyed service's request was routed by (the client's explicit key, the
   * session value the service names, or the uid); `undefined` when the request carries
   * none (gates send one only to keyed services) and for events.
   */
  readonly key: string | undefined;
  /**
   * When the caller stops waiting for this request's answer, in `performance.now()`
   * milliseconds: its `timeout_ms` from when it reached the worker. `undefined` when the
   * caller did not say, and outside requests.
   */
  readonly deadline: number | undefined;
  /**
   * The routes of the requests this one was made for, outermost first
   * (`RpcRequest.trace`): empty for a gate's request, `["shop.buy"]` for a call shop.buy's
   * handler made. Empty outside requests.
   */
  readonly trace: readonly string[];
  readonly #caller: Caller;
  /** What the handler's calls carry: the request's trace and route. */
  readonly #callTrace: readonly string[];
  readonly #spans: CallSpan[] | undefined;
  readonly #effects: Effect[] = [];
  readonly #outbound: Outbound[] = [];
  readonly #changed = new Set<number>();
  #reply: Uint8Array | undefined;

  constructor(session?: Session, key?: string, options: ContextOptions = {}) {
    this.hasSession = session !== undefined;
    this.session = session ?? create(SessionSchema);
    this.key = key === "" ? undefined : key;
    this.deadline = options.deadline;
    this.#caller = options.caller ?? noBus;
    this.trace = options.trace ?? [];
    this.#callTrace = options.route === undefined ? [] : [...this.trace, options.route];
    this.#spans = options.spans;
  }

  /** The gate holding the session. */
  get gate(): string {
    return this.session.gate;
  }

  /** The session's id, unique within its gate. */
  get sid(): bigint {
    return this.session.sid;
  }

  /** The bound user id, or `undefined` before a handler bound one. */
  get uid(): string | undefined {
    return this.session.uid === "" ? undefined : this.session.uid;
  }

  /** One value of the session's data. */
  data(key: string): string | undefined {
    return this.session.data[key];
  }

  /** Binds the session to user `uid` (login): pushes for `uid` then reach it. */
  bindUid(uid: string): void {
    this.session.uid = uid;
    this.#effect({ case: "bindUid", value: uid });
  }

  /** Stores `key = value` in the session; sent with every later request. */
  setData(key: string, value: string): void {
    this.session.data[key] = value;
    this.#effect({ case: "setData", value: { $typeName: "shaddock.rpc.SetData", key, value } });
  }

  /** Removes `key` from the session's data. */
  clearData(key: string): void {
    delete this.session.data[key];
    this.#effect({ case: "clearData", value: key });
  }

  /** Adds the session to `group`: it then receives what is pushed to the group. */
  join(group: string): void {
    this.#effect({ case: "join", value: group });
  }

  /** Removes the session from `group`. */
  leave(group: string): void {
    this.#effect({ case: "leave", value: group });
  }

  /** Closes this session after the answer, telling the client `reason`. */
  kick(reason: string): void {
    this.#effect({ case: "kick", value: reason });
  }

  /** Pushes `route` and `body` to every member of `group`, on every gate. */
  broadcast(group: string, route: string, body: Body): void {
    check("group", group);
    const push = create(ServerPushSchema, { route, body: bytesOf(body) });
    this.#outbound.push({ kind: "group", group, push });
  }

  /** Pushes `route` and `body` to player `uid` wherever it is bound (dropped when it is not). */
  pushToUser(uid: string, route: string, body: Body): void {
    check("uid", uid);
    const push = create(ServerPushSchema, { route, body: bytesOf(body) });
    const command = create(UserCommandSchema, { kind: { case: "push", value: push } });
    this.#outbound.push({ kind: "user", uid, command });
  }

  /** Closes player `uid`'s session wherever it is, telling the client `reason`. */
  kickUser(uid: string, reason: string): void {
    check("uid", uid);
    const command = create(UserCommandSchema, { kind: { case: "kick", value: reason } });
    this.#outbound.push({ kind: "user", uid, command });
  }

  /** Publishes `payload` on `<prefix>.<subject>`, a subject of the service's own. */
  publish(subject: string, payload: Body): void {
    if (!isValidSubject(subject)) {
      throw HandlerError.badRequest(`invalid subject ${JSON.stringify(subject)}`);
    }
    this.#outbound.push({ kind: "publish", subject, payload: bytesOf(payload) });
  }

  /**
   * Calls `route` (`service.method`) of another service with `body`, and resolves with
   * what came back: the callee's answer, or the worker's own 503 (no worker of the
   * service, too many calls in flight, no bus), 408 (no answer in time), 400 (a route
   * that is not `service.method`; a keyed callee and no key, or one too long) or 500
   * (calls nested deeper than `MAX_CALL_DEPTH`). It never rejects, and nothing is
   * retried.
   *
   * The call goes out at once, carrying this context's session as it is now (its own
   * changes included), the request's trace and route, its timing, and what is left of
   * its deadline less the worker's `callMarginMs`, so the handler can still answer in
   * time (the worker's call timeout when there is none, as in an event;
   * `options.timeoutMs` waits less). A call
   * to a keyed service goes to its key's partition: `options.key`, else the session value
   * the service names, else the uid. While a handler waits on a call the worker serves
   * other requests; the result comes back as a turn of its loop, in the order results
   * arrive (see `Worker`).
   *
   * ```ts
   * .rawMethod("buy", async (ctx, body) => (await ctx.call("bank.pay", body)).orThrow())
   * .rawMethod("move", async (ctx, body) => (await ctx.call("arena.input", body, { key: "m1" })).orThrow())
   * ```
   */
  call(route: string, body: Body = new Uint8Array(), options: CallOptions = {}): Promise<CallResult> {
    if (!isValidRoute(route)) {
      return Promise.resolve(this.#refused(route, Status.BAD_REQUEST, CallFailure.BAD_ROUTE));
    }
    if (this.#callTrace.length > MAX_CALL_DEPTH) {
      return Promise.resolve(this.#refused(route, Status.HANDLER_ERROR, CallFailure.TOO_DEEP));
    }
    const session = this.hasSession ? clone(SessionSchema, this.session) : undefined;
    const spans = this.#spans;
    const started = performance.now();
    const result = this.#caller({
      route,
      body: bytesOf(body),
      session,
      deadline: this.deadline,
      key: options.key,
      timeoutMs: options.timeoutMs,
      trace: this.#callTrace,
      timing: spans !== undefined,
    });
    if (spans === undefined) return result;
    return result.then((done) => {
      record(spans, route, done, done.refused ? 0 : micros(performance.now() - started));
      return done;
    });
  }

  /** `call` with a message of type `schema`, encoded; `CallResult.decode` reads a typed answer. */
  callWith<Req extends DescMessage>(
    route: string,
    schema: Req,
    message: MessageInitShape<Req>,
    options: CallOptions = {},
  ): Promise<CallResult> {
    return this.call(route, toBinary(schema, create(schema, message)), options);
  }

  /**
   * Says this handler changed keyed `partition`'s state, so its standby gets the
   * partition's snapshot before this batch's answers and pushes leave (docs/workers.md,
   * "Standbys"). A keyed request's own partition, and a take-over's, are marked by
   * themselves; ticks, events and continuations that change another say so here.
   */
  changed(partition: number): void {
    this.#changed.add(partition);
  }

  /** The partitions this handler said it changed. */
  get changedPartitions(): readonly number[] {
    return [...this.#changed];
  }

  /** Answers the event being handled, when its sender asked for an answer. */
  reply(body: Body): void {
    this.#reply = bytesOf(body);
  }

  /** The effects asked for so far, in order. */
  get effects(): readonly Effect[] {
    return this.#effects;
  }

  /** The messages to publish asked for so far, in order. */
  get outbound(): readonly Outbound[] {
    return this.#outbound;
  }

  /** The answer to an event, if the handler gave one. */
  get replyBody(): Uint8Array | undefined {
    return this.#reply;
  }

  /** A call refused before it reached the caller: its span, at once. */
  #refused(route: string, code: number, message: string): CallResult {
    const result = CallResult.refusal(code, message);
    if (this.#spans !== undefined) record(this.#spans, route, result, 0);
    return result;
  }

  #effect(kind: Effect["kind"]): void {
    this.#effects.push(create(EffectSchema, { kind }));
  }
}

/** The largest duration a span carries (a uint32). */
const MAX_US = 0xffff_ffff;

function micros(ms: number): number {
  return Math.min(MAX_US, Math.max(0, Math.round(ms * 1000)));
}

/**
 * Appends a call's span (hop 1) to `spans`, then the spans its callee reported, a hop
 * deeper each, while `spans` has room for them (`MAX_CALL_SPANS`).
 */
function record(spans: CallSpan[], route: string, result: CallResult, us: number): void {
  if (spans.length >= MAX_CALL_SPANS) return;
  spans.push(create(CallSpanSchema, { route, code: result.code, us, hop: 1 }));
  for (const nested of result.calls) {
    if (spans.length >= MAX_CALL_SPANS) return;
    const hop = Math.min(MAX_US, nested.hop + 1);
    spans.push(create(CallSpanSchema, { route: nested.route, code: nested.code, us: nested.us, hop }));
  }
}
