/**
 * Signed player tokens against a real gate (`--jwt-secret-file`): the handshake's token
 * is an HS256 JWT signed here with node's own HMAC; its `sub` is the session's player;
 * its `exp` is enforced during the session (Kick "token expired", which ends the
 * client) unless `client.refresh` hands the gate a fresh token first.
 *
 * Every test uses a player of its own: the gate kicks the older session of a player
 * who connects twice.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { bodyText, chat, ShaddockError, Status, type Encoding } from "../src/index.js";
import type { Gate } from "./gate.js";
import { closeAll, collect, open, recorded, rejection } from "./helpers.js";
import { inSeconds, signToken, startJwtGate } from "./tokens.js";
import { waitFor, within } from "./wait.js";

const SECRET = `test secret ${process.pid} ${Date.now()}`;
const encodings: Encoding[] = ["protobuf", "json"];

function sign(claims: Record<string, unknown>, secret = SECRET): string {
  return signToken(claims, secret);
}

let players = 0;
/** A player name no other test uses (the gate's uid check takes a-z 0-9 _ -). */
function player(what: string): string {
  return `${what}-${process.pid}-${++players}`;
}

describe("a gate checking signed player tokens", () => {
  let gate: Gate;
  before(async () => {
    gate = await startJwtGate(SECRET);
  });
  after(async () => {
    closeAll();
    await gate?.stop();
  });

  for (const encoding of encodings) {
    describe(`${encoding} frames`, () => {
      test("a valid token opens a session whose player is the token's sub", async () => {
        const name = player("valid");
        const client = await open({ servers: gate.url, encoding, serial: true, token: sign({ sub: name, exp: inSeconds(600) }) });
        assert.equal(client.state, "open");
        assert.equal(bodyText(await client.request("echo.raw", "signed in")), "signed in");
        // The gate bound the sub as the uid: chat takes that name and no other.
        assert.equal(await chat(client).login(name), name);
        const error = await rejection(chat(client).login(player("someone-else")));
        assert.ok(error instanceof ShaddockError, String(error));
        assert.equal(error.code, Status.FORBIDDEN);
      });

      test("a token with a bad signature is refused with the gate's 401 message, no retry", async () => {
        const { client, events } = recorded({
          servers: gate.url,
          encoding,
          token: sign({ sub: player("forger"), exp: inSeconds(600) }, "not the gate's secret"),
        });
        client.connect();
        const error = await rejection(within("refusal", client.ready()));
        assert.ok(error instanceof ShaddockError, String(error));
        assert.match(error.message, /handshake refused: 401 token signature does not verify/);
        assert.equal(error.code, Status.UNAUTHORIZED, "the gate's code, to tell auth from network");
        assert.equal(await client.closed(), "handshake refused: 401 token signature does not verify");
        assert.deepEqual(events.map((e) => e.state), ["connecting", "closed"]);
        // connect() says the same to its caller.
        const refused = await rejection(open({ servers: gate.url, encoding, token: "not.a.jwt" }));
        assert.ok(refused instanceof ShaddockError, String(refused));
        assert.match(refused.message, /handshake refused: 401 token is not a JWT/);
        assert.equal(refused.code, Status.UNAUTHORIZED);
      });

      test("a refresh with a bad token is refused with the gate's reason and the session goes on", async () => {
        const name = player("refused-refresh");
        const client = await open({ servers: gate.url, encoding, token: sign({ sub: name, exp: inSeconds(600) }) });
        const forged = await rejection(within("forged", client.refresh(sign({ sub: name, exp: inSeconds(600) }, "wrong secret"))));
        assert.ok(forged instanceof ShaddockError, String(forged));
        assert.equal(forged.code, Status.UNAUTHORIZED);
        assert.equal(forged.local, false);
        assert.equal(forged.reason, "token signature does not verify");
        // A valid token of another player does not move this session to them.
        const other = await rejection(within("another player's", client.refresh(sign({ sub: player("other"), exp: inSeconds(600) }))));
        assert.ok(other instanceof ShaddockError, String(other));
        assert.equal(other.code, Status.UNAUTHORIZED);
        assert.match(other.reason, /not this session's player/);
        assert.equal(bodyText(await client.request("echo.raw", "still here")), "still here");
      });
    });
  }

  // The expiry tests wait for the clock (a token lives whole seconds): run them side by side.
  describe("expiry", { concurrency: true }, () => {
    for (const encoding of encodings) {
      test(`a session whose token expires is kicked with "token expired" and does not reconnect (${encoding})`, async () => {
        const exp = inSeconds(2);
        // Reconnection is on (the default): the kick must end the client by itself.
        const { client, events } = recorded({ servers: gate.url, encoding, token: sign({ sub: player("expiring"), exp }) });
        const kicks = collect<string>((f) => client.onKick(f));
        client.connect();
        await within("open", client.ready());
        assert.equal(bodyText(await client.request("echo.raw", "before expiry")), "before expiry");
        assert.equal(await within("the close at expiry", client.closed(), 10_000), "token expired");
        assert.ok(Date.now() >= exp * 1000, `closed ${exp * 1000 - Date.now()} ms before exp`);
        assert.deepEqual(kicks, ["token expired"]);
        assert.deepEqual(events.map((e) => e.state), ["connecting", "open", "closed"]);
        assert.equal(events.at(-1)?.reason, "token expired");
        const late = await rejection(client.request("echo.raw", "after expiry"));
        assert.ok(late instanceof ShaddockError, String(late));
        assert.equal(late.code, Status.UNAVAILABLE);
      });

      test(`a session refreshed before expiry outlives its first token (${encoding})`, async () => {
        const name = player("refreshed");
        const exp = inSeconds(2);
        const { client, events } = recorded({ servers: gate.url, encoding, token: sign({ sub: name, exp }) });
        const kicks = collect<string>((f) => client.onKick(f));
        client.connect();
        await within("open", client.ready());
        await within("the refresh", client.refresh(sign({ sub: name, exp: inSeconds(600) })));
        // Past the first token's expiry, with room for a gate that had not taken the refresh to kick.
        await waitFor("the first token's expiry to pass", () => Date.now() >= exp * 1000 + 500, 10_000);
        assert.equal(bodyText(await client.request("echo.raw", "after the first expiry")), "after the first expiry");
        assert.deepEqual(kicks, []);
        assert.equal(client.state, "open");
        assert.deepEqual(events.map((e) => e.state), ["connecting", "open"]);
      });
    }
  });
});
