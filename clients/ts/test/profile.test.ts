/**
 * The profile service through the typed API, on one real gate (`shaddock up` runs it):
 * a player's default profile, setting its own, reading another's by key, and
 * `chat.login` answering with the profile (the chat worker calls the profile service).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { chatRoutes, profile, ShaddockError, Status } from "../src/index.js";
import { gateForTests, open, rejection } from "./helpers.js";

const gate = gateForTests();

const COLOR = /^#[0-9a-f]{6}$/;

test("a player's profile: the default, then its own, seen by others and by its next login", async () => {
  const name = `pro${process.pid}`;
  const first = await open({ servers: gate.url, serial: true });
  const login = await first.call(chatRoutes.login, { name });
  assert.equal(login.display, name);
  assert.match(login.color, COLOR);
  const mine = profile(first);
  const got = await mine.get();
  assert.deepEqual([got.uid, got.display, got.color], [name, name, login.color]);
  const set = await mine.set({ display: "Pro", color: "#00ff7f" });
  assert.equal(set.display, "Pro");
  assert.equal(set.color, "#00ff7f");
  const refused = await rejection(mine.set({ color: "green" }));
  assert.ok(refused instanceof ShaddockError && refused.code === Status.BAD_REQUEST, String(refused));

  const other = await open({ servers: gate.url, serial: true });
  const seen = await profile(other).get(name);
  assert.equal(seen.display, "Pro");
  first.close();

  const again = await open({ servers: gate.url, serial: true });
  const relogin = await again.call(chatRoutes.login, { name });
  assert.deepEqual([relogin.display, relogin.color], ["Pro", "#00ff7f"]);
});
