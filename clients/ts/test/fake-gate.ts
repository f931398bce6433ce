/**
 * A fake gate for what a real one never does: send bad frames, or never answer. It
 * acknowledges the handshake in the client's encoding, then runs the test's script.
 */
import { WebSocketServer, type WebSocket } from "ws";
import { create, toBinary } from "@bufbuild/protobuf";
import { PacketSchema } from "../src/gen/client_pb.js";

export interface FakeGate {
  readonly url: string;
  close(): Promise<void>;
}

/** What the fake does once the handshake is acknowledged; `json` tells the client's encoding. */
export type Script = (socket: WebSocket, json: boolean) => void;

export async function fakeGate(script: Script): Promise<FakeGate> {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise<void>((resolve) => server.once("listening", resolve));
  server.on("connection", (socket) => {
    socket.once("message", (_data, isBinary) => {
      const json = !isBinary;
      socket.send(json ? JSON.stringify({ handshake_ack: { code: 200, session_id: 1, heartbeat_ms: 10_000 } }) : ackFrame());
      script(socket, json);
    });
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    url: `ws://127.0.0.1:${port}/`,
    close: () =>
      new Promise((resolve) => {
        for (const client of server.clients) client.terminate();
        server.close(() => resolve());
      }),
  };
}

function ackFrame(): Uint8Array {
  return toBinary(PacketSchema, create(PacketSchema, {
    kind: { case: "handshakeAck", value: { code: 200, sessionId: 1n, heartbeatMs: 10_000 } },
  }));
}
