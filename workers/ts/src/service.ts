/**
 * A service: a name, handlers by method (typed with generated protobuf schemas, or raw
 * bytes), the pushes it declares, and handlers for events on subjects of its choosing.
 *
 * A `Service` is plain data and functions with no I/O: `call` turns an `RpcRequest` for a
 * method into an `RpcResponse` plus what to publish before it, so a service can be tested
 * by calling it. The `Worker` decides when calls happen and where requests come from.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { DescFile, DescMessage, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { HandlerError } from "./errors.js";
import { Context, bytesOf } from "./context.js";
import type { Body, ContextOptions, Outbound } from "./context.js";
import type { RpcRequest, RpcResponse, ServiceSchema, SessionClosed } from "./gen/rpc_pb.js";
import {
  KeyedSchema,
  MethodSchemaSchema,
  PushSchemaSchema,
  RpcRequestSchema,
  RpcResponseSchema,
  ServiceSchemaSchema,
  SessionClosedSchema,
} from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import { MAX_PARTITIONS } from "./ownership.js";
import { isValidName, isValidSubject } from "./subjects.js";

/** Longest route (`service.method`, or a push's `service.name`): the gates' bound. */
const MAX_ROUTE_LEN = 64;

/** What a handler may return: a value, or a promise of one. */
export type Awaitable<T> = T | Promise<T>;

/** A typed handler: the decoded request in, the response (or its init shape) out. */
export type TypedHandler<Req extends DescMessage, Resp extends DescMessage> = (
  ctx: Context,
  request: MessageShape<Req>,
) => Awaitable<MessageInitShape<Resp>>;

/** A raw handler: the body's bytes in, the answer's bytes (or text) out. */
export type RawHandler = (ctx: Context, body: Uint8Array) => Awaitable<Body>;

/** An event handler: the message's payload, a context without a session. */
export type EventHandler = (ctx: Context, payload: Uint8Array) => Awaitable<void>;

/**
 * Who gets an event: `"queue"`, one worker of the service (its queue group), or `"all"`,
 * every worker.
 */
export type Delivery = "queue" | "all";

/** What a request's handling produced: the answer, and what to publish first. */
export interface Handled {
  readonly response: RpcResponse;
  /** Pushes and messages the handler asked for, in order; empty when it failed. */
  readonly outbound: readonly Outbound[];
  /** The keyed partitions the handler said it changed (`ctx.changed`), even when it failed. */
  readonly changed?: readonly number[];
}

/** What an event's handling produced. */
export interface EventHandled {
  readonly ok: boolean;
  readonly outbound: readonly Outbound[];
  /** The answer, for an event whose sender asked for one. */
  readonly reply: Uint8Array | undefined;
  /** The keyed partitions the handler said it changed (`ctx.changed`), even when it failed. */
  readonly changed?: readonly number[];
}

/**
 * What makes a service keyed (docs/workers.md, "Keyed services"): its requests are
 * routed by key to partitions, each owned by one worker, and a partition's state moves
 * with it when workers come and go.
 */
export interface KeyedOptions {
  /**
   * How many partitions keys spread over, 1 to 1024. More spread keys more evenly over
   * more workers; each costs a subscription and is a unit of hand-over. 64 suits a
   * handful of workers.
   */
  readonly partitions: number;
  /**
   * The session value a request's key comes from when the client gives none (a handler
   * sets it with `ctx.setData`, e.g. the match a player joined); without it, or when the
   * session lacks it, the player's uid.
   */
  readonly sessionKey?: string;
  /**
   * Gives `partition`'s state when it moves to another worker, after the partition's
   * last request here, and forgets it. Without it the state handed over is empty.
   */
  readonly handOver?: (ctx: Context, partition: number) => Awaitable<Body>;
  /**
   * Takes `partition` on, before its first request here: with the state its old owner
   * handed over, or `undefined` when it starts fresh (nobody held it before, or its
   * holder died), so the service can answer "match lost" or rebuild from its own store.
   */
  readonly takeOver?: (ctx: Context, partition: number, state: Uint8Array | undefined) => Awaitable<void>;
  /**
   * Gives `partition`'s whole state as it is now, without forgetting it: the same bytes
   * `handOver` would give. With it the partitions have **standbys** (docs/workers.md,
   * "Standbys"): after each batch of work the worker snapshots the partitions it
   * changed (a keyed request's own, a take-over's, and those a handler marked with
   * `ctx.changed`) and sends them to each partition's standby before the batch's
   * answers and pushes leave; when the owner dies, its standby takes the partition with
   * the last snapshot through `takeOver`. Without it, a crash loses the partition's
   * state (taken fresh).
   */
  readonly snapshot?: (partition: number) => Awaitable<Body>;
}

