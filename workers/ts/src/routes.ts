/**
 * Where a worker's calls go (docs/workers.md, "Calling other services"): to a keyed
 * service, the partition of the call's key; to any other, the method's subject.
 *
 * The worker learns which services are keyed as the gates do, from their workers'
 * announcements: it subscribes `<prefix>.schema.svc.*` plainly and publishes one empty
 * message on `<prefix>.schema.ask`, which makes every worker announce again. An
 * announcement with a valid `keyed` (1 to 1024 partitions, a session key that is empty
 * or one name) makes its service keyed here; one without `keyed` makes it plain again;
 * one that does not decode, or names an invalid service or `keyed`, changes nothing.
 * Until a service's announcement has arrived its calls go to its method's subject,
 * where a keyed worker answers 503 (retry).
 *
 * A call to a keyed service is routed by a key, the first of: the key the caller gave,
 * the caller's session value the service names (when it names one and the session has
 * it), the session's uid. No key is 400 `CallFailure.NO_KEY`, a key over `MAX_KEY_LEN`
 * bytes 400 `CallFailure.KEY_TOO_LONG`, both without sending; otherwise the call goes to
 * `<prefix>.svc.<service>.p<fnv1a(key) % partitions>.<method>` with the key in
 * `RpcRequest.key` and its order in `origin` and `seq` (`calls.ts`), as a gate's
 * request would.
 */
import { debuglog } from "node:util";
import { fromBinary } from "@bufbuild/protobuf";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { CallFailure, CallResult, MAX_KEY_LEN } from "./call.js";
import type { OutgoingCall } from "./call.js";
import { ServiceSchemaSchema } from "./gen/rpc_pb.js";
import type { ServiceSchema } from "./gen/rpc_pb.js";
import { Status } from "./gen/status_pb.js";
import { MAX_PARTITIONS, partitionOf } from "./ownership.js";
import { announceSubject, askSubject, isValidName, methodSubject, partitionSubject } from "./subjects.js";

/** `NODE_DEBUG=shaddock` shows what the worker ignored. */
const debug = debuglog("shaddock");
const encoder = new TextEncoder();

/** A keyed service as its announcement describes it. */
export interface KeyedRoute {
  readonly partitions: number;
  /** The session value its keys come from when the caller gives none; empty: none, the uid. */
  readonly sessionKey: string;
}

/** Where a call goes: its subject, and the key it is routed by (keyed services only). */
export interface Destination {
  readonly subject: string;
  readonly key: string | undefined;
}

/** What an announcement says of its service's keys: a route, `null` (not keyed), or `undefined` (invalid). */
export function keyedRouteOf(schema: ServiceSchema): KeyedRoute | null | undefined {
  const keyed = schema.keyed;
  if (keyed === undefined) return null;
  const { partitions, sessionKey } = keyed;
  if (partitions < 1 || partitions > MAX_PARTITIONS) return undefined;
  if (sessionKey !== "" && !isValidName(sessionKey)) return undefined;
  return { partitions, sessionKey };
}

/**
 * The key a call to keyed service `route` goes by: the caller's, else its session's
 * value `route.sessionKey` names, else its uid; or the 400 when there is none or it is
 * too long.
 */
export function keyOf(call: Pick<OutgoingCall, "key" | "session">, route: KeyedRoute): string | CallResult {
  const { key, session } = call;
  const named = route.sessionKey === "" ? undefined : session?.data[route.sessionKey];
  const chosen = key !== undefined && key !== "" ? key : (named ?? session?.uid ?? "");
  if (chosen === "") return CallResult.refusal(Status.BAD_REQUEST, CallFailure.NO_KEY);
  if (encoder.encode(chosen).length > MAX_KEY_LEN) {
    return CallResult.refusal(Status.BAD_REQUEST, CallFailure.KEY_TOO_LONG);
  }
  return chosen;
}

/** The keyed services a worker has heard of, and where its calls go; see the module docs. */
export class Routes {
  readonly #nc: NatsConnection;
  readonly #prefix: string;
  readonly #keyed = new Map<string, KeyedRoute>();
  #sub: Subscription | undefined;

  constructor(nc: NatsConnection, prefix: string) {
    this.#nc = nc;
    this.#prefix = prefix;
  }

  /** Subscribes the announcements, then asks every worker to announce (the caller flushes). */
  subscribe(): void {
    this.#sub = this.#nc.subscribe(announceSubject(this.#prefix, "*"), {
      callback: (error, msg) => {
        if (error === null) this.#heard(msg);
      },
    });
    try {
      this.#nc.publish(askSubject(this.#prefix));
    } catch (error) {
      // The connection is closed: calls go to their methods' subjects.
      debug("cannot ask for the services' announcements: %s", error);
    }
  }

  /** The keyed services heard of so far, by name. */
  get keyed(): ReadonlyMap<string, KeyedRoute> {
    return this.#keyed;
  }

  /**
   * Where `call` (its route checked: `service.method`) goes, or the 400 it gets at once
   * when its callee is keyed and it has no usable key.
   */
  destination(call: OutgoingCall): Destination | CallResult {
    const dot = call.route.indexOf(".");
    const service = call.route.slice(0, dot);
    const method = call.route.slice(dot + 1);
    const keyed = this.#keyed.get(service);
    if (keyed === undefined) return { subject: methodSubject(this.#prefix, service, method), key: undefined };
    const key = keyOf(call, keyed);
    if (typeof key !== "string") return key;
    const partition = partitionOf(key, keyed.partitions);
    return { subject: `${partitionSubject(this.#prefix, service, partition)}.${method}`, key };
  }

  close(): void {
    this.#sub?.unsubscribe();
  }

  #heard(msg: Msg): void {
    let schema: ServiceSchema;
    try {
      schema = fromBinary(ServiceSchemaSchema, msg.data);
    } catch (error) {
      debug("ignored an announcement on %s that does not decode: %s", msg.subject, error);
      return;
    }
    const service = schema.service;
    if (!isValidName(service) || msg.subject !== announceSubject(this.#prefix, service)) {
      debug("ignored an announcement of service %j on %s", service, msg.subject);
      return;
    }
    const route = keyedRouteOf(schema);
    if (route === undefined) {
      debug("ignored the announcement of service %j: invalid keyed %j", service, schema.keyed);
    } else if (route === null) {
      this.#keyed.delete(service);
    } else {
      this.#keyed.set(service, route);
    }
  }
}
