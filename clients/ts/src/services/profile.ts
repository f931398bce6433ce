/**
 * The profile service's typed API (routes and messages in proto/proto/profile.proto;
 * docs/chat.md, "Profiles"): each player's display name and colour, kept by the one
 * worker that owns the player's partition (a keyed service, keyed by uid). `chat.login`
 * gives a session its profile; `set` changes it for the player's next login.
 */
import type { Client } from "../client.js";
import type { RequestOptions } from "../options.js";
import { GetRequestSchema, ProfileSchema, SetRequestSchema, type Profile } from "../gen/profile_pb.js";
import { method } from "../typed.js";

/** Profile's request routes with their messages. */
export const profileRoutes = {
  get: method("profile.get", GetRequestSchema, ProfileSchema),
  set: method("profile.set", SetRequestSchema, ProfileSchema),
} as const;

export class ProfileApi {
  constructor(readonly client: Client) {}

  /** The profile of player `uid` (sent with it as the request's key), or of this session's player when omitted (its uid routes it; 400 before a login). */
  get(uid?: string, options?: Omit<RequestOptions, "key">): Promise<Profile> {
    return this.client.call(profileRoutes.get, {}, uid === undefined ? options : { ...options, key: uid });
  }

  /** Sets this player's display name (at most 32 bytes) and/or colour (`#rrggbb`, lowercase); an empty or absent one keeps its value. Resolves with the profile as set. */
  set(change: { display?: string; color?: string }, options?: Omit<RequestOptions, "key">): Promise<Profile> {
    return this.client.call(profileRoutes.set, change, options);
  }
}

/** The profile API over `client`. */
export function profile(client: Client): ProfileApi {
  return new ProfileApi(client);
}
