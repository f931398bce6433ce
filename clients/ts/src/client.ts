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
 *
 * A gate that drains (it is being stopped) says so with a `drain` packet; the client
 * then dials the other gates in turn, starting after this one, while the old connection
 * keeps serving. Once one handshakes, requests go there; the old connection *retires*:
 * it stays open until every request sent on it is answered, then closes. A request the
 * draining gate refused without forwarding it (503 `gate draining`) is sent again on the
 * new connection. If no other gate answers, the client stays until the draining gate
 * closes, then reconnects as after any drop (its kick included).
 *
 * A resumable session (docs/protocol.md, "Resume"; `resume.ts` keeps its count) outlives
 * its link: a link that drops without a kick, a drain or bad input is *detached*, and the
 * next dial (with back-off, over the gate list) asks to resume it. What was sent on the
 * lost link waits for the outcome: resumed, it is sent again with the same ids, and the
 * gate's replay brings what was missed; not resumed, it fails as after any drop, and the
 * session is a new one. The state event says which (`resumed`, `resumeCode`).
 */
import { create } from "@bufbuild/protobuf";
import type { DescMessage, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import { backoffDelay, DEFAULT_RECONNECT, nextUrlIndex, type ReconnectOptions } from "./backoff.js";
import type { Body } from "./body.js";
import type { Codec, Encoding, Frame, Inbound } from "./codec/codec.js";
import { describe } from "./codec/codec.js";
import { Conn } from "./conn.js";
import { jsonCodec } from "./codec/json.js";
import { protobufCodec } from "./codec/protobuf.js";
import { dial, readFrame, type DialOptions, type Handshaken } from "./dial.js";
import { ShaddockError } from "./errors.js";
import { Status } from "./gen/status_pb.js";
import { Listeners } from "./listeners.js";
import {
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
import { Requests, type Reply } from "./requests.js";
import { Stream } from "./resume.js";
import type { Method, PushRoute } from "./typed.js";
import {
  closeSaid,
  platformWebSocket,
  type CloseEventLike,
  type MessageEventLike,
  type WebSocketConstructor,
} from "./websocket.js";

/** The reason of a client closed by `close()` without one. */
export const CLOSED_BY_CLIENT = "closed by client";
/** A session that lived this long resets the back-off when it drops; a shorter one counts as a failed attempt, so a gate that accepts and drops at once is not hammered. */
export const STABLE_SESSION_MS = 5_000;
/** WebSocket close code of a server going away: a kick followed by it reconnects. */
const CLOSE_GOING_AWAY = 1001;
/** The gate's close reason for a socket whose session was resumed on another connection. */
export const RESUMED_ELSEWHERE = "resumed elsewhere";

type Timer = ReturnType<typeof setTimeout>;

/** A session whose link dropped, to resume on the next connection. */
interface Detached {
  readonly stream: Stream;
  /** Why the link dropped: what its requests fail with if the resume does not succeed. */
  readonly reason: string;
}

export class Client {
  readonly encoding: Encoding;
  private readonly urls: readonly string[];
  private readonly codec: Codec;
  private readonly WebSocketClass: WebSocketConstructor;
  private readonly options: Required<Omit<ClientOptions, "servers" | "WebSocket" | "reconnect" | "encoding" | "resume">>;
  private readonly reconnect: Required<ReconnectOptions> | undefined;
  /** Ask for resumable sessions and resume them. */
  private readonly resume: boolean;

  private _state: ConnectionState = "idle";
  private _closedReason: string | undefined;
  /** The gate's code when it refused the handshake (401 for a token): what `ready()`,
   * `connect()` and later calls reject with, so a caller can tell auth from network. */
  private refusedCode: number | undefined;
  private _sessionId: bigint | undefined;
  private current: Conn | undefined;
  /** Connections moved away from, still answering what was sent on them, by id. */
  private readonly retiring = new Map<number, Conn>();
  private conns = 0;
  private _moves = 0;
  private _resumes = 0;
  /** The session of the link that dropped, until a connection resumes it or starts another. */
  private detached: Detached | undefined;
  private urlIndex = 0;
  /** Failed attempts (and short-lived sessions) since the last stable session. */
  private failures = 0;
  private openedAt = 0;
  private everOpen = false;
  /** Abandons the dial under way: connecting or reconnecting. */
  private dialing: (() => void) | undefined;
  /** Abandons the move under way: dialing the other gates after a drain. */
  private moving: (() => void) | undefined;
  private retryTimer: Timer | undefined;

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
    this.requests = new Requests(this.options.maxPending, (conn) => this.retireIfDone(conn));
    const reconnect = options.reconnect ?? true;
    this.reconnect = reconnect === false ? undefined : { ...DEFAULT_RECONNECT, ...(reconnect === true ? {} : reconnect) };
    if (options.resume === true && this.reconnect === undefined) {
      throw new TypeError("options.resume needs reconnecting: a session is resumed by the next connection");
    }
    this.resume = options.resume ?? this.reconnect !== undefined;
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

  /** Moves so far: a gate drained and the client went to another one (a new session, like a reconnect). */
  get moves(): number {
    return this._moves;
  }

  /** Resumes so far: a link dropped and the next connection took its session up again. */
  get resumes(): number {
    return this._resumes;
  }

  /** Whether the current session can be resumed if its link drops (the gate gave a resume token). */
  get resumable(): boolean {
    return this.current?.stream.resumable ?? false;
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
              reject(new ShaddockError(Status.TIMEOUT, `not connected within ${timeoutMs} ms`, true));
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

  /**
   * Sends a request; resolves with the answer's body, rejects with a ShaddockError. A
   * keyed service's route takes its key in `options.key` (`request("arena.join", body, { key: "m1" })`).
   */
  async request(route: string, body: Body = "", options?: RequestOptions): Promise<Body> {
    return (await this.requestReply(route, body, options)).body;
  }

  /** Like `request`, with the answer's server timing. */
  requestReply(route: string, body: Body = "", options?: RequestOptions): Promise<Reply> {
    return new Promise((resolve, reject) => this.enqueue(route, body, true, options, resolve, reject));
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
      throw new ShaddockError(Status.HANDLER_ERROR, `the answer did not decode: ${describe(error)}`, true, method.route);
    }
  }

  /**
   * Sends a notify (a request the gate never answers), with `options.key` for a keyed
   * service's route. Waits for a connection like a request does, and is dropped if none
   * comes within the request timeout.
   */
  notify(route: string, body: Body = "", options?: NotifyOptions): void {
    this.enqueue(route, body, false, { key: options?.key }, () => {}, (error) => this.report(error));
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
        if (this.current !== undefined) this.drop(this.current, `bad ${push.route} push from the gate: ${describe(error)}`, true);
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
    this.finish(reason);
  }

  // --- requests ---

  private enqueue(
    route: string,
    body: Body,
    answered: boolean,
    options: RequestOptions | undefined,
    resolve: (reply: Reply) => void,
    reject: (error: ShaddockError) => void,
  ): void {
    if (this._state === "closed") return reject(this.closedError(route));
    const key = options?.key;
    const encode = (id: number) => this.codec.encode({ kind: "request", id, route, body, ...(key ? { key } : {}) });
    const timeoutMs = options?.timeoutMs ?? this.options.requestTimeoutMs;
    const id = this.requests.add(route, answered, timeoutMs, encode, resolve, reject);
    if (id !== undefined && this._state === "open") this.sendRequest(id);
  }

  private sendRequest(id: number): void {
    const conn = this.current;
    const frame = this.requests.unsentFrame(id);
    if (conn !== undefined && frame !== undefined && this.send(frame)) this.requests.sent(id, conn.id);
  }

  // --- connection ---

  /** How to dial: for a new session, or to resume the one of `resuming`. */
  private dialOptions(resuming?: Stream): DialOptions {
    return {
      WebSocket: this.WebSocketClass,
      codec: this.codec,
      // Read when the socket opens: a refresh meanwhile changes the token.
      hello: () => {
        const { token, serverTiming, clientName, serial } = this.options;
        return this.codec.encode({
          kind: "handshake",
          token,
          serverTiming,
          client: clientName,
          serial,
          resumable: this.resume,
          resumeToken: resuming?.token ?? "",
          lastSeq: resuming?.lastSeq ?? 0,
        });
      },
      timeoutMs: this.options.connectTimeoutMs,
      maxFrameBytes: this.options.maxFrameBytes,
    };
  }

  private open(): void {
    // A failed attempt leaves the session detached: the next one asks again.
    const resuming = this.detached;
    this.dialing = dial(this.url, this.dialOptions(resuming?.stream), (result) => {
      this.dialing = undefined;
      if ("reason" in result) {
        if (result.refusedCode !== undefined) this.refusedCode = result.refusedCode;
        return this.retry(result.reason, result.retry);
      }
      this.opened(result, undefined, resuming);
    });
  }

  /**
   * A handshaken socket becomes the current connection; `reason` says why when it is a
   * move, `resuming` is the detached session it asked to take up.
   */
  private opened(handshaken: Handshaken, reason?: string, resuming?: Detached): void {
    const { resumeToken, resumeCode } = handshaken.resume;
    const resumed = resuming !== undefined && resumeCode === Status.OK;
    let stream = new Stream(resumeToken);
    if (resumed) {
      stream = resuming.stream;
      // Every ack brings a new token; each is good for one resume.
      stream.token = resumeToken;
    }
    const conn = new Conn(handshaken.socket, ++this.conns, stream);
    this.current = conn;
    if (resuming !== undefined) {
      this.detached = undefined;
      if (resumed) {
        this._resumes++;
        this.requests.reattach();
      } else {
        this.requests.failDetached(`connection lost: ${resuming.reason} (not resumed: ${resumeCode})`);
      }
    }
    conn.socket.onmessage = (event: MessageEventLike) => this.onFrame(conn, event);
    conn.socket.onclose = (event: CloseEventLike) => this.onClose(conn, event);
    conn.socket.onerror = () => {};
    this.everOpen = true;
    this.openedAt = Date.now();
    this._sessionId = handshaken.sessionId;
    conn.startHeartbeat(
      handshaken.heartbeatMs,
      () => {
        // Every heartbeat carries an ack: the gate lets go of what was handled.
        if (this.send(this.codec.encode({ kind: "heartbeat" }), conn)) this.acknowledge(conn);
      },
      (reason) => this.drop(conn, reason, true, true),
    );
    // Resumed, what waited goes out before anything a state listener sends: requests
    // sent again first, in the order made, as a serial session needs. A new session's
    // listeners log in first (what waited would be refused before that).
    if (resumed) this.sendUnsent(conn);
    this.setState({
      state: "open",
      url: this.url,
      sessionId: handshaken.sessionId,
      resumed,
      ...(resuming !== undefined && { resumeCode }),
      ...(reason !== undefined && { reason }),
    });
    if (!resumed) this.sendUnsent(conn);
  }

  /** Sends, on `conn`, every request that waits to be, oldest first. */
  private sendUnsent(conn: Conn): void {
    for (const id of this.requests.unsent()) {
      // A listener may have closed the client or dropped the socket.
      if (conn !== this.current) return;
      this.sendRequest(id);
    }
  }

  private onFrame(conn: Conn, event: MessageEventLike): void {
    conn.lastHeard = Date.now();
    const packet = readFrame(event, this.codec, this.options.maxFrameBytes);
    if (typeof packet === "string") return this.drop(conn, packet, true);
    this.dispatch(conn, packet);
  }

  private dispatch(conn: Conn, packet: Inbound): void {
    switch (packet.kind) {
      case "response": {
        // A repeat: a replay's, or the answer again of a request sent again.
        if (!conn.stream.accept(packet.seq)) return;
        const refused = this.requests.answer(packet.id, packet.code, packet.body, packet.message, packet.timing);
        // Refused by a retiring gate: send it again at once on the current one. Refused
        // by the current gate: it goes out when the move (or a reconnect) opens the next.
        if (refused && conn !== this.current && this._state === "open") this.sendRequest(packet.id);
        return this.handled(conn, packet.seq);
      }
      case "push":
        if (!conn.stream.accept(packet.seq)) return;
        this.pushListeners.get(packet.route)?.emit((error) => this.report(error), packet.body);
        return this.handled(conn, packet.seq);
      case "kick":
        // The gate closes the session next; the close decides whether to reconnect.
        conn.kickReason = packet.reason;
        if (conn === this.current) this.kickListeners.emit((error) => this.report(error), packet.reason);
        return;
      case "refreshAck": {
        const accepted = this.requests.refreshAcked(packet.code, packet.message);
        if (accepted === false) return this.drop(conn, "bad frame from the gate: a refresh ack for no refresh", true);
        if (accepted !== undefined) this.options.token = accepted;
        return;
      }
      case "drain":
        if (conn === this.current && !conn.drained) {
          conn.drained = true;
          this.move(conn, packet.reason);
        }
        return;
      case "heartbeat":
        return;
      case "handshakeAck":
        return this.drop(conn, "bad frame from the gate: a second handshake ack", true);
    }
  }

  /** Dials the other gates in turn, starting after the draining one; the first that handshakes takes over. */
  private move(from: Conn, reason: string): void {
    const others = this.urls.length - 1;
    const start = this.urlIndex;
    const attempt = (step: number): void => {
      this.moving = undefined;
      // None answered: stay on the draining gate until it closes.
      if (step > others) return;
      const index = (start + step) % this.urls.length;
      this.moving = dial(this.urls[index]!, this.dialOptions(), (result) => {
        if ("reason" in result) return attempt(step + 1);
        this.moving = undefined;
        this.retiring.set(from.id, from);
        this.urlIndex = index;
        this._moves++;
        this.opened(result, `moved: ${reason}`);
        this.retireIfDone(from.id);
      });
    };
    attempt(1);
  }

  /** Closes retiring connection `id` once nothing waits on it. */
  private retireIfDone(id: number): void {
    const conn = this.retiring.get(id);
    if (conn === undefined || this.requests.pendingOn(id) > 0) return;
    this.retiring.delete(id);
    this.release(conn, "moved to another gate");
  }

  /** A push or response with `seq` was handled on `conn`: acknowledged every `ACK_EVERY` frames. */
  private handled(conn: Conn, seq: number): void {
    if (conn.stream.handled(seq)) this.acknowledge(conn);
  }

  /** Sends an ack of what `conn`'s session has handled, when it is resumable. */
  private acknowledge(conn: Conn): void {
    // A listener may have closed the client or dropped the connection meanwhile.
    if (conn !== this.current && !this.retiring.has(conn.id)) return;
    const seq = conn.stream.ack();
    if (seq !== undefined) this.send(this.codec.encode({ kind: "ack", seq }), conn);
  }

  private onClose(conn: Conn, event: CloseEventLike): void {
    if (conn.kickReason !== undefined) {
      // A kick ends the session for good, unless the gate itself is going away
      // (shutting down, or draining): then the client moves to another gate.
      return this.drop(conn, conn.kickReason, event.code === CLOSE_GOING_AWAY || conn.drained);
    }
    if (event.reason === RESUMED_ELSEWHERE) {
      // Someone else took the session up (this client's own resume leaves no socket
      // behind to be told): it lives there now, not this client's to resume or replace.
      return this.drop(conn, RESUMED_ELSEWHERE, false);
    }
    this.drop(conn, `the gate closed the connection${closeSaid(event)}`, true, true);
  }

  /** Sends a frame on `conn` (the current connection by default); false (and the connection dropped) when it cannot. */
  private send(frame: Frame, conn: Conn | undefined = this.current): boolean {
    if (conn === undefined) return false;
    try {
      conn.socket.send(frame);
      return true;
    } catch (error) {
      this.drop(conn, `send failed: ${describe(error)}`, true, true);
      return false;
    }
  }

  /**
   * Ends `conn` for `reason`. A retiring connection just goes (failing what still
   * waited on it); the current one reconnects when allowed and configured, and a lost
   * link (`resumable`: not a kick, not bad input) of a resumable session is detached
   * for the next connection to resume, unless its gate had said it drains (the drain's
   * end ends the session).
   */
  private drop(conn: Conn, reason: string, reconnectable: boolean, resumable = false): void {
    if (this.retiring.delete(conn.id)) return this.release(conn, reason);
    if (conn !== this.current) return;
    this.current = undefined;
    this.moving?.();
    this.moving = undefined;
    this._sessionId = undefined;
    if (resumable && reconnectable && !conn.drained && this.reconnect !== undefined && conn.stream.resumable) {
      this.detached = { stream: conn.stream, reason };
      conn.cut(reason);
      this.requests.detach(conn.id);
    } else {
      this.release(conn, reason);
    }
    // Refresh acks carry no seq and are not replayed: a refresh in flight fails.
    this.requests.failRefreshes(`connection lost: ${reason}`);
    this.retry(reason, reconnectable);
  }

  /** Closes a connection that is no longer current or retiring; what was sent on it fails. */
  private release(conn: Conn, reason: string): void {
    conn.close(reason);
    this.requests.failSent(conn.id, `connection lost: ${reason}`);
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
    clearTimeout(this.retryTimer);
    this.dialing?.();
    this.moving?.();
    this.dialing = this.moving = undefined;
    for (const conn of [this.current, ...this.retiring.values()]) {
      if (conn === undefined) continue;
      conn.close(reason);
    }
    this.current = undefined;
    this.retiring.clear();
    this.detached = undefined;
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
    const code = this.refusedCode ?? Status.UNAVAILABLE;
    return new ShaddockError(code, `client closed: ${this._closedReason ?? ""}`, true, route);
  }

  private report(error: unknown): void {
    if (this.errorListeners.size > 0) this.errorListeners.emit(() => {}, error);
    else console.error("shaddock client:", error);
  }
}

/** Creates a client and resolves once it is connected (see `Client.connect`). */
export function connect(options: ClientOptions): Promise<Client> {
  return Client.connect(options);
}
