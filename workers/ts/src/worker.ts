/**
 * A worker: one service served from its queue-group subscription on the bus, through a
 * bounded queue, one request at a time.
 *
 * - **Requests** arrive on `<prefix>.svc.<service>.>` in queue group `<service>`, so the
 *   bus hands each to exactly one worker of the service, whatever its language. Each is
 *   answered on its reply subject with an encoded `RpcResponse`; a request without a
 *   reply subject (a client's notify) is handled and not answered.
 * - **The queue** holds at most `queueCapacity` requests. When it is full a request is
 *   answered 503 at once: the client hears "overloaded" in microseconds instead of a
 *   timeout after its request sat in a pile it could never leave. Events wait for room
 *   instead (a lost event would leave state wrong for good).
 * - **Handlers run one at a time, in arrival order**, like a game's main loop: state
 *   needs no locks. After `frameBudget` requests in a row the loop yields to I/O, so
 *   answers leave and new requests are read (and rejected when the queue is full) even
 *   under a backlog. A handler must not block the thread; an async one holds the queue
 *   while it awaits.
 * - **Pushes** a handler asked for are published before its answer, on the same
 *   connection, so they reach every gate first.
 * - **The schema announcement**: with typed methods or pushes, the worker publishes its
 *   `ServiceSchema` on `<prefix>.schema.svc.<service>` once it serves, and again on every
 *   message on `<prefix>.schema.ask`.
 * - **Keyed services** (`Service.keyed`): requests arrive on the partitions this worker
 *   holds, `<prefix>.svc.<service>.p<N>.>` in queue group `<service>.p<N>`; the worker
 *   agrees with its peers which partitions it holds and moves them with their state
 *   (`keyed.ts`). Take-overs and hand-overs run on the loop, in order with the
 *   partition's requests. On `<prefix>.svc.<service>.*` (queue group `<service>`) it
 *   answers only the requests of a gate that has not learnt yet that the service is
 *   keyed: 503, retry.
 * - **Drain** (`drain()`, from the caller's SIGTERM handler): unsubscribes, so the bus
 *   sends new requests to the other workers of the group, takes what the broker had
 *   already sent, answers everything it took, and resolves. A keyed worker first hands
 *   its partitions over to the others (or drains them when it is the last).
 */
import { toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Outbound } from "./context.js";
import {
  DEFAULT_HANDOVER_TIMEOUT_MS,
  DEFAULT_KEYED_HEARTBEAT_MS,
  DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
  Partitions,
} from "./keyed.js";
import type { KeyedView } from "./keyed.js";
import type { RpcResponse } from "./gen/rpc_pb.js";
import { RpcResponseSchema, ServerPushSchema, ServiceSchemaSchema, UserCommandSchema } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import type { Service } from "./service.js";
import { errorResponse } from "./service.js";
import {
  DEFAULT_PREFIX,
  announceSubject,
  askSubject,
  groupSubject,
  isValidSubject,
  serviceSubject,
  userSubject,
} from "./subjects.js";

/** Default for `WorkerOptions.queueCapacity`: about 10 ms of small requests. */
export const DEFAULT_QUEUE_CAPACITY = 1024;
/** Default for `WorkerOptions.frameBudget`: requests handled before yielding to I/O. */
export const DEFAULT_FRAME_BUDGET = 64;
/** The largest duration `queue_us` and `handler_us` can carry (they are uint32). */
const MAX_US = 0xffff_ffff;

/** How a worker serves. */
export interface WorkerOptions {
  /** Subject prefix shared with the gates (default `shaddock`). */
  prefix?: string;
  /** Requests queued before the worker answers 503 (at least 1). */
  queueCapacity?: number;
  /** Requests handled in a row before the loop yields to I/O (at least 1). */
  frameBudget?: number;
  /** Told about failures nobody else hears of (a failed event, a publish that failed). */
  onError?: (error: unknown, where: string) => void;
  /**
   * A keyed service's heartbeat, ms (default 500): how often the worker tells its peers
   * it lives and what it holds. A starting worker listens for two before it takes
   * partitions nobody holds.
   */
  keyedHeartbeatMs?: number;
  /**
   * A keyed service's member timeout, ms (default 2000, more than two heartbeats): a
   * peer unheard for longer is dead, and its partitions are taken fresh.
   */
  keyedMemberTimeoutMs?: number;
  /**
   * A keyed service's hand-over timeout, ms (default 2000): how long a partition's old
   * owner waits for the new one to take it before it keeps it and tries again later.
   */
  handoverTimeoutMs?: number;
}

/** What a worker has done so far. */
export interface WorkerStats {
  /** Requests its handlers answered (any code). */
  served: number;
  /** Requests answered 503 because the queue was full. */
  rejected: number;
  /** Events handled. */
  events: number;
}

type Incoming =
  | {
      readonly kind: "request" | "event";
      /** The method, or the event's subject as registered. */
      readonly name: string;
      readonly msg: Msg;
      readonly received: number;
    }
  /** A keyed service's partition taken on here, with the state handed over (or none). */
  | { readonly kind: "takeOver"; readonly partition: number; readonly state: Uint8Array | undefined }
  /** A keyed service's partition leaving, after its last request: `done` gets its state. */
  | { readonly kind: "handOver"; readonly partition: number; readonly done: (state: Uint8Array) => void };

