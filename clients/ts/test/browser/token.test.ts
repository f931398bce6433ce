/**
 * The demo page against a gate that checks signed player tokens: without a token the
 * page shows the gate's refusal; with one typed into the token field it connects and
 * logs in as the token's player. The page is the one the gate itself serves at `/`
 * (the committed build in gateway/web/, embedded in the binary).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Browser } from "puppeteer-core";
import type { Gate } from "../gate.js";
import { inSeconds, signToken, startJwtGate } from "../tokens.js";
import { launchChromium, login, waitForState } from "./page.js";

const SECRET = `browser secret ${process.pid}`;

describe("the demo page with a gate that needs a token", { timeout: 60_000 }, () => {
  let gate: Gate;
  let browser: Browser;
  let pageUrl: string;

  before(async () => {
    browser = await launchChromium();
    gate = await startJwtGate(SECRET);
    pageUrl = `http://127.0.0.1:${gate.port}/`;
  });
  after(async () => {
    await browser?.close();
    await gate?.stop();
  });

  test("no token shows the refusal; a token connects and logs in as its player", async () => {
    const page = await (await browser.createBrowserContext()).newPage();
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(String(error)));
    await page.goto(pageUrl, { waitUntil: "load" });
    await waitForState(page, "closed");
    const detail = await page.$eval("#state-detail", (el) => el.textContent ?? "");
    assert.match(detail, /handshake refused: 401/);

    const name = `tia${process.pid}`;
    await page.type("#token", signToken({ sub: name, exp: inSeconds(600) }, SECRET));
    await page.click("#use-token");
    await waitForState(page, "open");
    await login(page, name);
    // Another token for the same player refreshes the open session in place.
    await page.$eval("#token", (el) => {
      (el as HTMLInputElement).value = "";
    });
    await page.type("#token", signToken({ sub: name, exp: inSeconds(900) }, SECRET));
    await page.click("#use-token");
    await page.waitForSelector('#token[data-refreshed="yes"]', { timeout: 15_000 });
    assert.equal(await page.$eval("#state", (el) => (el as HTMLElement).dataset["state"]), "open");
    assert.equal(await page.$eval("#error", (el) => el.textContent), "");
    assert.deepEqual(errors, []);
  });
});
