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
 * with the session and what is left of the request's time, and the handler goes on with
 * the result (docs/workers.md, "Calling other services").
 */
import { clone, create, toBinary } from "@bufbuild/protobuf";
import type { DescMessage, MessageInitShape } from "@bufbuild/protobuf";
import { CallFailure, CallResult, isValidRoute, noBus } from "./call.js";
import type { Caller } from "./call.js";
import type { Effect, ServerPush, Session, UserCommand } from "./gen/rpc_pb.js";
import { EffectSchema, ServerPushSchema, SessionSchema, UserCommandSchema } from "./gen/rpc_pb.js";
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
  readonly #caller: Caller;
  readonly #effects: Effect[] = [];
  readonly #outbound: Outbound[] = [];
  #reply: Uint8Array | undefined;

  constructor(session?: Session, key?: string, options: ContextOptions = {}) {
    this.hasSession = session !== undefined;
    this.session = session ?? create(SessionSchema);
    this.key = key === "" ? undefined : key;
    this.deadline = options.deadline;
    this.#caller = options.caller ?? noBus;
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
   * service, too many calls in flight, no bus), 408 (no answer in time) or 400 (a route
   * that is not `service.method`). It never rejects, and nothing is retried.
   *
   * The call goes out at once, carrying this context's session as it is now (its own
   * changes included) and what is left of the request's deadline (the worker's call
   * timeout when there is none, as in an event). While a handler waits on a call the
   * worker serves other requests; the result comes back as a turn of its loop, in the
   * order results arrive (see `Worker`).
   *
   * ```ts
   * .rawMethod("buy", async (ctx, body) => (await ctx.call("bank.pay", body)).orThrow())
   * ```
   */
  call(route: string, body: Body = new Uint8Array()): Promise<CallResult> {
    if (!isValidRoute(route)) {
      return Promise.resolve(CallResult.error(Status.BAD_REQUEST, CallFailure.BAD_ROUTE));
    }
    const session = this.hasSession ? clone(SessionSchema, this.session) : undefined;
    return this.#caller({ route, body: bytesOf(body), session, deadline: this.deadline });
  }

  /** `call` with a message of type `schema`, encoded; `CallResult.decode` reads a typed answer. */
  callWith<Req extends DescMessage>(route: string, schema: Req, message: MessageInitShape<Req>): Promise<CallResult> {
    return this.call(route, toBinary(schema, create(schema, message)));
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

  #effect(kind: Effect["kind"]): void {
    this.#effects.push(create(EffectSchema, { kind }));
  }
}
