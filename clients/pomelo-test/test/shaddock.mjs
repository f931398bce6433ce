// Starts the real `shaddock up` (embedded broker, gate, echo and chat workers) on free
// ports, and a pomelo client built on the npm pomelo-protocol codec over ws, written
// the way pomelo's own JS client uses it (handshake, ack, heartbeats, dictionary).

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import protocol from 'pomelo-protocol';
import WebSocket from 'ws';

const { Package, Message } = protocol;
const here = path.dirname(fileURLToPath(import.meta.url));

/** How long any one wait may take before the test fails. */
export const DEADLINE_MS = 10_000;

/** Resolves `promise`, or rejects after `ms` naming `what`. */
export function within(promise, what, ms = DEADLINE_MS) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * `shaddock up` with every port 0 and `args` added; resolves once it is ready, with
 * the gate's ws:// URL and `stop()`, which kills exactly this child.
 */
export async function startShaddock(args = []) {
  const bin = process.env.SHADDOCK_BIN ?? path.resolve(here, '../../../target/debug/shaddock');
  const child = spawn(
    bin,
    // Profiles in memory: a test writes no data directory into the source tree.
    ['up', '--broker-port', '0', '--monitor-port', '0', '--gate-port', '0', '--metrics-port', '0', '--store', 'memory', ...args],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, NO_COLOR: '1' } },
  );
  let log = '';
  const ready = new Promise((resolve, reject) => {
    let gate = null;
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      // eslint-disable-next-line no-control-regex
      log += chunk.replace(/\x1b\[[0-9;]*m/g, '');
      const listening = /Gate listening for WebSocket clients on (\S+)/.exec(log);
      if (listening) gate = listening[1];
      if (gate && log.includes('Server is ready')) resolve(`ws://${gate}`);
    });
    child.once('exit', (code) => reject(new Error(`shaddock exited with ${code}:\n${log}`)));
    child.once('error', reject);
  });
  const url = await within(ready, 'shaddock up to be ready');
  return {
    url,
    async stop() {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        await once(child, 'exit');
      }
    },
  };
}

/** A pomelo client: pomelo-protocol packages over one WebSocket. */
export class PomeloClient {
  /**
   * Connects and shakes hands; `heartbeats: false` never answers the gate's
   * heartbeats (a client that went silent).
   */
  static async connect(url, { user = {}, heartbeats = true } = {}) {
    const client = new PomeloClient(new WebSocket(url), heartbeats);
    await within(once(client.ws, 'open'), 'the WebSocket to open');
    const hello = { sys: { type: 'js-websocket', version: '0.0.1', rsa: {} }, user };
    client.ws.send(Package.encode(Package.TYPE_HANDSHAKE, protocol.strencode(JSON.stringify(hello))));
    client.answer = await within(client.handshaken, 'the handshake answer');
    return client;
  }

  constructor(ws, heartbeats) {
    this.ws = ws;
    this.heartbeats = heartbeats;
    this.reqId = 0;
    this.dict = {};
    this.abbrs = {};
    this.callbacks = new Map();
    this.pushes = [];
    this.pushWaiters = [];
    this.kicks = [];
    this.heartbeatsSeen = 0;
    this.timers = new Set();
    this.closed = new Promise((resolve) => {
      ws.on('close', (code, reason) => {
        for (const timer of this.timers) clearTimeout(timer);
        resolve({ code, reason: reason.toString() });
      });
    });
    this.handshaken = new Promise((resolve, reject) => {
      this.onHandshake = resolve;
      ws.once('close', () => reject(new Error('closed before the handshake answer')));
    });
    ws.on('message', (data) => this.onData(data));
  }

