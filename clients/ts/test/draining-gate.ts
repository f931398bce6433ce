/**
 * A fake gate that drains the way a real one does, for the client's side of a drain
 * before (and regardless of) the real gate's: `drain.me` sends a `drain` packet (the
 * body is its reason) and answers; from then on every request is answered at once
 * with 503 `gate draining`, except `hold.me`, which is held as if forwarded until
 * `release()` (then the session pushes `released` on `gate.note` and answers it).
 * With `holdEcho`, `echo.raw` requests made before the drain are held too, and refused
 * by the drain; without, they are echoed. Speaks protobuf and JSON.
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { WebSocketServer, type WebSocket } from "ws";
import { DRAINING_MESSAGE } from "../src/errors.js";
import { PacketSchema, type Packet } from "../src/gen/client_pb.js";

export interface DrainingGate {
  readonly url: string;
  /** What the sessions did, in order: `held 1`, `refused 1 echo.raw`, `closed 1`, ... */
  readonly events: string[];
  /** Answers the held `hold.me` requests, after a push. */
  release(): void;
  /** Kicks every session with `reason`, then closes with `code`. */
  kick(reason: string, code: number): void;
  close(): Promise<void>;
}

interface Held {
  id: bigint;
  route: string;
  body: string;
}

type Kind = MessageInitShape<typeof PacketSchema>["kind"];

export async function drainingGate(options: { firstSession: number; holdEcho: boolean }): Promise<DrainingGate> {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise<void>((resolve) => server.once("listening", resolve));
  const events: string[] = [];
  const sessions = new Set<{ release(): void; kick(reason: string, code: number): void }>();
  let next = options.firstSession;
  server.on("connection", (socket) => {
    const session = next++;
    let json = false;
    let draining = false;
    let held: Held[] = [];
    const send = (kind: Kind) => {
      const packet = create(PacketSchema, { kind });
      socket.send(json ? toJson(packet) : toBinary(PacketSchema, packet));
    };
    const respond = (id: bigint, code: number, body: string, message = "") =>
      send({ case: "response", value: { id, code, body: new TextEncoder().encode(body), message } });
    const refuse = (r: Held) => {
      respond(r.id, 503, "", DRAINING_MESSAGE);
      events.push(`refused ${session} ${r.route}`);
    };
    const control = {
      release() {
        const holding = held.filter((r) => r.route === "hold.me");
        if (holding.length === 0) return;
        held = held.filter((r) => r.route !== "hold.me");
        send({ case: "push", value: { route: "gate.note", body: new TextEncoder().encode("released") } });
        for (const r of holding) respond(r.id, 200, r.body);
      },
      kick(reason: string, code: number) {
        send({ case: "kick", value: { reason } });
        socket.close(code, reason);
      },
    };
    socket.once("message", (_data, isBinary) => {
      json = !isBinary;
      sessions.add(control);
      send({ case: "handshakeAck", value: { code: 200, sessionId: BigInt(session), heartbeatMs: 10_000 } });
      socket.on("message", (data, binary) => {
        const r = request(data as Buffer, binary);
        if (r === undefined) return;
        if (r.route === "hold.me" || (r.route === "echo.raw" && options.holdEcho && !draining)) {
          held.push(r);
          events.push(`held ${session} ${r.route}`);
        } else if (draining) {
          refuse(r);
        } else if (r.route === "drain.me") {
          send({ case: "drain", value: { reason: r.body, graceMs: 30_000 } });
          draining = true;
          respond(r.id, 200, r.body);
          for (const e of held.filter((h) => h.route === "echo.raw")) refuse(e);
          held = held.filter((h) => h.route !== "echo.raw");
        } else {
          respond(r.id, 200, r.body);
        }
      });
    });
    socket.on("close", () => {
      sessions.delete(control);
      events.push(`closed ${session}`);
    });
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    url: `ws://127.0.0.1:${port}/`,
    events,
    release: () => sessions.forEach((s) => s.release()),
    kick: (reason, code) => sessions.forEach((s) => s.kick(reason, code)),
    close: () =>
      new Promise((resolve) => {
        for (const client of server.clients) client.terminate();
        server.close(() => resolve());
      }),
  };
}

/** A request in either encoding (bodies are text here); undefined for anything else. */
function request(data: Buffer, binary: boolean): Held | undefined {
  if (!binary) {
    const packet = JSON.parse(data.toString()) as { request?: { id?: number; route: string; body?: string } };
    const r = packet.request;
    return r === undefined || !r.id ? undefined : { id: BigInt(r.id), route: r.route, body: r.body ?? "" };
  }
  const packet = fromBinary(PacketSchema, data);
  if (packet.kind.case !== "request" || packet.kind.value.id === 0n) return undefined;
  const { id, route, body } = packet.kind.value;
  return { id, route, body: new TextDecoder().decode(body) };
}

/** A packet in the JSON form the gate writes (string bodies, snake_case fields). */
function toJson({ kind }: Packet): string {
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  switch (kind.case) {
    case "handshakeAck":
      return JSON.stringify({ handshake_ack: { code: kind.value.code, session_id: Number(kind.value.sessionId), heartbeat_ms: kind.value.heartbeatMs } });
    case "response":
      return JSON.stringify({ response: { id: Number(kind.value.id), code: kind.value.code, body: text(kind.value.body), message: kind.value.message } });
    case "push":
      return JSON.stringify({ push: { route: kind.value.route, body: text(kind.value.body) } });
    case "kick":
      return JSON.stringify({ kick: { reason: kind.value.reason } });
    case "drain":
      return JSON.stringify({ drain: { reason: kind.value.reason, grace_ms: kind.value.graceMs } });
    default:
      throw new Error(`the fake does not send ${String(kind.case)}`);
  }
}