/** A service subscribed to the bus; see the module docs. */
export class Worker {
  readonly stats: WorkerStats = { served: 0, rejected: 0, events: 0 };
  readonly #nc: NatsConnection;
  readonly #service: Service;
  readonly #prefix: string;
  readonly #capacity: number;
  readonly #budget: number;
  readonly #onError: (error: unknown, where: string) => void;
  readonly #queue: Incoming[] = [];
  readonly #overloaded: Uint8Array;
  readonly #subject: string;
  readonly #partitions: Partitions | undefined;
  readonly #subs: { sub: Subscription; drain: boolean }[] = [];
  readonly #pumps: Promise<void>[] = [];
  #wake: (() => void) | undefined;
  #room: (() => void)[] = [];
  #closing = false;
  #draining: Promise<void> | undefined;
  readonly #loop: Promise<void>;

  private constructor(nc: NatsConnection, service: Service, options: WorkerOptions) {
    this.#nc = nc;
    this.#service = service;
    this.#prefix = options.prefix ?? DEFAULT_PREFIX;
    if (!isValidSubject(this.#prefix)) {
      throw new Error(`invalid subject prefix ${JSON.stringify(this.#prefix)}`);
    }
    this.#capacity = Math.max(1, options.queueCapacity ?? DEFAULT_QUEUE_CAPACITY);
    this.#budget = Math.max(1, options.frameBudget ?? DEFAULT_FRAME_BUDGET);
    this.#onError = options.onError ?? (() => {});
    this.#overloaded = encode(
      errorResponse(
        Status.UNAVAILABLE,
        `service ${JSON.stringify(service.name)} is overloaded: its queue of ${this.#capacity} is full`,
      ),
    );
    this.#subject =
      service.partitions === undefined
        ? serviceSubject(this.#prefix, service.name)
        : `${this.#prefix}.svc.${service.name}.*`;
    if (service.partitions !== undefined) {
      const times = {
        heartbeatMs: options.keyedHeartbeatMs ?? DEFAULT_KEYED_HEARTBEAT_MS,
        memberTimeoutMs: options.keyedMemberTimeoutMs ?? DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
        handoverTimeoutMs: options.handoverTimeoutMs ?? DEFAULT_HANDOVER_TIMEOUT_MS,
      };
      const host = {
        offer: (msg: Msg, method: string) => this.#offer(msg, method),
        takeOver: (partition: number, state: Uint8Array | undefined) =>
          this.#enqueue({ kind: "takeOver", partition, state }),
        handOver: (partition: number) =>
          new Promise<Uint8Array>((done) => this.#enqueue({ kind: "handOver", partition, done })),
        onError: this.#onError,
      };
      this.#partitions = new Partitions(nc, this.#prefix, service.name, service.partitions, host, times);
    }
    this.#loop = this.#run();
  }

  /**
   * Subscribes `service`'s events, then its requests, then the ask subject; announces
   * its schema; and resolves once the server has every subscription (a round trip), so
   * requests sent next reach this worker.
   */
  static async start(nc: NatsConnection, service: Service, options: WorkerOptions = {}): Promise<Worker> {
    const worker = new Worker(nc, service, options);
    await worker.#subscribe();
    return worker;
  }

  /**
   * The subject this worker serves: `<prefix>.svc.<service>.>`, or a keyed service's
   * `<prefix>.svc.<service>.*` (its requests arrive on its partitions' subjects).
   */
  get subject(): string {
    return this.#subject;
  }

  /** A keyed service's partitions here: this worker's id, what it holds; else `undefined`. */
  get keyed(): KeyedView | undefined {
    return this.#partitions?.view;
  }

  /** Requests waiting in the queue. */
  get depth(): number {
    return this.#queue.length;
  }

  /**
   * Stops taking requests and answers those it took: unsubscribes (the bus sends new
   * requests to the other workers of the group), handles what the server had already
   * sent, flushes, and resolves. Idempotent. The connection stays open: the caller
   * drains or closes it.
   */
  drain(): Promise<void> {
    this.#draining ??= this.#drain();
    return this.#draining;
  }

  async #subscribe(): Promise<void> {
    const name = this.#service.name;
    for (const { subject, delivery } of this.#service.events) {
      const sub = this.#nc.subscribe(`${this.#prefix}.${subject}`, delivery === "queue" ? { queue: name } : {});
      this.#subs.push({ sub, drain: delivery === "queue" });
      this.#pumps.push(this.#pumpEvents(subject, sub));
    }
    this.#partitions?.start();
    const methodPrefix = this.subject.slice(0, -1);
    const requests = this.#nc.subscribe(this.subject, {
      queue: name,
      callback: (error, msg) => {
        if (error === null) this.#offer(msg, msg.subject.slice(methodPrefix.length));
      },
    });
    this.#subs.push({ sub: requests, drain: true });
    const schema = this.#service.schema();
    if (schema !== undefined) {
      const announcement = toBinary(ServiceSchemaSchema, schema);
      const subject = announceSubject(this.#prefix, name);
      const announce = (): void => this.#publish(subject, announcement);
      const asks = this.#nc.subscribe(askSubject(this.#prefix), { callback: announce });
      this.#subs.push({ sub: asks, drain: false });
      announce();
    }
    await this.#nc.flush();
  }