  onData(data) {
    const decoded = Package.decode(data);
    for (const pkg of Array.isArray(decoded) ? decoded : [decoded]) {
      const json = () => JSON.parse(protocol.strdecode(pkg.body));
      switch (pkg.type) {
        case Package.TYPE_HANDSHAKE: {
          const body = json();
          if (body.code === 200) {
            this.dict = body.sys.dict ?? {};
            for (const [route, code] of Object.entries(this.dict)) this.abbrs[code] = route;
            this.heartbeatMs = body.sys.heartbeat * 1000;
            this.ws.send(Package.encode(Package.TYPE_HANDSHAKE_ACK));
          }
          this.onHandshake(body);
          break;
        }
        case Package.TYPE_HEARTBEAT:
          this.heartbeatsSeen += 1;
          if (this.heartbeats) {
            // As pomelo's client: beat back one interval after the gate's beat.
            const timer = setTimeout(() => {
              this.timers.delete(timer);
              if (this.ws.readyState === WebSocket.OPEN) {
                this.ws.send(Package.encode(Package.TYPE_HEARTBEAT));
              }
            }, this.heartbeatMs);
            this.timers.add(timer);
          }
          break;
        case Package.TYPE_DATA:
          this.onMessage(Message.decode(pkg.body));
          break;
        case Package.TYPE_KICK:
          this.kicks.push(json());
          break;
        default:
          throw new Error(`unexpected package type ${pkg.type}`);
      }
    }
  }

  onMessage(msg) {
    const body = JSON.parse(protocol.strdecode(msg.body));
    if (msg.type === Message.TYPE_RESPONSE) {
      const callback = this.callbacks.get(msg.id);
      this.callbacks.delete(msg.id);
      // pomelo-protocol ignores pitaya's error bit: errors are told by the body's code.
      callback?.(body);
      return;
    }
    const route = msg.compressRoute ? this.abbrs[msg.route] : msg.route;
    const push = { route, body, compressed: Boolean(msg.compressRoute) };
    const waiter = this.pushWaiters.shift();
    if (waiter) waiter(push);
    else this.pushes.push(push);
  }

  /** The message bytes of `route`: by dictionary code unless `compress` is false. */
  encode(id, type, route, body, compress = true) {
    const code = compress ? this.dict[route] : undefined;
    const bytes = protocol.strencode(JSON.stringify(body));
    const message = code
      ? Message.encode(id, type, 1, code, bytes)
      : Message.encode(id, type, 0, route, bytes);
    return Package.encode(Package.TYPE_DATA, message);
  }

  request(route, body, { compress = true } = {}) {
    const id = ++this.reqId;
    const answered = new Promise((resolve) => this.callbacks.set(id, resolve));
    this.ws.send(this.encode(id, Message.TYPE_REQUEST, route, body, compress));
    return within(answered, `the answer to ${route}`);
  }

  notify(route, body, { compress = true } = {}) {
    this.ws.send(this.encode(0, Message.TYPE_NOTIFY, route, body, compress));
  }

  /** The next push. */
  push() {
    const ready = this.pushes.shift();
    if (ready) return Promise.resolve(ready);
    return within(new Promise((resolve) => this.pushWaiters.push(resolve)), 'a push');
  }

  close() {
    this.ws.close();
    return within(this.closed, 'the close');
  }
}

/** Connects until the gate's dictionary has `route` (workers announce on their own time). */
export async function connectKnowing(url, route, options) {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const client = await PomeloClient.connect(url, options);
    if (client.dict[route] !== undefined) return client;
    await client.close();
    if (Date.now() > deadline) throw new Error(`the gate never announced ${route}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** A client of Shaddock's own protocol, as JSON text frames. */
export class JsonClient {
  static async connect(url) {
    const ws = new WebSocket(url);
    await within(once(ws, 'open'), 'the WebSocket to open');
    const client = new JsonClient(ws);
    ws.send(JSON.stringify({ handshake: { serial: true } }));
    const ack = await client.next();
    if (ack.handshake_ack?.code !== 200) throw new Error(`handshake refused: ${JSON.stringify(ack)}`);
    return client;
  }

  constructor(ws) {
    this.ws = ws;
    this.id = 0;
    this.frames = [];
    this.waiters = [];
    ws.on('message', (data) => {
      const packet = JSON.parse(data.toString());
      const waiter = this.waiters.shift();
      if (waiter) waiter(packet);
      else this.frames.push(packet);
    });
  }

  next() {
    const ready = this.frames.shift();
    if (ready) return Promise.resolve(ready);
    return within(new Promise((resolve) => this.waiters.push(resolve)), 'a packet');
  }

  /** Sends a request and returns its response; pushes that came first are kept in `pushes`. */
  async call(route, body, pushes = []) {
    const id = ++this.id;
    this.ws.send(JSON.stringify({ request: { id, route, body } }));
    for (;;) {
      const packet = await this.next();
      if (packet.push) pushes.push(packet.push);
      else if (packet.response?.id === id) return packet.response;
    }
  }

  close() {
    this.ws.close();
  }
}
