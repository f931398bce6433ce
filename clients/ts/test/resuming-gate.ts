/**
 * A fake gate that keeps sessions for resuming the way docs/protocol.md ("Resume") says
 * a gate does, for the client's side of a resume whatever the real gate does: every push
 * and response of a session carries `seq`; what is not acknowledged is kept; a link cut
 * without a close frame detaches its session, which goes on counting what is meant for
 * it; a handshake with its resume token takes it up again and replays what was sent
 * after the last ack (so, on purpose, some frames the client has already handled: it
 * must drop them); a request id sent again is answered once (its answer again, with the
 * same `seq`, if it was answered). Speaks protobuf and JSON.
 *
 * Routes: `echo.raw` answers with its body; `hold.me` is held, as if forwarded to a
 * worker, until `release(body)`.
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { WebSocketServer, type WebSocket } from "ws";
import { PacketSchema } from "../src/gen/client_pb.js";

/** What a client sent, as the fake read it. */
export type Sent =
  | { kind: "handshake"; resumable: boolean; resumeToken: string; lastSeq: number }
  | { kind: "request"; id: number; route: string; body: string; key: string }
  | { kind: "ack"; seq: number }
  | { kind: "heartbeat" }
  | { kind: "other" };

export interface Received {
  /** The link (WebSocket connection) it came on, from 1. */
  link: number;
  /** The session it reached; 0 for a handshake, before its session is known. */
  session: number;
  packet: Sent;
}

export interface PushOptions {
  /** Cut every link once this many of the pushes are sent; the rest are sent while detached. */
  cutAfter?: number;
  /** With `cutAfter`: of the pushes before the cut, this many are counted as sent but never written (lost in flight). */
  lose?: number;
}

export interface ResumingGate {
  readonly url: string;
  /** Everything the clients sent, in order. */
  readonly received: Received[];
  /** The sessions' handshake acks, in order: `[session, resume_code]`. */
  readonly acks: [number, number][];
  /** Links the client closed or lost, in order: `[link, close code]` (1000: a close frame, which ends the session). */
  readonly closes: [number, number][];
  /** Pushes `count` frames on `route` (bodies "1", "2", ...) to every live session, attached or not. */
  push(route: string, count: number, options?: PushOptions): void;
  /** Drops every link abruptly (no close frame): their sessions detach. */
  cut(): void;
  /** The links there are now go silent (nothing written, heartbeats unanswered), as a stalled network. */
  mute(): void;
  /** Answers the held `hold.me` requests whose body is `body`. */
  release(body: string): void;
  /** From now on a resume is refused with `code` (the sessions are forgotten). */
  refuseResumes(code: number): void;
  /** Kicks every attached session with `reason` and closes with `code`: the sessions end. */
  kick(reason: string, code: number): void;
  close(): Promise<void>;
}

type Outgoing =
  | { kind: "handshakeAck"; sessionId: number; heartbeatMs: number; resumeToken: string; resumeCode: number; lastSeq: number }
  | { kind: "response"; id: number; code: number; body: string; seq: number }
  | { kind: "push"; route: string; body: string; seq: number }
  | { kind: "kick"; reason: string }
  | { kind: "heartbeat" };

interface Link {
  readonly n: number;
  readonly socket: WebSocket;
  json: boolean;
  muted: boolean;
}

interface Session {
  readonly id: number;
  token: string;
  /** The highest `seq` given. */
  seq: number;
  /** The highest `seq` the client acknowledged. */
  acked: number;
  /** What was sent and not yet acknowledged, oldest first. */
  kept: Outgoing[];
  /** Answers by request id, for ids sent again. */
  readonly answered: Map<number, Outgoing>;
  /** Requests held as if forwarded. */
  readonly held: Map<number, { route: string; body: string }>;
  link: Link | undefined;
  /** Frames to count as sent but not write (lost in flight). */
  losing: number;
}

