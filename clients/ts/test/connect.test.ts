/** Handshake, requests, answers and errors against a real gate, in both encodings. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { bodyText, echo, ShaddockError, Status, type Encoding } from "../src/index.js";
import { startGate, type Gate } from "./gate.js";
import { closeAll, gateForTests, open, recorded, rejection, typedJsonUnsupported } from "./helpers.js";
import { within } from "./wait.js";

const encodings: Encoding[] = ["protobuf", "json"];

describe("against a gate", () => {
  const gate = gateForTests();

  for (const encoding of encodings) {
    describe(`${encoding} frames`, () => {
      test("the handshake opens a session with an id", async () => {
        const { client, events } = recorded({ servers: gate.url, encoding });
        client.connect();
        await within("open", client.ready());
        assert.equal(client.state, "open");
        assert.equal(client.encoding, encoding);
        assert.ok(client.sessionId !== undefined && client.sessionId > 0n, `session id ${client.sessionId}`);
        assert.deepEqual(events.map((e) => e.state), ["connecting", "open"]);
        assert.equal(events[1]?.sessionId, client.sessionId);
        client.close();
        assert.equal(await client.closed(), "closed by client");
        assert.equal(client.state, "closed");
      });

      test("echo.raw answers the body unchanged", async () => {
        const client = await open({ servers: gate.url, encoding });
        assert.equal(bodyText(await client.request("echo.raw", "hello, gate")), "hello, gate");
        const bytes = await echo(client).raw(new TextEncoder().encode("ünïcode ✓"));
        assert.equal(new TextDecoder().decode(bytes), "ünïcode ✓");
      });

      test("echo.echo round-trips a typed message", async (t) => {
        const unsupported = encoding === "json" && (await typedJsonUnsupported(gate.url));
        if (unsupported) return t.skip(unsupported);
        const client = await open({ servers: gate.url, encoding });
        // Bytes that are not UTF-8: typed JSON carries them in base64.
        const body = new Uint8Array([0, 1, 2, 255, 128]);
        assert.deepEqual(await echo(client).echo(body), body);
      });

      test("answers arrive matched to their requests when many are in flight", async () => {
        const client = await open({ servers: gate.url, encoding });
        const texts = Array.from({ length: 50 }, (_, i) => `message ${i}`);
        const answers = await Promise.all(texts.map((t) => client.request("echo.raw", t)));
        assert.deepEqual(answers.map(bodyText), texts);
      });

      test("server timing comes with answers when the handshake asks", async () => {
        const client = await open({ servers: gate.url, encoding, serverTiming: true });
        const reply = await client.requestReply("echo.raw", "timed");
        assert.ok(reply.timing, "timing present");
        assert.ok(reply.timing.totalUs > 0, `total ${reply.timing.totalUs} µs`);
        const plain = await open({ servers: gate.url, encoding });
        assert.equal((await plain.requestReply("echo.raw", "untimed")).timing, undefined);
      });

      test("an unknown route is refused with the gate's code and message", async () => {
        const client = await open({ servers: gate.url, encoding });
        const error = await rejection(client.request("nosuch.route", "x"));
        assert.ok(error instanceof ShaddockError);
        assert.equal(error.code, Status.NOT_FOUND);
        assert.equal(error.local, false);
        assert.equal(error.route, "nosuch.route");
        assert.ok(error.reason.length > 0);
        const invalid = await rejection(client.request("Not A Route", "x"));
        assert.ok(invalid instanceof ShaddockError);
        assert.equal(invalid.code, Status.BAD_REQUEST);
      });

      test("a notify is forwarded and never answered", async () => {
        const client = await open({ servers: gate.url, encoding });
        client.notify("echo.raw", "nobody answers");
        // The session stays usable and the next answer is the next request's own.
        assert.equal(bodyText(await client.request("echo.raw", "after")), "after");
      });
    });
  }

  test("a JSON object body is refused locally on a protobuf session", async () => {
    const client = await open({ servers: gate.url });
    const error = await rejection(client.request("echo.raw", { not: "bytes" }));
    assert.ok(error instanceof ShaddockError);
    assert.equal(error.code, Status.BAD_REQUEST);
    assert.equal(error.local, true);
  });

  test("requests after close fail with 503 at once", async () => {
    const client = await open({ servers: gate.url });
    client.close();
    const error = await rejection(client.request("echo.raw", "late"));
    assert.ok(error instanceof ShaddockError);
    assert.equal(error.code, Status.UNAVAILABLE);
  });
});

describe("a gate that does not answer", () => {
  let gate: Gate;
  before(async () => {
    gate = await startGate();
  });
  after(async () => {
    closeAll();
    if (gate?.child.exitCode === null) gate.resume();
    await gate?.stop();
  });

  test("a request times out locally with 408, and the session goes on", async () => {
    const client = await open({ servers: gate.url, reconnect: false });
    assert.equal(bodyText(await client.request("echo.raw", "before")), "before");
    // A stopped process answers nothing: the request's own deadline must end it.
    // pause() resolves once the whole gate has stopped, not merely been signalled.
    await gate.pause();
    let error: unknown;
    let waited: number;
    const sent = performance.now();
    try {
      // Bounded, so that a client whose local timeout never fires fails here rather than hanging.
      error = await within("the request's local timeout", rejection(client.request("echo.raw", "lost", { timeoutMs: 200 })), 5_000);
    } finally {
      waited = performance.now() - sent;
      gate.resume();
    }
    assert.ok(error instanceof ShaddockError, String(error));
    assert.equal(error.code, Status.TIMEOUT);
    assert.equal(error.local, true);
    assert.match(error.reason, /no answer within 200 ms/);
    // Neither early nor long after its deadline (timers may fire a millisecond early).
    assert.ok(waited >= 195 && waited < 2_000, `timed out after ${waited.toFixed(1)} ms`);
    // The late answer to the timed-out request is ignored; the next one is matched.
    assert.equal(bodyText(await client.request("echo.raw", "after")), "after");
  });
});

describe("a gate with a token", () => {
  const gate = gateForTests({ args: ["--token", "sesame"] });

  test("the right token opens a session", async () => {
    const client = await open({ servers: gate.url, token: "sesame" });
    assert.equal(bodyText(await client.request("echo.raw", "in")), "in");
  });

  for (const encoding of encodings) {
    test(`a refused token closes the client with the reason, no retry (${encoding})`, async () => {
      const { client, events } = recorded({ servers: gate.url, token: "wrong", encoding });
      client.connect();
      const error = await rejection(within("refusal", client.ready()));
      assert.ok(error instanceof ShaddockError);
      assert.equal(error.code, Status.UNAUTHORIZED);
      assert.match(await client.closed(), /handshake refused: 401/);
      assert.deepEqual(events.map((e) => e.state), ["connecting", "closed"]);
    });
  }
});
