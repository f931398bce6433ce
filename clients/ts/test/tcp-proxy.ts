/**
 * A TCP proxy of the test's own between clients and a gate, to lose links the way a
 * network does, which neither end can be asked to: `cut()` resets every proxied
 * connection at once (no close frame either way) and holds the connections that come
 * next, accepted but not forwarded, until `release()`. So a test knows when a client is
 * redialling (`holding`), and acts while its session is detached at the gate.
 */
import { connect, createServer, type Socket } from "node:net";

export interface TcpProxy {
  /** The port clients connect to, on 127.0.0.1. */
  readonly port: number;
  /** Connections held since the last cut and still open. */
  readonly holding: number;
  /** Resets every forwarded connection, both sides, and holds new ones. */
  cut(): void;
  /** Forwards the held connections and every new one. */
  release(): void;
  /** Stops listening and resets every connection. */
  close(): Promise<void>;
}

/** Listens on 127.0.0.1, port 0, forwarding to `targetPort` there. */
export async function tcpProxy(targetPort: number): Promise<TcpProxy> {
  const live = new Set<Socket>();
  const held = new Set<Socket>();
  let holdingNew = false;

  const reset = (socket: Socket) => {
    live.delete(socket);
    held.delete(socket);
    if (!socket.destroyed) socket.resetAndDestroy();
  };

  const forward = (client: Socket) => {
    held.delete(client);
    if (client.destroyed) return;
    const upstream = connect(targetPort, "127.0.0.1");
    for (const socket of [client, upstream]) {
      live.add(socket);
      socket.on("error", () => {
        reset(client);
        reset(upstream);
      });
      socket.on("close", () => live.delete(socket));
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.resume();
  };

  const server = createServer({ pauseOnConnect: true }, (client) => {
    if (!holdingNew) return forward(client);
    held.add(client);
    client.on("error", () => reset(client));
    client.on("close", () => held.delete(client));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    port,
    get holding() {
      return held.size;
    },
    cut() {
      holdingNew = true;
      for (const socket of [...live]) reset(socket);
    },
    release() {
      holdingNew = false;
      for (const client of [...held]) forward(client);
    },
    close: () =>
      new Promise((resolve) => {
        for (const socket of [...live, ...held]) reset(socket);
        server.close(() => resolve());
      }),
  };
}
