/**
 * Binary frames: each frame is one `Packet` in protobuf, and typed bodies are their
 * messages' protobuf bytes.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { bodyBytes, isJsonObject, type Body } from "../body.js";
import { ProtocolError, ShaddockError } from "../errors.js";
import {
  AckSchema,
  HandshakeSchema,
  HeartbeatSchema,
  PacketSchema,
  RefreshSchema,
  RequestSchema,
  type Packet,
} from "../gen/client_pb.js";
import { Status } from "../gen/status_pb.js";
import { CLIENT_ONLY_KINDS, describe, type Codec, type Frame, type Inbound, type Outbound } from "./codec.js";

export const protobufCodec: Codec = {
  encoding: "protobuf",

  encode(packet: Outbound): Frame {
    return toBinary(PacketSchema, create(PacketSchema, { kind: outbound(packet) }));
  },

  decode(frame: Frame): Inbound {
    if (typeof frame === "string") {
      throw new ProtocolError("a text frame on a protobuf session");
    }
    let packet: Packet;
    try {
      packet = fromBinary(PacketSchema, frame);
    } catch (error) {
      throw new ProtocolError(`invalid packet: ${describe(error)}`);
    }
    const kind = packet.kind;
    switch (kind.case) {
      case "handshakeAck":
        return {
          kind: "handshakeAck",
          code: kind.value.code,
          sessionId: kind.value.sessionId,
          heartbeatMs: kind.value.heartbeatMs,
          message: kind.value.message,
          resumeToken: kind.value.resumeToken,
          resumeCode: kind.value.resumeCode,
          lastSeq: seqOf(kind.value.lastSeq),
        };
      case "heartbeat":
        return { kind: "heartbeat" };
      case "response": {
        const { id, code, body, message, timing, seq } = kind.value;
        return {
          kind: "response",
          id: Number(id),
          code,
          body,
          message,
          seq: seqOf(seq),
          ...(timing && {
            timing: { totalUs: timing.totalUs, queueUs: timing.queueUs, handlerUs: timing.handlerUs },
          }),
        };
      }
      case "push":
        return { kind: "push", route: kind.value.route, body: kind.value.body, seq: seqOf(kind.value.seq) };
      case "kick":
        return { kind: "kick", reason: kind.value.reason };
      case "refreshAck":
        return { kind: "refreshAck", code: kind.value.code, message: kind.value.message };
      case "drain":
        return { kind: "drain", reason: kind.value.reason, graceMs: kind.value.graceMs };
      case undefined:
        throw new ProtocolError("unknown packet kind");
      default:
        if (CLIENT_ONLY_KINDS.includes(kind.case)) {
          throw new ProtocolError(`packet not for a client: ${kind.case}`);
        }
        throw new ProtocolError(`unknown packet kind: ${String(kind.case)}`);
    }
  },

  encodeMessage<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>): Body {
    return toBinary(schema, message);
  },

  decodeMessage<Desc extends DescMessage>(schema: Desc, body: Body): MessageShape<Desc> {
    try {
      return fromBinary(schema, bodyBytes(body));
    } catch (error) {
      throw new ProtocolError(`a body that is not a ${schema.typeName}: ${describe(error)}`);
    }
  },
};

/** A uint64 sequence number as a number; past 2^53 it could not be compared exactly. */
function seqOf(seq: bigint): number {
  if (seq > BigInt(Number.MAX_SAFE_INTEGER)) throw new ProtocolError(`invalid packet: seq ${seq} is too large`);
  return Number(seq);
}

function outbound(packet: Outbound): Packet["kind"] {
  switch (packet.kind) {
    case "handshake":
      return {
        case: "handshake",
        value: create(HandshakeSchema, {
          token: packet.token,
          serverTiming: packet.serverTiming,
          client: packet.client,
          serial: packet.serial,
          resumable: packet.resumable,
          resumeToken: packet.resumeToken,
          lastSeq: BigInt(packet.lastSeq),
        }),
      };
    case "ack":
      return { case: "ack", value: create(AckSchema, { seq: BigInt(packet.seq) }) };
    case "heartbeat":
      return { case: "heartbeat", value: create(HeartbeatSchema) };
    case "refresh":
      return { case: "refresh", value: create(RefreshSchema, { token: packet.token }) };
    case "request":
      if (isJsonObject(packet.body)) {
        throw new ShaddockError(Status.BAD_REQUEST, "a JSON object body needs a JSON session", true, packet.route);
      }
      return {
        case: "request",
        value: create(RequestSchema, {
          id: BigInt(packet.id),
          route: packet.route,
          body: bodyBytes(packet.body),
          key: packet.key ?? "",
        }),
      };
  }
}