export async function resumingGate(options: { heartbeatMs?: number } = {}): Promise<ResumingGate> {
  const heartbeatMs = options.heartbeatMs ?? 10_000;
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise<void>((resolve) => server.once("listening", resolve));
  const received: Received[] = [];
  const acks: [number, number][] = [];
  const closes: [number, number][] = [];
  const sessions = new Map<number, Session>();
  let links = 0;
  let nextSession = 1;
  let refuse = 0;

  const write = (link: Link, packet: Outgoing) => {
    if (!link.muted) link.socket.send(link.json ? toJson(packet) : toProtobuf(packet));
  };

  /** A push or response: numbered, kept until acknowledged, written if the session has a link. */
  const emit = (session: Session, packet: Outgoing) => {
    if (packet.kind !== "response" && packet.kind !== "push") throw new Error(`${packet.kind} has no seq`);
    const numbered = { ...packet, seq: ++session.seq };
    session.kept.push(numbered);
    if (numbered.kind === "response") session.answered.set(numbered.id, numbered);
    if (session.losing > 0) session.losing--;
    else if (session.link !== undefined) write(session.link, numbered);
  };

  const detach = (session: Session) => {
    session.link?.socket.terminate();
    session.link = undefined;
  };

  const cut = () => {
    for (const session of sessions.values()) {
      session.losing = 0;
      detach(session);
    }
  };

  const handshake = (link: Link, hello: Extract<Sent, { kind: "handshake" }>): Session => {
    const old = hello.resumeToken === "" ? undefined : [...sessions.values()].find((s) => s.token === hello.resumeToken);
    const resumed = old !== undefined && refuse === 0 ? old : undefined;
    const session: Session = resumed ?? {
      id: nextSession++,
      token: "",
      seq: 0,
      acked: 0,
      kept: [],
      answered: new Map(),
      held: new Map(),
      link: undefined,
      losing: 0,
    };
    if (resumed !== undefined) detach(resumed);
    sessions.set(session.id, session);
    session.link = link;
    session.token = hello.resumable ? `token-${session.id}-${link.n}` : "";
    const resumeCode = hello.resumeToken === "" ? 0 : resumed !== undefined ? 200 : refuse || 404;
    acks.push([session.id, resumeCode]);
    write(link, {
      kind: "handshakeAck",
      sessionId: link.n,
      heartbeatMs,
      resumeToken: session.token,
      resumeCode,
      lastSeq: resumed !== undefined ? session.seq : 0,
    });
    // The replay: everything after the last ack, some of which the client has handled.
    if (resumed !== undefined) for (const frame of session.kept) write(link, frame);
    return session;
  };

  const onPacket = (session: Session, link: Link, packet: Sent) => {
    switch (packet.kind) {
      case "ack":
        session.acked = Math.max(session.acked, packet.seq);
        session.kept = session.kept.filter((frame) => "seq" in frame && frame.seq > session.acked);
        return;
      case "heartbeat":
        return write(link, { kind: "heartbeat" });
      case "request": {
        if (packet.id === 0) return;
        const answer = session.answered.get(packet.id);
        // Answered already: the same answer, with its seq. In flight: answered when it comes.
        if (answer !== undefined) return write(link, answer);
        if (session.held.has(packet.id)) return;
        if (packet.route === "hold.me") {
          session.held.set(packet.id, { route: packet.route, body: packet.body });
          return;
        }
        return emit(session, { kind: "response", id: packet.id, code: 200, body: packet.body, seq: 0 });
      }
      default:
        return;
    }
  };

  server.on("connection", (socket) => {
    const link: Link = { n: ++links, socket, json: false, muted: false };
    let session: Session | undefined;
    socket.on("message", (data: Buffer, isBinary: boolean) => {
      link.json = !isBinary;
      const packet = read(data, isBinary);
      received.push({ link: link.n, session: session?.id ?? 0, packet });
      if (session === undefined) {
        if (packet.kind === "handshake") session = handshake(link, packet);
        return;
      }
      if (session.link === link) onPacket(session, link, packet);
    });
    socket.on("close", (code) => {
      closes.push([link.n, code]);
      if (session === undefined || session.link !== link) return;
      session.link = undefined;
      // A close frame from the client ends its session; a lost link detaches it.
      if (code === 1000) sessions.delete(session.id);
    });
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    url: `ws://127.0.0.1:${port}/`,
    received,
    acks,
    closes,
    push(route, count, { cutAfter, lose = 0 } = {}) {
      for (let i = 1; i <= count; i++) {
        if (cutAfter !== undefined && i === cutAfter - lose + 1) for (const s of sessions.values()) s.losing = lose;
        for (const s of sessions.values()) emit(s, { kind: "push", route, body: String(i), seq: 0 });
        if (i === cutAfter) cut();
      }
    },
    cut,
    mute() {
      for (const session of sessions.values()) if (session.link !== undefined) session.link.muted = true;
    },
    release(body) {
      for (const session of sessions.values()) {
        for (const [id, held] of session.held) {
          if (held.body !== body) continue;
          session.held.delete(id);
          emit(session, { kind: "response", id, code: 200, body, seq: 0 });
        }
      }
    },
    refuseResumes(code) {
      refuse = code;
      sessions.clear();
    },
    kick(reason, code) {
      for (const session of sessions.values()) {
        const link = session.link;
        if (link === undefined) continue;
        sessions.delete(session.id);
        write(link, { kind: "kick", reason });
        link.socket.close(code, reason);
      }
    },
    close: () =>
      new Promise((resolve) => {
        for (const client of server.clients) client.terminate();
        server.close(() => resolve());
      }),
  };
}

/** A client's packet in either encoding (bodies are text here). */
function read(data: Buffer, binary: boolean): Sent {
  if (!binary) {
    const packet = JSON.parse(data.toString()) as Record<string, Record<string, unknown> | undefined>;
    const [kind, f = {}] = Object.entries(packet)[0] ?? ["other", {}];
    const num = (v: unknown) => (typeof v === "number" ? v : Number(v ?? 0));
    const str = (v: unknown) => (typeof v === "string" ? v : "");
    switch (kind) {
      case "handshake":
        return { kind, resumable: f["resumable"] === true, resumeToken: str(f["resume_token"]), lastSeq: num(f["last_seq"]) };
      case "request":
        return { kind, id: num(f["id"]), route: str(f["route"]), body: str(f["body"]), key: str(f["key"]) };
      case "ack":
        return { kind, seq: num(f["seq"]) };
      case "heartbeat":
        return { kind };
      default:
        return { kind: "other" };
    }
  }
  const { kind } = fromBinary(PacketSchema, data);
  switch (kind.case) {
    case "handshake":
      return { kind: "handshake", resumable: kind.value.resumable, resumeToken: kind.value.resumeToken, lastSeq: Number(kind.value.lastSeq) };
    case "request": {
      const { id, route, body, key } = kind.value;
      return { kind: "request", id: Number(id), route, body: new TextDecoder().decode(body), key };
    }
    case "ack":
      return { kind: "ack", seq: Number(kind.value.seq) };
    case "heartbeat":
      return { kind: "heartbeat" };
    default:
      return { kind: "other" };
  }
}

type Kind = MessageInitShape<typeof PacketSchema>["kind"];

function toProtobuf(packet: Outgoing): Uint8Array {
  const bytes = (text: string) => new TextEncoder().encode(text);
  let kind: Kind;
  switch (packet.kind) {
    case "handshakeAck":
      kind = {
        case: "handshakeAck",
        value: {
          code: 200,
          sessionId: BigInt(packet.sessionId),
          heartbeatMs: packet.heartbeatMs,
          resumeToken: packet.resumeToken,
          resumeCode: packet.resumeCode,
          lastSeq: BigInt(packet.lastSeq),
        },
      };
      break;
    case "response":
      kind = { case: "response", value: { id: BigInt(packet.id), code: packet.code, body: bytes(packet.body), seq: BigInt(packet.seq) } };
      break;
    case "push":
      kind = { case: "push", value: { route: packet.route, body: bytes(packet.body), seq: BigInt(packet.seq) } };
      break;
    case "kick":
      kind = { case: "kick", value: { reason: packet.reason } };
      break;
    case "heartbeat":
      kind = { case: "heartbeat", value: {} };
      break;
  }
  return toBinary(PacketSchema, create(PacketSchema, { kind }));
}

/** A packet in the JSON form the gate writes (snake_case, fields at their default left out). */
function toJson(packet: Outgoing): string {
  switch (packet.kind) {
    case "handshakeAck": {
      const { sessionId, heartbeatMs, resumeToken, resumeCode, lastSeq } = packet;
      return JSON.stringify({
        handshake_ack: {
          code: 200,
          session_id: sessionId,
          heartbeat_ms: heartbeatMs,
          message: "",
          ...(resumeToken !== "" && { resume_token: resumeToken }),
          ...(resumeCode !== 0 && { resume_code: resumeCode }),
          ...(lastSeq !== 0 && { last_seq: lastSeq }),
        },
      });
    }
    case "response":
      return JSON.stringify({ response: { id: packet.id, code: packet.code, body: packet.body, message: "", seq: packet.seq } });
    case "push":
      return JSON.stringify({ push: { route: packet.route, body: packet.body, seq: packet.seq } });
    case "kick":
      return JSON.stringify({ kick: { reason: packet.reason } });
    case "heartbeat":
      return JSON.stringify({ heartbeat: {} });
  }
}
