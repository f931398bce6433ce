/**
 * A worker: one service served from its queue-group subscription on the bus, through a
 * bounded queue, one request at a time; how it runs (requests, queue, calls, deadlines,
 * pushes, keyed services, standbys, drain) is in README.md, "How a worker runs".
 */
import { toBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { CallResult, Caller } from "./call.js";
import { Batch } from "./batch.js";
import { Calls, DEFAULT_CALL_MARGIN_MS, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_MAX_CALLS } from "./calls.js";
import type { Outbound } from "./context.js";
import { Deadlines } from "./deadlines.js";
import { Held } from "./held.js";
import type { Undelivered } from "./held.js";
import {
  DEFAULT_HANDOVER_BUFFER,
  DEFAULT_HANDOVER_OVERLAP_MS,
  DEFAULT_HANDOVER_TIMEOUT_MS,
  DEFAULT_KEYED_HEARTBEAT_MS,
  DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
  DEFAULT_REPLICA_TIMEOUT_MS,
} from "./keyed-settings.js";
import { Partitions } from "./keyed.js";
import type { KeyedView } from "./keyed.js";
import type { KeyedRoute } from "./routes.js";
import type { CallSpan, PartitionState, RpcResponse } from "./gen/rpc_pb.js";
import { RpcResponseSchema, ServerPushSchema, ServiceSchemaSchema, UserCommandSchema } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import type { EventHandled, Handled, Service } from "./service.js";
import { decodeRequest, errorResponse } from "./service.js";
import { Task } from "./task.js";
import {
  DEFAULT_PREFIX,
  announceSubject,
  askSubject,
  groupSubject,
  isValidSubject,
  serviceSubject,
  userSubject,
} from "./subjects.js";
import { DEFAULT_ANSWER_TIMEOUT_MS, DEFAULT_FRAME_BUDGET, DEFAULT_QUEUE_CAPACITY } from "./worker-options.js";
import type { WorkerOptions } from "./worker-options.js";

export { DEFAULT_ANSWER_TIMEOUT_MS, DEFAULT_FRAME_BUDGET, DEFAULT_QUEUE_CAPACITY };
export type { WorkerOptions };
export { DEFAULT_CALL_MARGIN_MS, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_MAX_CALLS, DEFAULT_REPLICA_TIMEOUT_MS };
/** The worker's 408 to a request its handler did not answer by its deadline. */
const NO_ANSWER_IN_TIME = "no answer in time";
/** The largest duration `queue_us` and `handler_us` can carry (they are uint32). */
const MAX_US = 0xffff_ffff;

/** What a worker has done so far. */
export interface WorkerStats {
  /** Requests its handlers answered (any code). */
  served: number;
  /** Requests answered 503 because the queue was full. */
  rejected: number;
  /** Events handled. */
  events: number;
  /** Requests the worker answered 408: their handler had not answered by their deadline. */
  expired: number;
  /** Answers dropped: their handler answered after the worker's 408. */
  late: number;
}

type Incoming =
  | {
      readonly kind: "request" | "event";
      /** The method, or the event's subject as registered. */
      readonly name: string;
      readonly msg: Msg;
      readonly received: number;
      /** A keyed service's request: the partition it came on (its state changes). */
      readonly partition?: number;
    }
  /** A keyed service's partition to send its standby whole after this batch (a new standby, or one that missed it). */
  | { readonly kind: "replicate"; readonly partition: number }
  /** A keyed service's partition taken on here, with the state handed over (or none). */
  | { readonly kind: "takeOver"; readonly partition: number; readonly state: Uint8Array | undefined }
  /** A keyed service's partition leaving, after its last request: `done` gets its state. */
  | { readonly kind: "handOver"; readonly partition: number; readonly done: (state: Uint8Array) => void }
  /** A call's result, for the handler that made it: its turn hands it over. */
  | {
      readonly kind: "result";
      readonly task: Task;
      readonly resolve: (result: CallResult) => void;
      readonly result: CallResult;
    }
  /** A request's deadline passed while results of its calls were queued: its 408, after them. */
  | { readonly kind: "expire"; readonly task: Task; readonly msg: Msg; readonly spans: CallSpan[] | undefined };

/** A service subscribed to the bus; see the module docs. */
export class Worker {
  readonly stats: WorkerStats = { served: 0, rejected: 0, events: 0, expired: 0, late: 0 };
  readonly #nc: NatsConnection;
  /** What was published while the connection was down. */
  readonly #held: Held;
  readonly #service: Service;
  readonly #prefix: string;
  readonly #capacity: number;
  readonly #budget: number;
  readonly #answerTimeoutMs: number;
  readonly #deadlines = new Deadlines();
  readonly #calls: Calls;
  /** Requests and events whose handler has not settled (requests: not answered). */
  readonly #open = new Set<Task>();
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
  /** The loop's batch: with standbys, what it sends waits for its end (`batch.ts`). */
  readonly #batch: Batch;

  private constructor(nc: NatsConnection, service: Service, options: WorkerOptions) {
    this.#nc = nc;
    this.#service = service;
    this.#prefix = options.prefix ?? DEFAULT_PREFIX;
    if (!isValidSubject(this.#prefix)) {
      throw new Error(`invalid subject prefix ${JSON.stringify(this.#prefix)}`);
    }
    this.#capacity = Math.max(1, options.queueCapacity ?? DEFAULT_QUEUE_CAPACITY);
    this.#budget = Math.max(1, options.frameBudget ?? DEFAULT_FRAME_BUDGET);
    this.#answerTimeoutMs = Math.max(1, options.answerTimeoutMs ?? DEFAULT_ANSWER_TIMEOUT_MS);
    const callLimits = {
      max: Math.max(1, options.maxCalls ?? DEFAULT_MAX_CALLS),
      timeoutMs: Math.max(1, options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS),
      marginMs: Math.max(0, options.callMarginMs ?? DEFAULT_CALL_MARGIN_MS),
    };
    this.#calls = new Calls(nc, this.#prefix, callLimits, this.#deadlines);
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
    const replicating = service.partitions !== undefined && service.replicates && options.standby !== false;
    const replicaTimeoutMs = options.replicaTimeoutMs ?? DEFAULT_REPLICA_TIMEOUT_MS;
    if (!(replicaTimeoutMs > 0)) throw new Error(`the replica timeout must be positive, not ${replicaTimeoutMs}`);
    if (service.partitions !== undefined) {
      const settings = {
        heartbeatMs: options.keyedHeartbeatMs ?? DEFAULT_KEYED_HEARTBEAT_MS,
        memberTimeoutMs: options.keyedMemberTimeoutMs ?? DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
        handoverTimeoutMs: options.handoverTimeoutMs ?? DEFAULT_HANDOVER_TIMEOUT_MS,
        handoverOverlapMs: options.handoverOverlapMs ?? DEFAULT_HANDOVER_OVERLAP_MS,
        handoverBuffer: options.handoverBuffer ?? DEFAULT_HANDOVER_BUFFER,
        replicaTimeoutMs: replicating ? replicaTimeoutMs : undefined,
      };
      const host = {
        offer: (msg: Msg, method: string, partition: number) => this.#offer(msg, method, partition),
        replicate: (partition: number) => this.#enqueue({ kind: "replicate", partition }),
        takeOver: (partition: number, state: Uint8Array | undefined) =>
          this.#enqueue({ kind: "takeOver", partition, state }),
        handOver: (partition: number) =>
          new Promise<Uint8Array>((done) => this.#enqueue({ kind: "handOver", partition, done })),
        onError: this.#onError,
      };
      this.#partitions = new Partitions(nc, this.#prefix, service.name, service.partitions, host, settings);
    }
    const partitions = this.#partitions;
    const replication =
      replicating && partitions !== undefined
        ? {
            standsBy: (partition: number) => partitions.standsBy(partition),
            snapshot: (partition: number) => service.snapshot(partition),
            replicate: (states: readonly PartitionState[]) => partitions.replicate(states),
            onError: this.#onError,
          }
        : undefined;
    this.#batch = new Batch(replication);
    this.#held = new Held(nc);
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

  /** Requests waiting in the queue (with events, and calls' results waiting for their turn). */
  get depth(): number {
    return this.#queue.length;
  }

  /** Calls to other services in flight. */
  get callsInFlight(): number {
    return this.#calls.size;
  }

  /**
   * The keyed services this worker has heard announced, by name: its calls to them go
   * to their keys' partitions (a call to a service not here goes to its method's subject).
   */
  get keyedServices(): ReadonlyMap<string, KeyedRoute> {
    return this.#calls.keyed;
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

  /**
   * What the worker could not deliver so far: the answers and pushes it published while
   * its connection was down, since the connection was last made (they leave only if it
   * comes back). Zeros while it is up.
   */
  get undelivered(): Undelivered {
    return this.#held.undelivered;
  }

  async #subscribe(): Promise<void> {
    const name = this.#service.name;
    // First, so that a handler's first call finds its answers' subscription in place.
    this.#calls.subscribe();
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

  /** Queues a request (of a keyed service's `partition`), or answers 503 at once when the queue is full. */
  #offer(msg: Msg, method: string, partition?: number): void {
    if (this.#queue.length >= this.#capacity) {
      this.stats.rejected += 1;
      if (msg.reply) this.#respond(msg, this.#overloaded);
      return;
    }
    this.#enqueue({ kind: "request", name: method, msg, received: performance.now(), partition });
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

  /**
   * The loop: takes the queue in order, a turn each, yielding to I/O every `frameBudget`
   * turns. The turns before it waits or yields are a batch (`batch.ts`).
   */
  async #run(): Promise<void> {
    let inFrame = 0;
    for (;;) {
      const next = this.#queue.shift();
      if (next === undefined) {
        if (this.#batch.open) {
          // More may have come while the batch's standbys were asked.
          await this.#batch.end();
          continue;
        }
        // A drain ends once everything taken is answered: results may still come back.
        if (this.#closing && this.#open.size === 0) return;
        inFrame = 0;
        await new Promise<void>((resolve) => (this.#wake = resolve));
        continue;
      }
      this.#batch.turn();
      this.#room.splice(0).forEach((resolve) => resolve());
      await this.#handle(next);
      if (++inFrame >= this.#budget) {
        inFrame = 0;
        await this.#batch.end();
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
    }
  }

  async #handle(incoming: Incoming): Promise<void> {
    switch (incoming.kind) {
      case "request":
        return this.#request(incoming.name, incoming.msg, incoming.received, incoming.partition);
      case "event":
        return this.#event(incoming.name, incoming.msg);
      case "result": {
        const { task, resolve, result } = incoming;
        task.handed();
        return task.turn(() => resolve(result));
      }
      case "expire":
        return this.#timeOut(incoming.task, incoming.msg, incoming.spans);
      case "takeOver": {
        const options = { caller: this.#directCaller };
        const handled = await this.#service.takeOver(incoming.partition, incoming.state, options);
        if (!handled.ok) this.#onError(new Error(`take-over failed`), `partition ${incoming.partition}`);
        // Its standby gets it whole, after the take-over.
        this.#batch.mark([incoming.partition, ...(handled.changed ?? [])]);
        this.#batch.emit(() => this.#publishAll(handled.outbound));
        return;
      }
      case "handOver": {
        const handed = await this.#service.handOver(incoming.partition, { caller: this.#directCaller });
        if (!handed.ok) this.#onError(new Error(`hand-over failed: no state`), `partition ${incoming.partition}`);
        // Its new owner's standby gets it from the new owner.
        this.#batch.unmark(incoming.partition);
        this.#batch.emit(() => this.#publishAll(handed.outbound));
        incoming.done(handed.state);
        return;
      }
      case "replicate":
        this.#batch.mark([incoming.partition]);
        return;
    }
  }

  /** A request's first turn: its handler starts, under the request's deadline. */
  async #request(method: string, msg: Msg, received: number, partition: number | undefined): Promise<void> {
    const started = performance.now();
    // A keyed request changes its partition: marked at its start, and again when its
    // handler settles, in a later batch after a call.
    this.#batch.mark([partition]);
    const request = decodeRequest(msg.data);
    if (request.$typeName === "shaddock.rpc.RpcResponse") {
      this.#answered(undefined, msg, { response: request, outbound: [] }, received, started);
      return;
    }
    const task = new Task();
    const deadline = request.timeoutMs > 0 ? received + request.timeoutMs : undefined;
    const at = deadline ?? received + this.#answerTimeoutMs;
    // With timing, the spans of the handler's calls: in its answer, or in the worker's 408.
    const spans: CallSpan[] | undefined = request.timing ? [] : undefined;
    task.due = this.#deadlines.add("request", at, () => this.#expire(task, msg, spans));
    this.#open.add(task);
    const options = { caller: this.#callerFor(task), deadline, spans };
    await task.turn(() => {
      void this.#service
        .call(method, request, options)
        .then((handled) => {
          this.#batch.mark([partition, ...(handled.changed ?? [])]);
          this.#answered(task, msg, handled, received, started);
        });
    });
  }

  /** An event's first turn. */
  async #event(subject: string, msg: Msg): Promise<void> {
    const task = new Task();
    this.#open.add(task);
    await task.turn(() => {
      void this.#service
        .event(subject, msg.data, { caller: this.#callerFor(task) })
        .then((handled) => this.#evented(task, subject, msg, handled));
    });
  }

  /** The caller of `task`'s handler: each call's result comes back as a turn of the loop. */
  #callerFor(task: Task): Caller {
    return task.caller(this.#calls, (resolve, result) => this.#enqueue({ kind: "result", task, resolve, result }));
  }

  /**
   * The caller of a partition's take-over and hand-over, which hold the loop until they
   * settle: their results go to them directly.
   */
  readonly #directCaller: Caller = (call) =>
    new Promise<CallResult>((resolve) => {
      const refused = this.#calls.start(call, resolve);
      if (refused !== undefined) resolve(refused);
    });

  /** A request's handler settled: its pushes, then its answer, unless the worker's 408 went first. */
  #answered(task: Task | undefined, msg: Msg, handled: Handled, received: number, started: number): void {
    if (task !== undefined) {
      if (task.done) {
        this.stats.late += 1;
        return;
      }
      this.#settle(task);
    }
    const response = handled.response;
    response.queueUs = micros(started - received);
    response.handlerUs = micros(performance.now() - started);
    this.stats.served += 1;
    this.#batch.emit(() => {
      this.#publishAll(handled.outbound);
      if (msg.reply) this.#respond(msg, encode(response));
    });
  }

  /** An event's handler settled. */
  #evented(task: Task, subject: string, msg: Msg, handled: EventHandled): void {
    this.#settle(task);
    this.stats.events += 1;
    if (!handled.ok) this.#onError(new Error(`event handler failed`), subject);
    this.#batch.mark(handled.changed);
    const reply = handled.reply;
    this.#batch.emit(() => {
      this.#publishAll(handled.outbound);
      if (reply !== undefined && msg.reply) this.#respond(msg, reply);
    });
  }

  /**
   * A request's deadline passed: the worker's 408, now, or after the results of its
   * calls still queued (which may answer it yet). The loop stops waiting for it.
   */
  #expire(task: Task, msg: Msg, spans: CallSpan[] | undefined): void {
    task.expired = true;
    task.due = undefined;
    if (task.queued > 0) this.#enqueue({ kind: "expire", task, msg, spans });
    else this.#timeOut(task, msg, spans);
    task.wake();
  }

  /** The worker's 408, with the spans of the calls whose results came back by then. */
  #timeOut(task: Task, msg: Msg, spans: CallSpan[] | undefined): void {
    if (task.done) return;
    this.#settle(task);
    this.stats.expired += 1;
    const response = errorResponse(Status.TIMEOUT, NO_ANSWER_IN_TIME);
    if (spans !== undefined) response.calls = [...spans];
    if (msg.reply) this.#batch.emit(() => this.#respond(msg, encode(response)));
  }

  /** `task` is answered (or settled): its deadline goes, and the loop's wait on it ends. */
  #settle(task: Task): void {
    task.done = true;
    if (task.due !== undefined) this.#deadlines.remove(task.due);
    this.#open.delete(task);
    task.wake();
    if (this.#closing) this.#wakeLoop();
  }

  #publishAll(outbound: readonly Outbound[]): void {
    this.#held.pushed(outbound.length);
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
      this.#held.answered();
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
    this.#calls.close();
    this.#deadlines.close();
    if (!this.#nc.isClosed()) await this.#nc.flush();
  }
}

function encode(response: RpcResponse): Uint8Array {
  return toBinary(RpcResponseSchema, response);
}

function micros(ms: number): number {
  return Math.min(MAX_US, Math.max(0, Math.round(ms * 1000)));
}