  /** Queues a request, or answers 503 at once when the queue is full. */
  #offer(msg: Msg, method: string): void {
    if (this.#queue.length >= this.#capacity) {
      this.stats.rejected += 1;
      if (msg.reply) this.#respond(msg, this.#overloaded);
      return;
    }
    this.#enqueue({ kind: "request", name: method, msg, received: performance.now() });
  }

  /** Queues anything, room or not: a request that found room, an event, a partition's move. */
  #enqueue(incoming: Incoming): void {
    this.#queue.push(incoming);
    this.#wakeLoop();
  }

  /** Feeds an event subscription into the queue, waiting for room rather than rejecting. */
  async #pumpEvents(subject: string, sub: Subscription): Promise<void> {
    for await (const msg of sub) {
      while (this.#queue.length >= this.#capacity) {
        await new Promise<void>((resolve) => this.#room.push(resolve));
      }
      this.#enqueue({ kind: "event", name: subject, msg, received: performance.now() });
    }
  }

  #wakeLoop(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  /** The loop: handles the queue in order, yielding to I/O every `frameBudget` requests. */
  async #run(): Promise<void> {
    let inFrame = 0;
    for (;;) {
      const next = this.#queue.shift();
      if (next === undefined) {
        if (this.#closing) return;
        inFrame = 0;
        await new Promise<void>((resolve) => (this.#wake = resolve));
        continue;
      }
      this.#room.splice(0).forEach((resolve) => resolve());
      await this.#handle(next);
      if (++inFrame >= this.#budget) {
        inFrame = 0;
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
    }
  }

  async #handle(incoming: Incoming): Promise<void> {
    const started = performance.now();
    if (incoming.kind === "takeOver") {
      const handled = await this.#service.takeOver(incoming.partition, incoming.state);
      if (!handled.ok) this.#onError(new Error(`take-over failed`), `partition ${incoming.partition}`);
      this.#publishAll(handled.outbound);
      return;
    }
    if (incoming.kind === "handOver") {
      const handed = await this.#service.handOver(incoming.partition);
      if (!handed.ok) this.#onError(new Error(`hand-over failed: no state`), `partition ${incoming.partition}`);
      this.#publishAll(handed.outbound);
      incoming.done(handed.state);
      return;
    }
    if (incoming.kind === "event") {
      const handled = await this.#service.event(incoming.name, incoming.msg.data);
      this.stats.events += 1;
      if (!handled.ok) this.#onError(new Error(`event handler failed`), incoming.name);
      this.#publishAll(handled.outbound);
      if (handled.reply !== undefined && incoming.msg.reply) this.#respond(incoming.msg, handled.reply);
      return;
    }
    const handled = await this.#service.callEncoded(incoming.name, incoming.msg.data);
    const response = handled.response;
    response.queueUs = micros(started - incoming.received);
    response.handlerUs = micros(performance.now() - started);
    this.stats.served += 1;
    this.#publishAll(handled.outbound);
    if (incoming.msg.reply) this.#respond(incoming.msg, encode(response));
  }

  #publishAll(outbound: readonly Outbound[]): void {
    for (const out of outbound) {
      switch (out.kind) {
        case "group":
          this.#publish(groupSubject(this.#prefix, out.group), toBinary(ServerPushSchema, out.push));
          break;
        case "user":
          this.#publish(userSubject(this.#prefix, out.uid), toBinary(UserCommandSchema, out.command));
          break;
        case "publish":
          this.#publish(`${this.#prefix}.${out.subject}`, out.payload);
          break;
      }
    }
  }

  #publish(subject: string, payload: Uint8Array): void {
    try {
      this.#nc.publish(subject, payload);
    } catch (error) {
      // The connection is closed: nothing more leaves, and the caller hears of it there.
      this.#onError(error, subject);
    }
  }

  #respond(msg: Msg, payload: Uint8Array): void {
    try {
      msg.respond(payload);
    } catch (error) {
      this.#onError(error, msg.subject);
    }
  }

  async #drain(): Promise<void> {
    // The loop keeps running meanwhile: a partition's state is given after its last request.
    await Promise.all([
      this.#partitions?.leave(),
      ...this.#subs.map(({ sub, drain }) => (drain ? sub.drain() : Promise.resolve(sub.unsubscribe()))),
    ]);
    await Promise.all(this.#pumps);
    this.#closing = true;
    this.#wakeLoop();
    await this.#loop;
    if (!this.#nc.isClosed()) await this.#nc.flush();
  }
}

function encode(response: RpcResponse): Uint8Array {
  return toBinary(RpcResponseSchema, response);
}

function micros(ms: number): number {
  return Math.min(MAX_US, Math.max(0, Math.round(ms * 1000)));
}
