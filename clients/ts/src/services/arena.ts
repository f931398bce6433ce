/**
 * The arena service's typed API: the reference keyed service (routes and messages in
 * proto/proto/arena.proto; docs/protocol.md, "Keyed services"). A match lives in one
 * worker: `join` goes there by its key (the match), and binds the session to the match,
 * so `input` and `leave` need no key. The session must have a uid first
 * (`chat(client).login(name)`, or a signed token). Positions are int64: `bigint`s.
 */
import type { Client } from "../client.js";
import type { RequestOptions } from "../options.js";
import {
  InputRequestSchema,
  InputResponseSchema,
  JoinRequestSchema,
  JoinResponseSchema,
  LeaveRequestSchema,
  LeaveResponseSchema,
  StateSchema,
  type InputResponse,
  type JoinResponse,
  type State,
} from "../gen/arena_pb.js";
import { method, pushRoute } from "../typed.js";

/** Arena's request routes with their messages. */
export const arenaRoutes = {
  join: method("arena.join", JoinRequestSchema, JoinResponseSchema),
  input: method("arena.input", InputRequestSchema, InputResponseSchema),
  leave: method("arena.leave", LeaveRequestSchema, LeaveResponseSchema),
} as const;

/** Arena's push routes with their messages. */
export const arenaPushes = {
  state: pushRoute("arena.state", StateSchema),
} as const;

export class Arena {
  constructor(readonly client: Client) {}

  /**
   * Joins `match` (1 to 48 of [a-z0-9_-]), sent with the match as its key; resolves with
   * the match's tick and where this player is ((0, 0) when new to it). The session then
   * gets the match's `arena.state` pushes.
   */
  join(match: string, options?: Omit<RequestOptions, "key">): Promise<JoinResponse> {
    return this.client.call(arenaRoutes.join, { match }, { ...options, key: match });
  }

  /** Moves this player by (dx, dy) in its match; resolves with its new position (404 when the match was lost: join again). */
  input(dx: number, dy: number, options?: RequestOptions): Promise<InputResponse> {
    return this.client.call(arenaRoutes.input, { dx, dy }, options);
  }

  /** Leaves the session's match (and its pushes). */
  async leave(options?: RequestOptions): Promise<void> {
    await this.client.call(arenaRoutes.leave, {}, options);
  }

  /** The state of this player's match, every tick (20 Hz): its tick and every player's position. */
  onState(listener: (state: State) => void): () => void {
    return this.client.onPush(arenaPushes.state, listener);
  }
}

/** The arena API over `client`. */
export function arena(client: Client): Arena {
  return new Arena(client);
}
