/**
 * docs/protocol.md, "Kicks and closes": a close `1001 resumed elsewhere` means someone
 * else took the session up, so the client ends with it, as after a kick, instead of
 * reconnecting; any other close from the gate is a drop it reconnects after.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { RESUMED_ELSEWHERE } from "../src/index.js";
import { fakeGate, type FakeGate } from "./fake-gate.js";
import { closeAll, recorded } from "./helpers.js";
import { within } from "./wait.js";

const fakes: FakeGate[] = [];
after(async () => {
  closeAll();
  await Promise.all(fakes.map((f) => f.close()));
});

test("a close 'resumed elsewhere' ends the client; another close reconnects", async () => {
  const reasons = ["too slow", RESUMED_ELSEWHERE];
  let connections = 0;
  const fake = await fakeGate((socket) => {
    const reason = reasons[connections] ?? RESUMED_ELSEWHERE;
    connections += 1;
    socket.close(1001, reason);
  });
  fakes.push(fake);
  const { client } = recorded({ servers: fake.url, reconnect: { initialDelayMs: 5, maxDelayMs: 50 } });
  client.connect();
  assert.equal(await within("the client to close", client.closed()), RESUMED_ELSEWHERE);
  assert.equal(connections, 2, "one reconnect, after the first close only");
});