/** What a partition's hand-over produced: its state, and what the callback published. */
export interface HandedOver {
  readonly ok: boolean;
  /** The partition's state (empty when the callback failed or there is none). */
  readonly state: Uint8Array;
  readonly outbound: readonly Outbound[];
}

interface Method {
  readonly call: (ctx: Context, body: Uint8Array) => Promise<Uint8Array>;
  readonly types: { readonly request: DescMessage; readonly response: DescMessage } | undefined;
}

interface Event {
  readonly subject: string;
  readonly delivery: Delivery;
  readonly handler: EventHandler;
}

/** An answer with a status and a message only. */
export function errorResponse(code: number, message: string): RpcResponse {
  return create(RpcResponseSchema, { code, message });
}

/**
 * A named set of handlers.
 *
 * ```ts
 * const echo = new Service("echo")
 *   .method("echo", EchoRequestSchema, EchoResponseSchema, (_ctx, req) => ({ body: req.body }))
 *   .rawMethod("raw", (_ctx, body) => body);
 * ```
 *
 * Registration is setup code: it throws on a programming error (an invalid or duplicate
 * name), never on anything a peer sends.
 */
export class Service {
  readonly #methods = new Map<string, Method>();
  readonly #events: Event[] = [];
  readonly #pushes: { route: string; type: DescMessage }[] = [];
  #keyed: KeyedOptions | undefined;

  constructor(readonly name: string) {
    if (!isValidName(name)) {
      throw new Error(`invalid service name ${JSON.stringify(name)}: use 1..=64 of [a-z0-9_-]`);
    }
  }

