/**
 * Opening a connection: the WebSocket, the handshake, its ack within a deadline. The
 * client dials this way to connect, to reconnect, and to move off a draining gate while
 * the old connection still serves.
 */
import type { Codec, Frame, Inbound, ResumeAck } from "./codec/codec.js";
import { describe } from "./codec/codec.js";
import { Status } from "./gen/status_pb.js";
import {
  closeSaid,
  frameOf,
  shut,
  type CloseEventLike,
  type MessageEventLike,
  type WebSocketConstructor,
  type WebSocketLike,
} from "./websocket.js";

export interface DialOptions {
  WebSocket: WebSocketConstructor;
  codec: Codec;
  /** The handshake frame. */
  hello: () => Frame;
  /** WebSocket open plus handshake ack. */
  timeoutMs: number;
  maxFrameBytes: number;
}

/** A handshaken socket, its handlers detached for the caller to set. */
export interface Handshaken {
  socket: WebSocketLike;
  sessionId: bigint;
  heartbeatMs: number;
  /** What the ack said of resuming: the new token, and the outcome of a resume asked for. */
  resume: ResumeAck;
}

/** Why a dial failed, and whether trying again (here or elsewhere) may help. */
export interface DialFailure {
  reason: string;
  retry: boolean;
  /** The gate's code when it refused the handshake with a 4xx. */
  refusedCode?: number;
}

/**
 * Dials `url`; calls `done` once, never synchronously, with the handshaken socket or
 * why not. Returns the function that abandons the dial (then `done` is not called).
 */
export function dial(url: string, options: DialOptions, done: (result: Handshaken | DialFailure) => void): () => void {
  let settled = false;
  let socket: WebSocketLike | undefined;
  const end = (reason: string): boolean => {
    if (settled) return false;
    settled = true;
    clearTimeout(timer);
    if (socket !== undefined) shut(socket, reason);
    return true;
  };
  const fail = (failure: DialFailure) => {
    if (end(failure.reason)) done(failure);
  };
  const abandon = () => {
    end("abandoned");
  };
  const timer = setTimeout(
    () => fail({ reason: `no handshake ack from ${url} within ${options.timeoutMs} ms`, retry: true }),
    options.timeoutMs,
  );
  try {
    socket = new options.WebSocket(url);
    socket.binaryType = "arraybuffer";
  } catch (error) {
    queueMicrotask(() => fail({ reason: `cannot open ${url}: ${describe(error)}`, retry: true }));
    return abandon;
  }
  const opened = socket;
  opened.onopen = () => {
    try {
      opened.send(options.hello());
    } catch (error) {
      fail({ reason: `send failed: ${describe(error)}`, retry: true });
    }
  };
  opened.onmessage = (event: MessageEventLike) => {
    const packet = readFrame(event, options.codec, options.maxFrameBytes);
    if (typeof packet === "string") return fail({ reason: packet, retry: true });
    if (packet.kind === "heartbeat") return;
    if (packet.kind !== "handshakeAck") {
      return fail({ reason: `bad frame from the gate: expected a handshake ack, got ${packet.kind}`, retry: true });
    }
    if (packet.code !== Status.OK) {
      // A refused token is refused again: only a server-side failure is worth retrying.
      const reason = `handshake refused: ${packet.code} ${packet.message}`.trim();
      return fail({ reason, retry: packet.code >= 500, ...(packet.code < 500 && { refusedCode: packet.code }) });
    }
    settled = true;
    clearTimeout(timer);
    opened.onopen = null;
    opened.onmessage = null;
    opened.onclose = null;
    const { sessionId, heartbeatMs, resumeToken, resumeCode, lastSeq } = packet;
    // Synchronously, within this message event: a resume's replay follows the ack at
    // once, and must find the caller's handlers set.
    done({ socket: opened, sessionId, heartbeatMs, resume: { resumeToken, resumeCode, lastSeq } });
  };
  opened.onclose = (event: CloseEventLike) => fail({ reason: `could not connect to ${url}${closeSaid(event)}`, retry: true });
  // A close event follows every error event, with what is known; it is handled there.
  opened.onerror = () => {};
  return abandon;
}

/** The packet in a message event, or why it is bad input (the connection must end). */
export function readFrame(event: MessageEventLike, codec: Codec, maxFrameBytes: number): Inbound | string {
  const frame = frameOf(event);
  if (frame === undefined) return "a frame of unknown type from the gate";
  const size = typeof frame === "string" ? frame.length : frame.byteLength;
  if (size > maxFrameBytes) return `a frame of ${size} bytes from the gate, over ${maxFrameBytes}`;
  try {
    return codec.decode(frame);
  } catch (error) {
    return `bad frame from the gate: ${describe(error)}`;
  }
}
