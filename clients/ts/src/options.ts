/**
 * What a caller gives the client (its options, a request's options) with their
 * defaults, and what the client tells it back (its states, as events a UI can show).
 */
import type { ReconnectOptions } from "./backoff.js";
import type { Encoding } from "./codec/codec.js";
import type { WebSocketConstructor } from "./websocket.js";

/** Default for `requestTimeoutMs`: longer than the gate's own 5 s, so a slow handler shows as the gate's 408. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;
/** Default for `connectTimeoutMs`: WebSocket open plus handshake ack. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Default for `maxPending`: requests awaiting an answer or a connection. */
export const DEFAULT_MAX_PENDING = 1_024;
/** Default for `maxFrameBytes`: the largest frame taken from a gate. */
export const DEFAULT_MAX_FRAME_BYTES = 4 << 20;

export interface ClientOptions {
  /** Gate URLs (`ws://host:port/`); reconnects, and moves off a draining gate, go to the next one in turn. */
  servers: string | readonly string[];
  /** Binary frames with protobuf (default) or text frames with JSON. */
  encoding?: Encoding;
  /** Sent in the handshake for the gate's token check. */
  token?: string;
  /** Ask the gate to handle this session's requests one after another (chat clients should). */
  serial?: boolean;
  /** Ask for server timing on every answer (`Reply.timing`). */
  serverTiming?: boolean;
  /** Names this client in the handshake. */
  clientName?: string;
  /** The WebSocket class, where the platform has none (Node 20: `ws`'s `WebSocket`). */
  WebSocket?: WebSocketConstructor;
  /** How long a request waits in all (for a connection, then for its answer). */
  requestTimeoutMs?: number;
  /** How long opening the WebSocket plus the handshake may take. */
  connectTimeoutMs?: number;
  /** Reconnect when the connection drops (default true); `false` closes the client instead. */
  reconnect?: boolean | ReconnectOptions;
  /**
   * Ask for a resumable session, and resume it after a dropped link (docs/protocol.md,
   * "Resume"): same player, rooms and session data, every push and answer missed, in
   * order, none twice; requests in flight are sent again and answered once. Default:
   * on when `reconnect` is (resuming is reconnecting); `true` with `reconnect: false`
   * is a TypeError.
   */
  resume?: boolean;
  /** Requests awaiting an answer or a connection; more are refused with a local 429. */
  maxPending?: number;
  /** The largest frame accepted from a gate; a larger one drops the connection. */
  maxFrameBytes?: number;
}

export interface RequestOptions {
  /** Overrides `ClientOptions.requestTimeoutMs` for this request. */
  timeoutMs?: number;
  /**
   * For a keyed service's route (docs/protocol.md, "Keyed services"): the key that picks
   * the worker holding its state, e.g. a match for `arena.join`. Without one the gate
   * uses the session value the service names, else the player's uid. Other services
   * ignore it.
   */
  key?: string;
}

/** What a notify takes: a key, for a keyed service's route. */
export type NotifyOptions = Pick<RequestOptions, "key">;

/**
 * `idle` before `connect()`; `connecting` until the first handshake succeeds; `open`;
 * `reconnecting` after a drop; `closed` for good.
 */
export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

/** A change a UI can show. */
export interface StateEvent {
  state: ConnectionState;
  /** The gate this is about: the one opened, or the one the next attempt goes to. */
  url?: string;
  /** Connecting or reconnecting: this attempt's number since the last stable session (1, 2, ...). */
  attempt?: number;
  /** Connecting or reconnecting: how long the client waits before this attempt (ms). */
  delayMs?: number;
  /** Reconnecting or closed: why the previous connection or attempt ended. Open after a move: `moved: ` and the drain's reason. */
  reason?: string;
  /** Open: the gate's session id (a resumed session may have a new one: it is per gate). */
  sessionId?: bigint;
  /**
   * Open: true when this connection took up the session the dropped link had (a
   * resume: nothing to restore, nothing missed); false for a new session (the first,
   * one after a reconnect that did not resume, or after a move off a draining gate),
   * where the app logs in and joins again.
   */
  resumed?: boolean;
  /**
   * Open after a reconnect that asked to resume: the gate's `resume_code`. 200 resumed;
   * else why the session is a new one (400 not a token of this encoding, 403 another
   * player's, 404 no such session: ended, expired or resumed already, 409 it let go of
   * frames this client missed, 503 its gate did not answer; 0 a gate that does not resume).
   */
  resumeCode?: number;
}
