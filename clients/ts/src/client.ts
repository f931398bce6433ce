/**
 * The client: one WebSocket to a gate at a time, its handshake and heartbeat, requests
 * matched to their answers by id, pushes handed to listeners by route, and reconnection
 * with back-off over a list of gates.
 *
 * Every path that ends a socket goes through `drop`, which says why; the reason reaches
 * the caller in a state event (and in `closed()` when the client ends). Bad input from a
 * gate (a frame that does not decode, a packet a client does not expect, a typed push
 * that is not its message) drops the connection with the reason; it never throws out of
 * a WebSocket handler.
 */
import { create } from "@bufbuild/protobuf";
import type { DescMessage, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import { backoffDelay, DEFAULT_RECONNECT, nextUrlIndex, type ReconnectOptions } from "./backoff.js";
import type { Body } from "./body.js";
import type { Codec, Encoding, Frame, Inbound } from "./codec/codec.js";
import { describe } from "./codec/codec.js";
import { jsonCodec } from "./codec/json.js";
import { protobufCodec } from "./codec/protobuf.js";
import { ShaddockError, Status } from "./errors.js";
import { Listeners } from "./listeners.js";
import { Requests, type Reply } from "./requests.js";
import type { Method, PushRoute } from "./typed.js";
import {
  closeReason,
  frameOf,
  platformWebSocket,
  type CloseEventLike,
  type MessageEventLike,
  type WebSocketConstructor,
  type WebSocketLike,
} from "./websocket.js";

/** Default for `requestTimeoutMs`: longer than the gate's own 5 s, so a slow handler shows as the gate's 408. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;
/** Default for `connectTimeoutMs`: WebSocket open plus handshake ack. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Default for `maxPending`: requests awaiting an answer or a connection. */
export const DEFAULT_MAX_PENDING = 1_024;
/** Default for `maxFrameBytes`: the largest frame taken from a gate. */
export const DEFAULT_MAX_FRAME_BYTES = 4 << 20;
/** The reason of a client closed by `close()` without one. */
export const CLOSED_BY_CLIENT = "closed by client";
/** A session that lived this long resets the back-off when it drops; a shorter one counts as a failed attempt, so a gate that accepts and drops at once is not hammered. */
export const STABLE_SESSION_MS = 5_000;
/** WebSocket close code of a server going away: a kick followed by it reconnects. */
const CLOSE_GOING_AWAY = 1001;

export interface ClientOptions {
  /** Gate URLs (`ws://host:port/`); reconnects go to the next one in turn. */
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
  /** Requests awaiting an answer or a connection; more are refused with a local 429. */
  maxPending?: number;
  /** The largest frame accepted from a gate; a larger one drops the connection. */
  maxFrameBytes?: number;
}

export interface RequestOptions {
  /** Overrides `ClientOptions.requestTimeoutMs` for this request. */
  timeoutMs?: number;
}

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
  /** Reconnecting or closed: why the previous connection or attempt ended. */
  reason?: string;
  /** Open: the gate's session id. */
  sessionId?: bigint;
}

type Timer = ReturnType<typeof setTimeout>;

export class Client {
  readonly encoding: Encoding;
  private readonly urls: readonly string[];
  private readonly codec: Codec;
  private readonly WebSocketClass: WebSocketConstructor;
  private readonly options: Required<Omit<ClientOptions, "servers" | "WebSocket" | "reconnect" | "encoding">>;
  private readonly reconnect: Required<ReconnectOptions> | undefined;

  private _state: ConnectionState = "idle";
  private _closedReason: string | undefined;
  /** The gate's code when it refused the handshake (401 for a token): what `ready()`,
   * `connect()` and later calls reject with, so a caller can tell auth from network. */
  private refusedCode: number | undefined;
  private _sessionId: bigint | undefined;
  private socket: WebSocketLike | undefined;
  private urlIndex = 0;
  /** Failed attempts (and short-lived sessions) since the last stable session. */
  private failures = 0;
  private openedAt = 0;
  private everOpen = false;
  private acked = false;
  private kickReason: string | undefined;
  private lastHeard = 0;
  private connectTimer: Timer | undefined;
  private retryTimer: Timer | undefined;
  private heartbeatTimer: ReturnType<typeof setInterval> | undefined;

