/**
 * Typed routes: a route with its request and answer messages, or a push route with its
 * message. The client encodes and decodes them in the session's encoding (protobuf
 * bytes, or the proto3 JSON mapping on JSON sessions).
 */
import type { DescMessage } from "@bufbuild/protobuf";

/** A request route, its request message and its answer message. */
export interface Method<I extends DescMessage, O extends DescMessage> {
  readonly route: string;
  readonly input: I;
  readonly output: O;
}

/** A push route and the message its pushes carry. */
export interface PushRoute<M extends DescMessage> {
  readonly route: string;
  readonly schema: M;
}

export function method<I extends DescMessage, O extends DescMessage>(route: string, input: I, output: O): Method<I, O> {
  return { route, input, output };
}

export function pushRoute<M extends DescMessage>(route: string, schema: M): PushRoute<M> {
  return { route, schema };
}
