/**
 * The echo service, as the Rust and Go workers serve it: `echo.echo` answers an
 * `EchoRequest` with an `EchoResponse` holding the same body; `echo.raw` answers the
 * body's bytes unchanged.
 */
import { EchoRequestSchema, EchoResponseSchema } from "../gen/echo_pb.js";
import { Service } from "../service.js";

/** The echo service's name: its subject token and queue group. */
export const ECHO = "echo";

/** The echo service. */
export function echoService(): Service {
  return new Service(ECHO)
    .method("echo", EchoRequestSchema, EchoResponseSchema, (_ctx, request) => ({ body: request.body }))
    .rawMethod("raw", (_ctx, body) => body);
}
