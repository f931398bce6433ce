/**
 * @shaddock/client: the TypeScript SDK for Shaddock gates. One core (`Client`) for
 * browsers and Node, two encodings (protobuf binary frames, JSON text frames), and typed
 * APIs for the built-in services.
 */
export { Client, connect, CLOSED_BY_CLIENT, RESUMED_ELSEWHERE } from "./client.js";
export {
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_MAX_FRAME_BYTES,
  DEFAULT_MAX_PENDING,
  DEFAULT_REQUEST_TIMEOUT_MS,
  type ClientOptions,
  type ConnectionState,
  type NotifyOptions,
  type RequestOptions,
  type StateEvent,
} from "./options.js";
export { ACK_EVERY } from "./resume.js";
export type { Reply } from "./requests.js";
export { backoffDelay, DEFAULT_RECONNECT, type ReconnectOptions } from "./backoff.js";
export { bodyBytes, bodyText, isJsonObject, type Body, type JsonObject, type JsonValue } from "./body.js";
export type { Encoding, Timing } from "./codec/codec.js";
export { DRAINING_MESSAGE, ShaddockError } from "./errors.js";
export { Status } from "./gen/status_pb.js";
export { method, pushRoute, type Method, type PushRoute } from "./typed.js";
export type { WebSocketConstructor, WebSocketLike } from "./websocket.js";
export { Arena, arena, arenaPushes, arenaRoutes } from "./services/arena.js";
export { Chat, chat, chatPushes, chatRoutes } from "./services/chat.js";
export { Echo, echo, echoRoutes } from "./services/echo.js";
export { ProfileApi, profile, profileRoutes } from "./services/profile.js";
export * as arenaTypes from "./gen/arena_pb.js";
export * as chatTypes from "./gen/chat_pb.js";
export * as echoTypes from "./gen/echo_pb.js";
export * as profileTypes from "./gen/profile_pb.js";
export * as clientTypes from "./gen/client_pb.js";
