/**
 * The demo page in real headless Chromium, loaded from the gate that serves it at `/`:
 * two players chat in one room, a third login with a taken name shows the kick's reason,
 * two players in one arena match see each other move, and after the gate restarts on
 * its port the page reconnects and logs in by itself.
 */
import assert from "node:assert/strict";
import type { Server } from "node:http";
import { resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser } from "puppeteer-core";
import { freePort, PACKAGE_DIR, startGate, type Gate } from "../gate.js";
import {
  arenaDotDrawn,
  arenaPlayers,
  join,
  joinMatch,
  launchChromium,
  login,
  messageColors,
  messages,
  openPage,
  say,
  waitForArenaPlayers,
  waitForMembers,
  waitForMessages,
  waitForState,
} from "./page.js";
import { serveStatic } from "./static-server.js";

describe("the demo page in Chromium", { timeout: 120_000 }, () => {
  let gate: Gate;
  let port: number;
  let browser: Browser;
  let pageUrl: string;
  let staticServer: Server | undefined;
  const pageErrors: string[][] = [];

  before(async () => {
    browser = await launchChromium();
    port = await freePort();
    gate = await startGate({ gatePort: port });
    if (process.env["SHADDOCK_DEMO_FROM"] === "static") {
      const served = await serveStatic(resolve(PACKAGE_DIR, "../../gateway/web"));
      staticServer = served.server;
      pageUrl = `${served.url}?gate=${encodeURIComponent(gate.url)}`;
    } else {
      pageUrl = `http://127.0.0.1:${port}/`;
      const response = await fetch(pageUrl).catch((error: unknown) => new Error(String(error)));
      const html = response instanceof Error ? "" : await response.text();
      if (!html.includes("<title>Shaddock demo</title>")) {
        const said = response instanceof Error ? response.message : `status ${response.status}`;
        throw new Error(`the gate at ${pageUrl} does not serve the demo page at / (${said}): this shaddock binary predates it`);
      }
    }
  });

  after(async () => {
    await browser?.close();
    staticServer?.close();
    await gate?.stop();
  });

  async function open() {
    const opened = await openPage(browser, pageUrl);
    pageErrors.push(opened.errors);
    return opened.page;
  }

  test("two players in one room see each other's messages in order", async () => {
    const [ann, bob] = await Promise.all([open(), open()]);
    await login(ann, "ann");
    await login(bob, "bob");
    await join(ann, "lobby");
    await join(bob, "lobby");
    await waitForMembers(ann, ["ann", "bob"]);
    await waitForMembers(bob, ["ann", "bob"]);
    await say(ann, "hello bob");
    await say(bob, "hi ann");
    await say(ann, "how are you?");
    const want = ["ann: hello bob", "bob: hi ann", "ann: how are you?"];
    // Each says after seeing its previous line answered, so both pages see one order.
    assert.deepEqual(await waitForMessages(ann, 3), want);
    assert.deepEqual(await waitForMessages(bob, 3), want);
    // chat.login took each player's colour from the profile service; every line shows
    // its sender's name in it.
    const colors = await messageColors(bob);
    const rgb = (hex: string) => `rgb(${[1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)).join(", ")})`;
    for (const { color, shown } of colors) {
      assert.match(color, /^#[0-9a-f]{6}$/);
      assert.equal(shown, rgb(color));
    }
    assert.equal(colors[0]?.color, colors[2]?.color, "ann's lines share ann's colour");
  });

  test("a login with a taken name kicks the first page, which shows the reason", async () => {
    const first = await open();
    await login(first, "kim");
    const second = await open();
    await login(second, "kim");
    await first.waitForSelector("#kick:not([hidden])", { timeout: 15_000 });
    const reason = await first.$eval("#kick", (el) => (el as HTMLElement).dataset["reason"]);
    assert.match(reason ?? "", /logged in elsewhere/);
    await waitForState(first, "closed");
    await waitForState(second, "open");
  });

  test("two players in one arena match: one moves with the arrow keys, the other sees its dot move", async () => {
    const [amy, ben] = await Promise.all([open(), open()]);
    try {
      await login(amy, "amy");
      await login(ben, "ben");
      // arena.join goes with the match as its key; the page shows the match once joined.
      await joinMatch(amy, "m1");
      await joinMatch(ben, "m1");
      await waitForArenaPlayers(ben, ["amy (0, 0)", "ben (0, 0)"]);
      await waitForArenaPlayers(amy, ["amy (0, 0)", "ben (0, 0)"]);

      // The focus is on the Join button, not in a text field: the arrows move amy.
      for (let i = 0; i < 3; i++) await amy.keyboard.press("ArrowRight");
      await waitForArenaPlayers(ben, ["amy (3, 0)", "ben (0, 0)"]);
      await waitForArenaPlayers(amy, ["amy (3, 0)", "ben (0, 0)"]);
      assert.ok(await arenaDotDrawn(ben, "amy"), "ben's canvas shows amy's dot where she moved");
      assert.ok(await arenaDotDrawn(ben, "ben"), "ben's canvas shows his own dot");
      const drawnAt = await ben.$eval('#arena-players li[data-uid="amy"]', (el) => [(el as HTMLElement).dataset["px"], (el as HTMLElement).dataset["py"]]);
      // 3 units of 10 px right of the centre of a 320 x 200 canvas.
      assert.deepEqual(drawnAt, ["190", "100"]);

      // The on-screen buttons move too; a leave takes the player off the other's page.
      await ben.click("#arena-up");
      await waitForArenaPlayers(amy, ["amy (3, 0)", "ben (0, -1)"]);
      await ben.click("#arena-leave");
      await waitForArenaPlayers(amy, ["amy (3, 0)"]);
      assert.deepEqual(await arenaPlayers(ben), []);
    } finally {
      await Promise.all([amy.browserContext().close(), ben.browserContext().close()]);
    }
  });

  test("after the gate restarts on its port the page reconnects and rejoins by itself", async () => {
    const page = await open();
    await login(page, "ray");
    await join(page, "hall");
    await say(page, "before the restart");
    await waitForMessages(page, 1);

    await gate.stop();
    await page.waitForFunction(() => document.getElementById("state")?.dataset["state"] !== "open", { timeout: 15_000 });
    gate = await startGate({ gatePort: port });
    await waitForState(page, "open", 30_000);
    // Logged in and back in the room without a click: its members list shows it again.
    await waitForMembers(page, ["ray"]);
    await say(page, "after the restart");
    assert.deepEqual(await waitForMessages(page, 2), ["ray: before the restart", "ray: after the restart"]);
    assert.deepEqual(await messages(page), ["ray: before the restart", "ray: after the restart"]);
  });

  test("no page threw an error", () => {
    assert.deepEqual(pageErrors.flat(), []);
  });
});