  /**
   * Registers a typed handler: the body is decoded as `request` (a body that does not
   * decode is answered 400 without calling the handler) and what it returns is encoded
   * as `response`. Typed methods are announced to the gates, which then give JSON
   * clients JSON bodies for them.
   */
  method<Req extends DescMessage, Resp extends DescMessage>(
    name: string,
    request: Req,
    response: Resp,
    handler: TypedHandler<Req, Resp>,
  ): this {
    return this.#add(name, { request, response }, async (ctx, body) => {
      let decoded: MessageShape<Req>;
      try {
        decoded = fromBinary(request, body);
      } catch (error) {
        throw HandlerError.badRequest(`bad request body: ${messageOf(error)}`);
      }
      const answer = await handler(ctx, decoded);
      return toBinary(response, create(response, answer));
    });
  }

  /** Registers a handler of raw bytes: its bodies pass through the gates as they are. */
  rawMethod(name: string, handler: RawHandler): this {
    return this.#add(name, undefined, async (ctx, body) => bytesOf(await handler(ctx, body)));
  }

  /**
   * Declares that pushes on `route` (`<service>.<name>`) carry a `type`, for JSON clients.
   * Throws when `route` is not this service's (`chat.message` for service `chat`: the
   * gates would refuse the whole announcement), or is declared twice.
   */
  push(route: string, type: DescMessage): this {
    const name = route.startsWith(`${this.name}.`) ? route.slice(this.name.length + 1) : "";
    if (!isValidName(name) || route.length > MAX_ROUTE_LEN) {
      throw new Error(
        `invalid push route ${JSON.stringify(route)} in service ${this.name}: use ${this.name}.<name>, ` +
          `<name> of [a-z0-9_-], the route at most ${MAX_ROUTE_LEN} bytes`,
      );
    }
    if (this.#pushes.some((p) => p.route === route)) {
      throw new Error(`push route ${JSON.stringify(route)} declared twice in service ${this.name}`);
    }
    this.#pushes.push({ route, type });
    return this;
  }

  /**
   * Registers `handler` for messages on `<prefix>.<subject>`, delivered to one worker of
   * the service (`"queue"`) or to every worker (`"all"`). Events share the request queue
   * but are never rejected: the worker waits for room instead.
   */
  onEvent(subject: string, delivery: Delivery, handler: EventHandler): this {
    if (!isValidSubject(subject)) {
      throw new Error(`invalid event subject ${JSON.stringify(subject)}`);
    }
    if (this.#events.some((e) => e.subject === subject)) {
      throw new Error(`event subject ${JSON.stringify(subject)} registered twice`);
    }
    this.#events.push({ subject, delivery, handler });
    return this;
  }

  /** Handles the gates' `SessionClosed` events, one worker of the service per close. */
  onSessionClosed(handler: (ctx: Context, closed: SessionClosed) => Awaitable<void>): this {
    return this.onEvent("evt.session.closed", "queue", (ctx, payload) =>
      handler(ctx, fromBinary(SessionClosedSchema, payload)),
    );
  }

  /**
   * Makes the service keyed (see `KeyedOptions`): every request with the same key
   * reaches the one worker that owns the key's partition, in the order its gate sent
   * it, and the handlers see the key as `ctx.key`. A request without a key (from a gate
   * that has not learnt yet that the service is keyed) is answered 503, and retried.
   *
   * ```ts
   * new Service("arena")
   *   .keyed({
   *     partitions: 64,
   *     sessionKey: "arena_match",
   *     handOver: (_ctx, partition) => encodeMatches(partition), // and forget them
   *     takeOver: (_ctx, partition, state) => restoreMatches(partition, state),
   *     snapshot: (partition) => encodeMatches(partition), // kept: for the standby
   *   })
   *   .rawMethod("input", (ctx, body) => play(ctx.key, body));
   * ```
   */
  keyed(options: KeyedOptions): this {
    const { partitions, sessionKey } = options;
    if (!Number.isInteger(partitions) || partitions < 1 || partitions > MAX_PARTITIONS) {
      throw new Error(`a keyed service has 1..=${MAX_PARTITIONS} partitions, not ${partitions}`);
    }
    if (sessionKey !== undefined && !isValidName(sessionKey)) {
      throw new Error(`invalid session key name ${JSON.stringify(sessionKey)}: use 1..=64 of [a-z0-9_-]`);
    }
    if (this.#keyed !== undefined) throw new Error(`service ${this.name} keyed twice`);
    this.#keyed = { ...options };
    return this;
  }

  /** A keyed service's number of partitions; `undefined` for another. */
  get partitions(): number | undefined {
    return this.#keyed?.partitions;
  }

  /** Whether the service gives snapshots of its partitions, for standbys. */
  get replicates(): boolean {
    return this.#keyed?.snapshot !== undefined;
  }

  /**
   * `partition`'s snapshot; `undefined` without a snapshot callback, or when it threw
   * (the standby keeps the last one it had).
   */
  async snapshot(partition: number): Promise<Uint8Array | undefined> {
    const callback = this.#keyed?.snapshot;
    if (callback === undefined) return undefined;
    try {
      return bytesOf(await callback(partition));
    } catch {
      return undefined;
    }
  }

  /** The registered methods. */
  get methods(): string[] {
    return [...this.#methods.keys()];
  }

  /** The registered event subjects (under the prefix) and who gets them. */
  get events(): readonly { readonly subject: string; readonly delivery: Delivery }[] {
    return this.#events;
  }

  /**
   * What workers announce to the gates: typed methods, pushes, a FileDescriptorSet of
   * their types' files (dependencies first), and whether the service is keyed;
   * `undefined` when nothing is typed and the service is not keyed.
   */
  schema(): ServiceSchema | undefined {
    const methods = [...this.#methods]
      .flatMap(([method, m]) => (m.types ? [{ method, ...m.types }] : []))
      .sort((a, b) => (a.method < b.method ? -1 : a.method > b.method ? 1 : 0));
    const keyed = this.#keyed;
    if (methods.length === 0 && this.#pushes.length === 0 && keyed === undefined) return undefined;
    const types = [
      ...methods.flatMap((m) => [m.request, m.response]),
      ...this.#pushes.map((p) => p.type),
    ];
    return create(ServiceSchemaSchema, {
      service: this.name,
      methods: methods.map((m) =>
        create(MethodSchemaSchema, {
          method: m.method,
          requestType: m.request.typeName,
          responseType: m.response.typeName,
        }),
      ),
      pushes: this.#pushes.map((p) =>
        create(PushSchemaSchema, { route: p.route, messageType: p.type.typeName }),
      ),
      descriptors: toBinary(
        FileDescriptorSetSchema,
        create(FileDescriptorSetSchema, { file: filesOf(types).map((f) => f.proto) }),
      ),
      keyed:
        keyed === undefined
          ? undefined
          : create(KeyedSchema, { partitions: keyed.partitions, sessionKey: keyed.sessionKey ?? "" }),
    });
  }

  /**
   * Answers `request` with `method`'s handler: 200 with the body and effects, the
   * handler's `HandlerError` code and message, 404 for an unknown method, 503 for a
   * keyed service's request without a key, or 500 for anything else it threw. A failed
   * handler's effects and pushes are dropped. `options` give the handler's context its
   * caller (the worker's, or a test's stand-in; without one, calls get 503) and the
   * request's deadline; its calls carry the request's trace and route. With
   * `request.timing`, the answer's `calls` are the spans of the handler's calls (kept in
   * `options.spans` when given, so the worker can send them with its own 408 too).
   */
  async call(method: string, request: RpcRequest, options: ContextOptions = {}): Promise<Handled> {
    const entry = this.#methods.get(method);
    if (entry === undefined) {
      const message = `unknown method ${JSON.stringify(method)} of service ${JSON.stringify(this.name)}`;
      return { response: errorResponse(Status.NOT_FOUND, message), outbound: [] };
    }
    if (this.#keyed !== undefined && request.key === "") {
      // Sent by a gate that has not learnt yet that the service is keyed: it asks for the
      // schema when it starts, so a retry is routed by key.
      const message = `service ${JSON.stringify(this.name)} is keyed and the request has no key: retry`;
      return { response: errorResponse(Status.UNAVAILABLE, message), outbound: [] };
    }
    // The handler's calls carry this request's trace and route, and its timing.
    const route = request.route === "" ? `${this.name}.${method}` : request.route;
    const spans = request.timing ? (options.spans ?? []) : undefined;
    const ctx = new Context(request.session, request.key, { ...options, trace: request.trace, route, spans });
    let response: RpcResponse;
    let outbound: readonly Outbound[] = [];
    try {
      const body = await entry.call(ctx, request.body);
      response = create(RpcResponseSchema, { code: Status.OK, body, effects: [...ctx.effects] });
      outbound = ctx.outbound;
    } catch (error) {
      response =
        error instanceof HandlerError
          ? errorResponse(error.code, error.message)
          : errorResponse(Status.HANDLER_ERROR, `internal error: ${messageOf(error)}`);
    }
    if (spans !== undefined) response.calls = [...spans];
    return { response, outbound, changed: ctx.changedPartitions };
  }

  /** Decodes an `RpcRequest` as it came off the bus and calls `method`; garbage is a 400. */
  async callEncoded(method: string, payload: Uint8Array, options: ContextOptions = {}): Promise<Handled> {
    const request = decodeRequest(payload);
    if (request.$typeName === "shaddock.rpc.RpcResponse") return { response: request, outbound: [] };
    return this.call(method, request, options);
  }

  /**
   * Runs the handler of event `subject` (as registered); a failure publishes nothing. Its
   * context has no session and no deadline: its calls wait the worker's call timeout.
   */
  async event(subject: string, payload: Uint8Array, options: ContextOptions = {}): Promise<EventHandled> {
    const event = this.#events.find((e) => e.subject === subject);
    const ctx = new Context(undefined, undefined, options);
    if (event === undefined) return { ok: false, outbound: [], reply: undefined };
    try {
      await event.handler(ctx, payload);
      return { ok: true, outbound: ctx.outbound, reply: ctx.replyBody, changed: ctx.changedPartitions };
    } catch {
      return { ok: false, outbound: [], reply: undefined, changed: ctx.changedPartitions };
    }
  }

  /**
   * Runs a keyed service's `takeOver` callback for `partition` with `state` (`undefined`:
   * fresh); a failure publishes nothing.
   */
  async takeOver(
    partition: number,
    state: Uint8Array | undefined,
    options: ContextOptions = {},
  ): Promise<EventHandled> {
    const ctx = new Context(undefined, undefined, options);
    try {
      await this.#keyed?.takeOver?.(ctx, partition, state);
      return { ok: true, outbound: ctx.outbound, reply: undefined, changed: ctx.changedPartitions };
    } catch {
      return { ok: false, outbound: [], reply: undefined, changed: ctx.changedPartitions };
    }
  }

  /**
   * Runs a keyed service's `handOver` callback for `partition`: its state, empty without
   * a callback or when it failed (the partition then moves without its state).
   */
  async handOver(partition: number, options: ContextOptions = {}): Promise<HandedOver> {
    const ctx = new Context(undefined, undefined, options);
    const callback = this.#keyed?.handOver;
    try {
      const state = callback === undefined ? new Uint8Array() : bytesOf(await callback(ctx, partition));
      return { ok: true, state, outbound: ctx.outbound };
    } catch {
      return { ok: false, state: new Uint8Array(), outbound: [] };
    }
  }

  #add(name: string, types: Method["types"], call: Method["call"]): this {
    // The method alone (`add` for route `inventory.add`): the gates refuse an
    // announcement naming one no route can reach.
    if (!isValidName(name) || this.name.length + 1 + name.length > MAX_ROUTE_LEN) {
      throw new Error(
        `invalid method name ${JSON.stringify(name)} in service ${this.name}: name the method alone, ` +
          `the route's part after "${this.name}.": [a-z0-9_-], the route at most ${MAX_ROUTE_LEN} bytes`,
      );
    }
    if (this.#methods.has(name)) {
      throw new Error(`method ${JSON.stringify(name)} registered twice in service ${this.name}`);
    }
    this.#methods.set(name, { call, types });
    return this;
  }
}

/** An `RpcRequest` as it came off the bus, or the 400 to answer when it is not one. */
export function decodeRequest(payload: Uint8Array): RpcRequest | RpcResponse {
  try {
    return fromBinary(RpcRequestSchema, payload);
  } catch (error) {
    return errorResponse(Status.BAD_REQUEST, `malformed RpcRequest: ${messageOf(error)}`);
  }
}

/** The files declaring `types`, with every file they import, dependencies first. */
function filesOf(types: readonly DescMessage[]): DescFile[] {
  const seen = new Set<string>();
  const files: DescFile[] = [];
  const visit = (file: DescFile): void => {
    if (seen.has(file.proto.name)) return;
    seen.add(file.proto.name);
    file.dependencies.forEach(visit);
    files.push(file);
  };
  types.forEach((t) => visit(t.file));
  return files;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
