/** Clients for tests: Node's WebSocket is the `ws` package's, and every client made is closed after. */
import { after, before } from "node:test";
import { WebSocket } from "ws";
import { chatRoutes, Client, ShaddockError, Status, type ClientOptions, type StateEvent } from "../src/index.js";
import { startGate, type Gate } from "./gate.js";
import { waitFor } from "./wait.js";

export type TestOptions = Omit<ClientOptions, "WebSocket">;

/** Clients opened by `open`, closed by `closeAll`. */
const opened = new Set<Client>();

/** Connects a client with `ws` as its WebSocket. */
export async function open(options: TestOptions): Promise<Client> {
  const client = await Client.connect({ WebSocket, ...options });
  opened.add(client);
  return client;
}

/** A client with `ws` as its WebSocket, not yet connected, recording its state events. */
export function recorded(options: TestOptions): { client: Client; events: StateEvent[] } {
  const client = new Client({ WebSocket, ...options });
  opened.add(client);
  const events: StateEvent[] = [];
  client.onState((event) => events.push(event));
  return { client, events };
}

/**
 * A real gate for the tests of a file (or a `describe` block): started before them, and
 * stopped after them with every client they opened. Read `url` inside the tests.
 */
export function gateForTests(options: Parameters<typeof startGate>[0] = {}): { readonly url: string } {
  let gate: Gate | undefined;
  before(async () => {
    gate = await startGate(options);
  });
  after(async () => {
    closeAll();
    await gate?.stop();
  });
  return {
    get url(): string {
      if (gate === undefined) throw new Error("the gate starts before the tests");
      return gate.url;
    },
  };
}

export function closeAll(): void {
  for (const client of opened) client.close();
  opened.clear();
}

/** Collects what `subscribe` delivers, to wait for and compare. */
export function collect<T>(subscribe: (listener: (item: T) => void) => unknown): T[] {
  const items: T[] = [];
  subscribe((item) => items.push(item));
  return items;
}

/** Waits until `items` holds at least `count` entries. */
export function waitForCount<T>(what: string, items: readonly T[], count: number, timeoutMs?: number): Promise<void> {
  return waitFor(`${count} ${what} (have ${items.length})`, () => items.length >= count, timeoutMs);
}

/** The rejection of `promise`, which must reject. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("expected a rejection, got a value");
}

const typedJsonProbes = new Map<string, Promise<string | false>>();

/**
 * Whether the gate at `url` transcodes typed JSON bodies: `false` when it does, or why
 * not (the skip reason for JSON-mode typed tests). Asked once per gate, at run time:
 * a gate without it answers a typed body with 400 "failed to decode", or closes the
 * session as an invalid packet. Any other failure is a real one and throws.
 */
export function typedJsonUnsupported(url: string): Promise<string | false> {
  let probe = typedJsonProbes.get(url);
  if (probe === undefined) {
    probe = (async () => {
      const client = new Client({ WebSocket, servers: url, encoding: "json", reconnect: false });
      client.connect();
      try {
        await client.ready(10_000);
        const members = await client.call(chatRoutes.members, { room: "probe" }, { timeoutMs: 10_000 });
        assertStrings(members.members);
        return false;
      } catch (error) {
        if (error instanceof ShaddockError && (
          (error.code === Status.BAD_REQUEST && /decode/i.test(error.reason)) ||
          (error.code === Status.UNAVAILABLE && /invalid packet/i.test(error.reason)))) {
          return `this gate does not transcode typed JSON bodies (${error.message})`;
        }
        throw error;
      } finally {
        client.close();
      }
    })();
    typedJsonProbes.set(url, probe);
  }
  return probe;
}

function assertStrings(values: unknown): void {
  if (!Array.isArray(values) || values.some((v) => typeof v !== "string")) {
    throw new Error(`chat.members answered ${JSON.stringify(values)}`);
  }
}