  /** Requests, notifies and refreshes not yet answered (or not yet sent). */
  private readonly requests: Requests;

  private readonly stateListeners = new Listeners<[StateEvent]>();
  private readonly kickListeners = new Listeners<[string]>();
  private readonly errorListeners = new Listeners<[unknown]>();
  private readonly pushListeners = new Map<string, Listeners<[Body]>>();
  private readonly closedPromise: Promise<string>;
  private resolveClosed!: (reason: string) => void;

  constructor(options: ClientOptions) {
    const urls = typeof options.servers === "string" ? [options.servers] : [...options.servers];
    if (urls.length === 0) throw new TypeError("options.servers names no gate");
    const WebSocketClass = options.WebSocket ?? platformWebSocket();
    if (WebSocketClass === undefined) {
      throw new TypeError("this platform has no WebSocket: pass options.WebSocket (in Node, the ws package's WebSocket)");
    }
    this.urls = urls;
    this.WebSocketClass = WebSocketClass;
    this.encoding = options.encoding ?? "protobuf";
    this.codec = this.encoding === "json" ? jsonCodec : protobufCodec;
    this.options = {
      token: options.token ?? "",
      serial: options.serial ?? false,
      serverTiming: options.serverTiming ?? false,
      clientName: options.clientName ?? "shaddock-ts/0.1.0",
      requestTimeoutMs: options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
      connectTimeoutMs: options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
      maxPending: options.maxPending ?? DEFAULT_MAX_PENDING,
      maxFrameBytes: options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES,
    };
    this.requests = new Requests(this.options.maxPending);
    const reconnect = options.reconnect ?? true;
    this.reconnect = reconnect === false ? undefined : { ...DEFAULT_RECONNECT, ...(reconnect === true ? {} : reconnect) };
    this.closedPromise = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
  }

  /** Creates a client, connects, and resolves once the first handshake succeeds (within `connectTimeoutMs`, retries included). */
  static async connect(options: ClientOptions): Promise<Client> {
    const client = new Client(options);
    client.connect();
    try {
      await client.ready(client.options.connectTimeoutMs);
    } catch (error) {
      client.close(error instanceof Error ? error.message : CLOSED_BY_CLIENT);
      throw error;
    }
    return client;
  }

  get state(): ConnectionState {
    return this._state;
  }

  /** The current session's id while open. */
  get sessionId(): bigint | undefined {
    return this._sessionId;
  }

  /** The gate of the current (or next) connection. */
  get url(): string {
    return this.urls[this.urlIndex]!;
  }

  /** Why the client closed, once it has. */
  get closedReason(): string | undefined {
    return this._closedReason;
  }

  /** Starts connecting; does nothing unless the client is idle. */
  connect(): void {
    if (this._state !== "idle") return;
    this.setState({ state: "connecting", url: this.url, attempt: 1, delayMs: 0 });
    this.open();
  }

  /** Resolves when the connection is open; rejects when the client closes first, or with 408 after `timeoutMs`. */
  ready(timeoutMs?: number): Promise<void> {
    if (this._state === "open") return Promise.resolve();
    if (this._state === "closed") return Promise.reject(this.closedError());
    return new Promise((resolve, reject) => {
      const timer =
        timeoutMs === undefined
          ? undefined
          : setTimeout(() => {
              off();
              reject(new ShaddockError(Status.Timeout, `not connected within ${timeoutMs} ms`, true));
            }, timeoutMs);
      const off = this.onState((event) => {
        if (event.state !== "open" && event.state !== "closed") return;
        off();
        clearTimeout(timer);
        if (event.state === "open") resolve();
        else reject(this.closedError());
      });
    });
  }

  /** Resolves with the reason once the client has closed for good. */
  closed(): Promise<string> {
    return this.closedPromise;
  }

  /** Sends a request; resolves with the answer's body, rejects with a ShaddockError. */
  async request(route: string, body: Body = "", options?: RequestOptions): Promise<Body> {
    return (await this.requestReply(route, body, options)).body;
  }

  /** Like `request`, with the answer's server timing. */
  requestReply(route: string, body: Body = "", options?: RequestOptions): Promise<Reply> {
    return new Promise((resolve, reject) => this.enqueue(route, body, true, options?.timeoutMs, resolve, reject));
  }

