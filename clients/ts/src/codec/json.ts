/**
 * Text frames: each frame is one packet as JSON, an object with one key naming its kind
 * (`{"request":{"id":1,"route":"echo.raw","body":"hi"}}`, plus `"key":"m1"` for a keyed
 * service's route), fields in snake_case as the gate writes them. A body is a string (a
 * raw route's text) or an object (a typed route's message in the proto3 JSON mapping,
 * which the gate transcodes).
 */
import { create, fromJson, toJson } from "@bufbuild/protobuf";
import type { DescMessage, JsonObject, JsonValue, MessageShape } from "@bufbuild/protobuf";
import { isJsonObject, type Body } from "../body.js";
import { ProtocolError, ShaddockError } from "../errors.js";
import { Status } from "../gen/status_pb.js";
import { CLIENT_ONLY_KINDS, describe, type Codec, type Frame, type Inbound, type Outbound, type Timing } from "./codec.js";

/** Rejects bytes that are not UTF-8: a JSON session carries text, never a lossy copy. */
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

export const jsonCodec: Codec = {
  encoding: "json",

  encode(packet: Outbound): Frame {
    switch (packet.kind) {
      case "handshake":
        return JSON.stringify({
          handshake: {
            token: packet.token,
            server_timing: packet.serverTiming,
            client: packet.client,
            serial: packet.serial,
            // Left out when unset, as the gate and the Rust SDK write them.
            ...(packet.resumable && { resumable: true }),
            ...(packet.resumeToken !== "" && { resume_token: packet.resumeToken }),
            ...(packet.lastSeq !== 0 && { last_seq: packet.lastSeq }),
          },
        });
      case "ack":
        return JSON.stringify({ ack: { seq: packet.seq } });
      case "heartbeat":
        return JSON.stringify({ heartbeat: {} });
      case "refresh":
        return JSON.stringify({ refresh: { token: packet.token } });
      case "request":
        return JSON.stringify({
          request: {
            id: packet.id,
            route: packet.route,
            body: requestBody(packet.body, packet.route),
            // Left out when empty, as the Rust SDK writes it.
            ...(packet.key ? { key: packet.key } : {}),
          },
        });
    }
  },

  decode(frame: Frame): Inbound {
    if (typeof frame !== "string") {
      throw new ProtocolError("a binary frame on a JSON session");
    }
    let value: unknown;
    try {
      value = JSON.parse(frame);
    } catch (error) {
      throw new ProtocolError(`invalid packet: ${describe(error)}`);
    }
    const packet = object(value, "packet");
    const keys = Object.keys(packet);
    if (keys.length !== 1) {
      throw new ProtocolError(`invalid packet: ${keys.length} kinds in one packet`);
    }
    const kind = keys[0]!;
    const fields = object(packet[kind], kind);
    switch (kind) {
      case "handshake_ack":
        return {
          kind: "handshakeAck",
          code: uint(fields, "code"),
          sessionId: BigInt(uint(fields, "session_id")),
          heartbeatMs: uint(fields, "heartbeat_ms"),
          message: string(fields, "message"),
          resumeToken: string(fields, "resume_token"),
          resumeCode: uint(fields, "resume_code"),
          lastSeq: uint(fields, "last_seq"),
        };
      case "heartbeat":
        return { kind: "heartbeat" };
      case "response": {
        const timing = fields["timing"];
        return {
          kind: "response",
          id: uint(fields, "id"),
          code: uint(fields, "code"),
          body: body(fields),
          message: string(fields, "message"),
          seq: uint(fields, "seq"),
          ...(timing !== undefined && timing !== null && { timing: timingOf(object(timing, "timing")) }),
        };
      }
      case "push":
        return { kind: "push", route: string(fields, "route"), body: body(fields), seq: uint(fields, "seq") };
      case "kick":
        return { kind: "kick", reason: string(fields, "reason") };
      case "refresh_ack":
        return { kind: "refreshAck", code: uint(fields, "code"), message: string(fields, "message") };
      case "drain":
        return { kind: "drain", reason: string(fields, "reason"), graceMs: uint(fields, "grace_ms") };
      default:
        if (CLIENT_ONLY_KINDS.includes(kind)) {
          throw new ProtocolError(`packet not for a client: ${kind}`);
        }
        throw new ProtocolError(`unknown packet kind: ${kind.slice(0, 64)}`);
    }
  },

  encodeMessage<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>): Body {
    const json = toJson(schema, message);
    if (!isObject(json)) {
      // Only well-known wrapper types map to non-objects; no route uses them as bodies.
      throw new ShaddockError(Status.BAD_REQUEST, `${schema.typeName} has no JSON object form`, true);
    }
    return json;
  },

  decodeMessage<Desc extends DescMessage>(schema: Desc, body: Body): MessageShape<Desc> {
    if (body === "") return create(schema);
    if (!isJsonObject(body)) {
      throw new ProtocolError(`a body that is not a ${schema.typeName} in JSON: not an object`);
    }
    try {
      return fromJson(schema, body, { ignoreUnknownFields: true });
    } catch (error) {
      throw new ProtocolError(`a body that is not a ${schema.typeName} in JSON: ${describe(error)}`);
    }
  },
};

function requestBody(body: Body, route: string): JsonValue {
  if (!(body instanceof Uint8Array)) return body;
  try {
    return strictUtf8.decode(body);
  } catch {
    throw new ShaddockError(Status.BAD_REQUEST, "a JSON session carries text bodies; these bytes are not UTF-8", true, route);
  }
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function object(value: unknown, what: string): JsonObject {
  if (!isObject(value)) throw new ProtocolError(`invalid packet: ${what} is not an object`);
  return value;
}

/** A field by the gate's snake_case name, or its camelCase form (proto3 JSON parsers take both). */
function field(fields: JsonObject, name: string): JsonValue | undefined {
  const value = fields[name] ?? fields[name.replace(/_(.)/g, (_, c: string) => c.toUpperCase())];
  return value === null ? undefined : value;
}

function uint(fields: JsonObject, name: string): number {
  const value = field(fields, name) ?? 0;
  const n = typeof value === "string" && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
    throw new ProtocolError(`invalid packet: ${name} is not an unsigned integer`);
  }
  return n;
}

function string(fields: JsonObject, name: string): string {
  const value = field(fields, name) ?? "";
  if (typeof value !== "string") throw new ProtocolError(`invalid packet: ${name} is not a string`);
  return value;
}

function body(fields: JsonObject): Body {
  const value = field(fields, "body") ?? "";
  if (typeof value === "string" || isObject(value)) return value;
  throw new ProtocolError("invalid packet: body is neither a string nor an object");
}

function timingOf(fields: JsonObject): Timing {
  return {
    totalUs: uint(fields, "total_us"),
    queueUs: uint(fields, "queue_us"),
    handlerUs: uint(fields, "handler_us"),
  };
}
