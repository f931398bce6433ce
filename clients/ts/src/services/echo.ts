/**
 * The echo service's typed API: `echo.echo` (an EchoRequest answered by an EchoResponse
 * with the same body) and `echo.raw` (the body answered unchanged, never decoded).
 */
import { bodyBytes } from "../body.js";
import type { Client } from "../client.js";
import type { RequestOptions } from "../options.js";
import { EchoRequestSchema, EchoResponseSchema } from "../gen/echo_pb.js";
import { method } from "../typed.js";

export const echoRoutes = {
  echo: method("echo.echo", EchoRequestSchema, EchoResponseSchema),
  raw: "echo.raw",
} as const;

const encoder = new TextEncoder();

export class Echo {
  constructor(readonly client: Client) {}

  /** `echo.echo`: resolves with the bytes the service echoed (text is sent as UTF-8). */
  async echo(body: Uint8Array | string, options?: RequestOptions): Promise<Uint8Array> {
    const bytes = typeof body === "string" ? encoder.encode(body) : body;
    return (await this.client.call(echoRoutes.echo, { body: bytes }, options)).body;
  }

  /**
   * `echo.raw`: resolves with the body's bytes as they came back. JSON sessions carry
   * text, so there bytes must be UTF-8.
   */
  async raw(body: Uint8Array | string, options?: RequestOptions): Promise<Uint8Array> {
    return bodyBytes(await this.client.request(echoRoutes.raw, body, options));
  }
}

/** The echo API over `client`. */
export function echo(client: Client): Echo {
  return new Echo(client);
}
