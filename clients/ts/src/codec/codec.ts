/**
 * What a codec does: turn the client's packets into frames and the gate's frames into
 * packets, and carry typed messages as bodies. One implementation per encoding
 * (`protobuf.ts`, `json.ts`); the connection never sees an encoding's bytes.
 */
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import type { Body } from "../body.js";

/** The session's encoding: binary frames with protobuf, or text frames with JSON. */
export type Encoding = "protobuf" | "json";

/** One WebSocket frame: text, or binary. */
export type Frame = string | Uint8Array;

/** Where a request's time went on the server, in microseconds (handshake `serverTiming`). */
export interface Timing {
  /** Gate receive to gate answer: the whole server side. */
  totalUs: number;
  /** Waiting in the worker's queue. */
  queueUs: number;
  /** Inside the handler. */
  handlerUs: number;
}

/** A handshake: the first frame of every connection. */
export interface Hello {
  token: string;
  serverTiming: boolean;
  client: string;
  serial: boolean;
  /** Ask for a resumable session (docs/protocol.md, "Resume"). */
  resumable: boolean;
  /** Resume the session this token came with; empty for a new session. */
  resumeToken: string;
  /** With `resumeToken`: the highest `seq` handled. */
  lastSeq: number;
}

/**
 * Packets a client sends. Sequence numbers are uint64 on the wire and numbers here:
 * a session would need 2^53 frames to pass what a number holds exactly.
 */
export type Outbound =
  | ({ kind: "handshake" } & Hello)
  | { kind: "heartbeat" }
  | { kind: "request"; id: number; route: string; body: Body; key?: string }
  | { kind: "refresh"; token: string }
  | { kind: "ack"; seq: number };

/** What a handshake ack says of a session's resume (all empty or 0 from a gate that does not resume). */
export interface ResumeAck {
  /** The token to resume this session with; empty when it cannot be resumed. */
  resumeToken: string;
  /** 0 when no resume was asked, 200 resumed, else why the session is a new one. */
  resumeCode: number;
  /** Resumed: the highest `seq` the session had sent. */
  lastSeq: number;
}

/** Packets a gate sends. `seq` is 0 outside resumable sessions. */
export type Inbound =
  | ({ kind: "handshakeAck"; code: number; sessionId: bigint; heartbeatMs: number; message: string } & ResumeAck)
  | { kind: "heartbeat" }
  | { kind: "response"; id: number; code: number; body: Body; message: string; timing?: Timing; seq: number }
  | { kind: "push"; route: string; body: Body; seq: number }
  | { kind: "kick"; reason: string }
  | { kind: "refreshAck"; code: number; message: string }
  | { kind: "drain"; reason: string; graceMs: number };

export interface Codec {
  readonly encoding: Encoding;
  /** Throws a ShaddockError (400) when the body cannot travel in this encoding. */
  encode(packet: Outbound): Frame;
  /** Throws a ProtocolError for a frame that does not decode or is not for a client. */
  decode(frame: Frame): Inbound;
  /** A typed message as this encoding's body. */
  encodeMessage<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>): Body;
  /** A body as a typed message; throws a ProtocolError when it does not decode. */
  decodeMessage<Desc extends DescMessage>(schema: Desc, body: Body): MessageShape<Desc>;
}

/** Packet kinds only a client sends: a gate sending one is broken. */
export const CLIENT_ONLY_KINDS: readonly string[] = ["handshake", "request", "refresh", "ack"];

/** A message for a thrown value of unknown type. */
export function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
