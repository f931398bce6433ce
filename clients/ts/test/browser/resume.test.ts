/**
 * The demo page in real headless Chromium resumes its session after its link is cut
 * (docs/protocol.md, "Resume"). The page, loaded from a real gate, reaches that gate
 * through a TCP proxy of the test's own (test/tcp-proxy.ts), which resets the link on
 * both sides at once and holds the page's next connection; meanwhile another client,
 * connected to the gate directly, keeps saying lines in the page's room. Once let
 * through, the page resumes: it shows every line, in order, none twice, says
 * `resumed`, and did not need to log in again.
 *
 * This needs the gate's side of resume: against a gate without it the test fails and
 * says so (the page would show a new session).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Browser, Page } from "puppeteer-core";
import { chat, type Client, type chatTypes } from "../../src/index.js";
import { startGate, type Gate } from "../gate.js";
import { closeAll, collect, open as openClient } from "../helpers.js";
import { tcpProxy, type TcpProxy } from "../tcp-proxy.js";
import { waitFor } from "../wait.js";
import { join, launchChromium, login, messages, openPage, waitForMembers, waitForSession, waitForState } from "./page.js";

describe("the demo page resumes its session in Chromium", { timeout: 120_000 }, () => {
  let gate: Gate;
  let proxy: TcpProxy;
  let browser: Browser;
  const pageErrors: string[][] = [];

  before(async () => {
    browser = await launchChromium();
    gate = await startGate();
    proxy = await tcpProxy(gate.port);
  });

  after(async () => {
    closeAll();
    await browser?.close();
    await proxy?.close();
    await gate?.stop();
  });

  /** Waits until the page's room log ends with `line` ("from: text"). */
  async function waitForLast(page: Page, line: string): Promise<void> {
    await page.waitForFunction(
      (want) => {
        const all = document.querySelectorAll<HTMLElement>("#log .msg");
        const last = all[all.length - 1];
        return last !== undefined && `${last.dataset["from"]}: ${last.dataset["text"]}` === want;
      },
      { timeout: 30_000 },
      line,
    );
  }

  test("a link cut while lines are said: the page resumes and shows each line once, in order", async () => {
    const gateViaProxy = `ws://127.0.0.1:${proxy.port}/`;
    const opened = await openPage(browser, `http://127.0.0.1:${gate.port}/?gate=${encodeURIComponent(gateViaProxy)}`);
    pageErrors.push(opened.errors);
    const page = opened.page;
    await waitForSession(page, "new");
    await login(page, "pia");
    await join(page, "den");

    // The other player, straight to the gate: the proxy's cuts never touch it.
    const sender: Client = await openClient({ servers: gate.url, serial: true });
    if (!sender.resumable) {
      throw new Error(`the gate at ${gate.url} gives no resume token: this shaddock binary has no resume (#29) on its side`);
    }
    const room = chat(sender);
    await room.login("sam");
    await room.join("den");
    await waitForMembers(page, ["pia", "sam"]);
    const comings = collect<chatTypes.MemberEvent>((listener) => room.onJoined(listener));
    const goings = collect<chatTypes.MemberEvent>((listener) => room.onLeft(listener));
    const said: string[] = [];
    const say = async (text: string) => {
      await room.say("den", text);
      said.push(`sam: ${text}`);
    };

    for (let i = 1; i <= 5; i++) await say(`line ${i}`);
    await waitForLast(page, "sam: line 5");

    // The link goes; lines keep coming while the page is away.
    proxy.cut();
    await waitFor("the page to dial again", () => proxy.holding > 0, 15_000);
    await page.waitForFunction(() => document.getElementById("state")?.dataset["state"] !== "open", { timeout: 15_000 });
    for (let i = 6; i <= 15; i++) await say(`line ${i}`);
    proxy.release();

    await waitForSession(page, "resumed", 30_000);
    await waitForState(page, "open");
    for (let i = 16; i <= 20; i++) await say(`line ${i}`);
    await waitForLast(page, "sam: line 20");
    // A repeat could only come before the lines said after the resume: none did.
    assert.deepEqual(await messages(page), said);
    assert.equal(await page.$eval("#session", (el) => el.textContent), "resumed");
    // Never out of the room: a new session would have left it and joined again.
    assert.deepEqual([...comings, ...goings].map((e) => e.name), []);
  });

  test("no page threw an error", () => {
    assert.deepEqual(pageErrors.flat(), []);
  });
});
