/**
 * Bodies as the wire carries them. A protobuf session carries bytes. A JSON session
 * carries a string (raw routes, the body's text) or a JSON object (a typed route's
 * message in the proto3 JSON mapping).
 */
import type { JsonObject } from "@bufbuild/protobuf";

export type { JsonObject, JsonValue } from "@bufbuild/protobuf";

/** A request or response body: bytes, text, or a typed body's JSON object. */
export type Body = Uint8Array | string | JsonObject;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The body's bytes: text as UTF-8, a JSON object as its JSON text. */
export function bodyBytes(body: Body): Uint8Array {
  if (body instanceof Uint8Array) return body;
  return encoder.encode(typeof body === "string" ? body : JSON.stringify(body));
}

/** The body as text: bytes decoded as UTF-8 (lossily), a JSON object as its JSON text. */
export function bodyText(body: Body): string {
  if (body instanceof Uint8Array) return decoder.decode(body);
  return typeof body === "string" ? body : JSON.stringify(body);
}

/** True for a typed JSON body (an object, not bytes or text). */
export function isJsonObject(body: Body): body is JsonObject {
  return typeof body === "object" && !(body instanceof Uint8Array);
}
