/**
 * `@shaddock/worker`: Shaddock services in TypeScript. A `Service` holds typed handlers
 * by route; a `Worker` serves it on the bus beside workers in any other language (the
 * contract is docs/workers.md). A handler calls other services with `ctx.call`.
 */
export { CallFailure, CallResult, MAX_CALL_DEPTH, MAX_CALL_SPANS, MAX_KEY_LEN, isValidRoute } from "./call.js";
export type { CallOptions, Caller, OutgoingCall } from "./call.js";
export { Context, bytesOf } from "./context.js";
export type { Body, ContextOptions, Outbound } from "./context.js";
export { HandlerError } from "./errors.js";
export { Status } from "./gen/status_pb.js";
export {
  DEFAULT_HANDOVER_BUFFER,
  DEFAULT_HANDOVER_OVERLAP_MS,
  DEFAULT_HANDOVER_TIMEOUT_MS,
  DEFAULT_KEYED_HEARTBEAT_MS,
  DEFAULT_KEYED_MEMBER_TIMEOUT_MS,
} from "./keyed-settings.js";
export type { Undelivered } from "./held.js";
export type { KeyedStats, KeyedView } from "./keyed.js";
export { MAX_PARTITIONS, Members, fnv1a, partitionOf, score } from "./ownership.js";
export type { Gone, MemberTimes, Step } from "./ownership.js";
export { keyOf, keyedRouteOf } from "./routes.js";
export type { Destination, KeyedRoute } from "./routes.js";
export { Service, decodeRequest, errorResponse } from "./service.js";
export type {
  Awaitable,
  Delivery,
  EventHandled,
  EventHandler,
  Handled,
  HandedOver,
  KeyedOptions,
  RawHandler,
  TypedHandler,
} from "./service.js";
export * from "./subjects.js";
export {
  DEFAULT_ANSWER_TIMEOUT_MS,
  DEFAULT_CALL_MARGIN_MS,
  DEFAULT_CALL_TIMEOUT_MS,
  DEFAULT_FRAME_BUDGET,
  DEFAULT_MAX_CALLS,
  DEFAULT_QUEUE_CAPACITY,
  DEFAULT_REPLICA_TIMEOUT_MS,
  Worker,
} from "./worker.js";
export type { WorkerOptions, WorkerStats } from "./worker.js";
export * as rpc from "./gen/rpc_pb.js";
