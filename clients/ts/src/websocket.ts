/**
 * The WebSocket the client needs: the browser's, or one injected where the platform has
 * none (Node 20: the `ws` package). Only what both provide is used: the `on*` handler
 * properties, `binaryType`, `send` and `close`; and `ws`'s `terminate` where it is there.
 */

/** What the client reads from a message event. */
export interface MessageEventLike {
  readonly data: unknown;
}

/** What the client reads from a close event. */
export interface CloseEventLike {
  readonly code: number;
  readonly reason: string;
}

/**
 * A WebSocket as the browser's and the `ws` package's both are. The handler properties
 * are typed `unknown` because each implementation declares its own event types; the
 * client only assigns functions taking the shapes above.
 */
export interface WebSocketLike {
  binaryType: string;
  onopen: unknown;
  onmessage: unknown;
  onclose: unknown;
  onerror: unknown;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  /** `ws` only: drops the connection without a close frame. Browsers have none. */
  terminate?: () => void;
}

/** A WebSocket class: `globalThis.WebSocket`, or `ws`'s `WebSocket` in Node. */
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** The platform's WebSocket, if it has one. */
export function platformWebSocket(): WebSocketConstructor | undefined {
  return (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
}

/** The frame in a message event: text, bytes, or undefined for anything else. */
export function frameOf(event: MessageEventLike): string | Uint8Array | undefined {
  const data = event.data;
  if (typeof data === "string") return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return undefined;
}

/** Close reasons are limited to 123 bytes of UTF-8; browsers throw on longer ones. */
export function closeReason(reason: string): string {
  let out = reason.slice(0, 123);
  while (new TextEncoder().encode(out).length > 123) out = out.slice(0, -1);
  return out;
}

/** What a close event says, for a reason: `: why` when the peer gave one, else its code. */
export function closeSaid(event: CloseEventLike): string {
  return event.reason ? `: ${event.reason}` : ` (code ${event.code})`;
}

/** Detaches a socket's handlers and closes it, whatever state it is in. */
export function shut(socket: WebSocketLike, reason: string): void {
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

/**
 * Drops a socket whose session is to be resumed: without a close frame where the
 * WebSocket can (`ws`'s `terminate`), since a close frame from the client ends the
 * session at the gate at once (docs/protocol.md, "Resume"). A browser's WebSocket can
 * only close with one; on a link that is really gone it never arrives.
 */
export function cut(socket: WebSocketLike, reason: string): void {
  if (typeof socket.terminate !== "function") return shut(socket, reason);
  socket.onopen = null;
  socket.onmessage = null;
  socket.onclose = null;
  socket.onerror = () => {};
  try {
    socket.terminate();
  } catch {
    // Already closed: nothing to do.
  }
}