  /** Sends a typed request and decodes its typed answer, in the session's encoding. */
  async call<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    input: MessageInitShape<I>,
    options?: RequestOptions,
  ): Promise<MessageShape<O>> {
    const body = this.codec.encodeMessage(method.input, create(method.input, input));
    const reply = await this.requestReply(method.route, body, options);
    try {
      return this.codec.decodeMessage(method.output, reply.body);
    } catch (error) {
      throw new ShaddockError(Status.HandlerError, `the answer did not decode: ${describe(error)}`, true, method.route);
    }
  }

  /**
   * Sends a notify (a request the gate never answers). Waits for a connection like a
   * request does, and is dropped if none comes within the request timeout.
   */
  notify(route: string, body: Body = ""): void {
    this.enqueue(route, body, false, undefined, () => {}, (error) => this.report(error));
  }

  /**
   * Hands the gate a fresh token for this session before the current one expires
   * (the gate kicks a session whose token expired). Resolves when the gate accepts it;
   * rejects with its code (401) and message when it refuses, and the session keeps
   * the old one. Later handshakes (reconnects) use the accepted token. While not
   * connected it only replaces the token the next handshake sends.
   */
  refresh(token: string, options?: RequestOptions): Promise<void> {
    if (this._state === "closed") return Promise.reject(this.closedError());
    if (this._state !== "open") {
      this.options.token = token;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      this.requests.addRefresh(token, options?.timeoutMs ?? this.options.requestTimeoutMs, resolve, reject);
      this.send(this.codec.encode({ kind: "refresh", token }));
    });
  }

  /** Listens to pushes on `route`; returns the function that stops it. */
  on(route: string, listener: (body: Body) => void): () => void {
    let listeners = this.pushListeners.get(route);
    if (listeners === undefined) {
      listeners = new Listeners();
      this.pushListeners.set(route, listeners);
    }
    return listeners.add(listener);
  }

  /** Listens to typed pushes; a push that is not its message drops the connection. */
  onPush<M extends DescMessage>(push: PushRoute<M>, listener: (message: MessageShape<M>) => void): () => void {
    return this.on(push.route, (body) => {
      let message: MessageShape<M>;
      try {
        message = this.codec.decodeMessage(push.schema, body);
      } catch (error) {
        if (this.socket !== undefined) this.drop(this.socket, `bad ${push.route} push from the gate: ${describe(error)}`, true);
        return;
      }
      listener(message);
    });
  }

  /** State changes: connecting, open, reconnecting, closed. */
  onState(listener: (event: StateEvent) => void): () => void {
    return this.stateListeners.add(listener);
  }

  /** Kicks, with the gate's reason; the gate closes the session right after. */
  onKick(listener: (reason: string) => void): () => void {
    return this.kickListeners.add(listener);
  }

  /** Errors thrown by listeners and notifies that failed; logged to the console when nobody listens. */
  onError(listener: (error: unknown) => void): () => void {
    return this.errorListeners.add(listener);
  }

  /** Closes for good: pending requests fail with 503, no reconnect. */
  close(reason: string = CLOSED_BY_CLIENT): void {
    if (this._state === "closed") return;
    const socket = this.socket;
    if (socket !== undefined) {
      this.socket = undefined;
      shut(socket, reason);
    }
    this.finish(reason);
  }

  // --- requests ---

  private enqueue(
    route: string,
    body: Body,
    answered: boolean,
    timeoutMs: number | undefined,
    resolve: (reply: Reply) => void,
    reject: (error: ShaddockError) => void,
  ): void {
    if (this._state === "closed") return reject(this.closedError(route));
    const encode = (id: number) => this.codec.encode({ kind: "request", id, route, body });
    const id = this.requests.add(route, answered, timeoutMs ?? this.options.requestTimeoutMs, encode, resolve, reject);
    if (id !== undefined && this._state === "open") this.sendRequest(id);
  }

  private sendRequest(id: number): void {
    const frame = this.requests.unsentFrame(id);
    if (frame !== undefined && this.send(frame)) this.requests.sent(id);
  }

  // --- connection ---

  private open(): void {
    const url = this.url;
    let socket: WebSocketLike;
    try {
      socket = new this.WebSocketClass(url);
      socket.binaryType = "arraybuffer";
    } catch (error) {
      this.retry(`cannot open ${url}: ${describe(error)}`, true);
      return;
    }
    this.socket = socket;
    this.acked = false;
    this.kickReason = undefined;
    this.connectTimer = setTimeout(
      () => this.drop(socket, `no handshake ack from ${url} within ${this.options.connectTimeoutMs} ms`, true),
      this.options.connectTimeoutMs,
    );
    socket.onopen = () => {
      if (socket !== this.socket) return;
      const { token, serverTiming, clientName, serial } = this.options;
      this.send(this.codec.encode({ kind: "handshake", token, serverTiming, client: clientName, serial }));
    };
    socket.onmessage = (event: MessageEventLike) => this.onFrame(socket, event);
    socket.onclose = (event: CloseEventLike) => this.onClose(socket, event);
    // A close event follows every error event, with what is known; it is handled there.
    socket.onerror = () => {};
  }

  private onFrame(socket: WebSocketLike, event: MessageEventLike): void {
    if (socket !== this.socket) return;
    this.lastHeard = Date.now();
    const frame = frameOf(event);
    if (frame === undefined) return this.drop(socket, "a frame of unknown type from the gate", true);
    const size = typeof frame === "string" ? frame.length : frame.byteLength;
    if (size > this.options.maxFrameBytes) {
      return this.drop(socket, `a frame of ${size} bytes from the gate, over ${this.options.maxFrameBytes}`, true);
    }
    let packet: Inbound;
    try {
      packet = this.codec.decode(frame);
    } catch (error) {
      return this.drop(socket, `bad frame from the gate: ${describe(error)}`, true);
    }
    if (!this.acked) this.onHandshake(socket, packet);
    else this.dispatch(socket, packet);
  }

  private onHandshake(socket: WebSocketLike, packet: Inbound): void {
    if (packet.kind === "heartbeat") return;
    if (packet.kind !== "handshakeAck") {
      return this.drop(socket, `bad frame from the gate: expected a handshake ack, got ${packet.kind}`, true);
    }
    if (packet.code !== Status.OK) {
      // A refused token is refused again: only a server-side failure is worth retrying.
      const reason = `handshake refused: ${packet.code} ${packet.message}`.trim();
      if (packet.code < 500) this.refusedCode = packet.code;
      return this.drop(socket, reason, packet.code >= 500);
    }
    clearTimeout(this.connectTimer);
    this.acked = true;
    this.everOpen = true;
    this.openedAt = Date.now();
    this._sessionId = packet.sessionId;
    this.startHeartbeat(socket, packet.heartbeatMs);
    this.setState({ state: "open", url: this.url, sessionId: packet.sessionId });
    // A listener may have closed the client or dropped the socket.
    if (socket !== this.socket) return;
    for (const id of this.requests.unsent()) {
      this.sendRequest(id);
      if (socket !== this.socket) return;
    }
  }

  private dispatch(socket: WebSocketLike, packet: Inbound): void {
    switch (packet.kind) {
      case "response":
        return this.requests.answer(packet.id, packet.code, packet.body, packet.message, packet.timing);
      case "push":
        this.pushListeners.get(packet.route)?.emit((error) => this.report(error), packet.body);
        return;
      case "kick":
        // The gate closes the session next; the close decides whether to reconnect.
        this.kickReason = packet.reason;
        this.kickListeners.emit((error) => this.report(error), packet.reason);
        return;
      case "refreshAck": {
        const accepted = this.requests.refreshAcked(packet.code, packet.message);
        if (accepted === false) return this.drop(socket, "bad frame from the gate: a refresh ack for no refresh", true);
        if (accepted !== undefined) this.options.token = accepted;
        return;
      }
      case "heartbeat":
        return;
      case "handshakeAck":
        return this.drop(socket, "bad frame from the gate: a second handshake ack", true);
    }
  }

  private startHeartbeat(socket: WebSocketLike, heartbeatMs: number): void {
    if (heartbeatMs <= 0) return;
    // Half the gate's interval: the gate closes after two silent intervals. The gate
    // answers every heartbeat, so two intervals without a frame mean it is gone.
    this.heartbeatTimer = setInterval(() => {
      if (Date.now() - this.lastHeard > 2 * heartbeatMs) {
        this.drop(socket, `no frame from the gate in ${2 * heartbeatMs} ms`, true);
      } else {
        this.send(this.codec.encode({ kind: "heartbeat" }));
      }
    }, heartbeatMs / 2);
  }

  private onClose(socket: WebSocketLike, event: CloseEventLike): void {
    if (socket !== this.socket) return;
    const said = event.reason ? `: ${event.reason}` : ` (code ${event.code})`;
    if (this.kickReason !== undefined) {
      // A kick ends the session for good, unless the gate itself is going away
      // (shutting down): then the client moves to another gate.
      return this.drop(socket, this.kickReason, event.code === CLOSE_GOING_AWAY);
    }
    const reason = this.acked ? `the gate closed the connection${said}` : `could not connect to ${this.url}${said}`;
    this.drop(socket, reason, true);
  }

  /** Sends a frame on the open socket; false (and the connection dropped) when it cannot. */
  private send(frame: Frame): boolean {
    const socket = this.socket;
    if (socket === undefined) return false;
    try {
      socket.send(frame);
      return true;
    } catch (error) {
      this.drop(socket, `send failed: ${describe(error)}`, true);
      return false;
    }
  }

  /** Ends `socket` (if still current) for `reason`; reconnects when allowed and configured. */
  private drop(socket: WebSocketLike, reason: string, reconnectable: boolean): void {
    if (socket !== this.socket) return;
    this.socket = undefined;
    shut(socket, reason);
    clearTimeout(this.connectTimer);
    clearInterval(this.heartbeatTimer);
    this.acked = false;
    this._sessionId = undefined;
    this.requests.failSent(`connection lost: ${reason}`);
    this.retry(reason, reconnectable);
  }

  private retry(reason: string, reconnectable: boolean): void {
    const policy = this.reconnect;
    if (!reconnectable || policy === undefined) return this.finish(reason);
    const stable = this._state === "open" && Date.now() - this.openedAt >= STABLE_SESSION_MS;
    this.failures = stable ? 0 : this.failures + 1;
    if (this.failures >= policy.maxAttempts) {
      return this.finish(`gave up after ${this.failures} attempts: ${reason}`);
    }
    this.urlIndex = nextUrlIndex(this.urlIndex, this.urls);
    const delayMs = Math.round(backoffDelay(this.failures, policy));
    this.setState({
      state: this.everOpen ? "reconnecting" : "connecting",
      url: this.url,
      attempt: this.failures + 1,
      delayMs,
      reason,
    });
    if (this._state === "closed") return;
    this.retryTimer = setTimeout(() => this.open(), delayMs);
  }

  private finish(reason: string): void {
    if (this._state === "closed") return;
    clearTimeout(this.connectTimer);
    clearTimeout(this.retryTimer);
    clearInterval(this.heartbeatTimer);
    this._closedReason = reason;
    this._sessionId = undefined;
    this._state = "closed";
    this.requests.failAll(`client closed: ${reason}`);
    this.stateListeners.emit((error) => this.report(error), { state: "closed", reason });
    this.resolveClosed(reason);
  }

  private setState(event: StateEvent): void {
    this._state = event.state;
    this.stateListeners.emit((error) => this.report(error), event);
  }

  private closedError(route?: string): ShaddockError {
    const code = this.refusedCode ?? Status.Unavailable;
    return new ShaddockError(code, `client closed: ${this._closedReason ?? ""}`, true, route);
  }

  private report(error: unknown): void {
    if (this.errorListeners.size > 0) this.errorListeners.emit(() => {}, error);
    else console.error("shaddock client:", error);
  }
}

/** Detaches a socket's handlers and closes it, whatever state it is in. */
function shut(socket: WebSocketLike, reason: string): void {
  socket.onopen = null;
  socket.onmessage = null;
  socket.onclose = null;
  // Not null: `ws` throws an error event nobody listens to (closing a socket that is
  // still connecting emits one).
  socket.onerror = () => {};
  try {
    socket.close(1000, closeReason(reason));
  } catch {
    // Already closed, or still connecting in an implementation that refuses: nothing to do.
  }
}

/** Creates a client and resolves once it is connected (see `Client.connect`). */
export function connect(options: ClientOptions): Promise<Client> {
  return Client.connect(options);
}
