/**
 * The chat service's typed API (routes and messages in proto/proto/chat.proto, behaviour
 * in docs/chat.md). Open chat sessions with `serial: true`, so that a join is handled
 * before the say behind it and a sender's lines keep their order.
 */
import type { Client } from "../client.js";
import type { RequestOptions } from "../options.js";
import {
  ChatMessageSchema,
  JoinRequestSchema,
  JoinResponseSchema,
  LeaveRequestSchema,
  LeaveResponseSchema,
  LoginRequestSchema,
  LoginResponseSchema,
  MemberEventSchema,
  MembersRequestSchema,
  MembersResponseSchema,
  SayRequestSchema,
  SayResponseSchema,
  WhisperRequestSchema,
  WhisperResponseSchema,
  type ChatMessage,
  type JoinResponse,
  type MemberEvent,
} from "../gen/chat_pb.js";
import { method, pushRoute } from "../typed.js";

/** Chat's request routes with their messages. */
export const chatRoutes = {
  login: method("chat.login", LoginRequestSchema, LoginResponseSchema),
  join: method("chat.join", JoinRequestSchema, JoinResponseSchema),
  leave: method("chat.leave", LeaveRequestSchema, LeaveResponseSchema),
  say: method("chat.say", SayRequestSchema, SayResponseSchema),
  whisper: method("chat.whisper", WhisperRequestSchema, WhisperResponseSchema),
  members: method("chat.members", MembersRequestSchema, MembersResponseSchema),
} as const;

/** Chat's push routes with their messages. */
export const chatPushes = {
  message: pushRoute("chat.message", ChatMessageSchema),
  whisper: pushRoute("chat.whisper", ChatMessageSchema),
  joined: pushRoute("chat.joined", MemberEventSchema),
  left: pushRoute("chat.left", MemberEventSchema),
} as const;

export class Chat {
  constructor(readonly client: Client) {}

  /** Binds this session to `name` (one session per name: an older one is kicked); resolves with the name. */
  async login(name: string, options?: RequestOptions): Promise<string> {
    return (await this.client.call(chatRoutes.login, { name }, options)).name;
  }

  /** Enters `room`; resolves with its members, this player included. */
  join(room: string, options?: RequestOptions): Promise<JoinResponse> {
    return this.client.call(chatRoutes.join, { room }, options);
  }

  /** Leaves `room` (a no-op when not in it). */
  async leave(room: string, options?: RequestOptions): Promise<void> {
    await this.client.call(chatRoutes.leave, { room }, options);
  }

  /** Says `text` to everyone in `room` (403 when not in it). */
  async say(room: string, text: string, options?: RequestOptions): Promise<void> {
    await this.client.call(chatRoutes.say, { room, text }, options);
  }

  /** Whispers `text` to the player named `to`, on whichever gate it is. */
  async whisper(to: string, text: string, options?: RequestOptions): Promise<void> {
    await this.client.call(chatRoutes.whisper, { to, text }, options);
  }

  /** The names in `room`, sorted. */
  async members(room: string, options?: RequestOptions): Promise<string[]> {
    return (await this.client.call(chatRoutes.members, { room }, options)).members;
  }

  /** Room messages (this player's own included). */
  onMessage(listener: (message: ChatMessage) => void): () => void {
    return this.client.onPush(chatPushes.message, listener);
  }

  /** Whispers to this player (`room` is empty). */
  onWhisper(listener: (message: ChatMessage) => void): () => void {
    return this.client.onPush(chatPushes.whisper, listener);
  }

  /** Someone entered a room this player is in. */
  onJoined(listener: (event: MemberEvent) => void): () => void {
    return this.client.onPush(chatPushes.joined, listener);
  }

  /** Someone left a room this player is in (`reason`: "left" or "disconnected"). */
  onLeft(listener: (event: MemberEvent) => void): () => void {
    return this.client.onPush(chatPushes.left, listener);
  }
}

/** The chat API over `client`. */
export function chat(client: Client): Chat {
  return new Chat(client);
}
