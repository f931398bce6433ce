/**
 * Driving the demo page in headless Chromium (Debian's, at /usr/bin/chromium or
 * CHROMIUM_BIN) with puppeteer-core: launch, and the few actions the tests take.
 */
import { existsSync } from "node:fs";
import puppeteer, { type Browser, type Page } from "puppeteer-core";

export const CHROMIUM_BIN = process.env["CHROMIUM_BIN"] ?? "/usr/bin/chromium";
const WAIT_MS = 15_000;

export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM_BIN)) {
    throw new Error(
      `Chromium is missing: no ${CHROMIUM_BIN}. Install Debian's chromium (apt-get install chromium) or set CHROMIUM_BIN.`,
    );
  }
  return puppeteer.launch({
    executablePath: CHROMIUM_BIN,
    headless: true,
    // Tests run as root, where Chromium's sandbox cannot start.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
}

/** A page in a context of its own (its own cookies and storage: another player), collecting page errors. */
export async function openPage(browser: Browser, url: string): Promise<{ page: Page; errors: string[] }> {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(url, { waitUntil: "load" });
  await waitForState(page, "open");
  return { page, errors };
}

export async function waitForState(page: Page, state: string, timeout = WAIT_MS): Promise<void> {
  await page.waitForFunction((s) => document.getElementById("state")?.dataset["state"] === s, { timeout }, state);
}

async function fill(page: Page, selector: string, value: string): Promise<void> {
  await page.$eval(selector, (el) => {
    (el as HTMLInputElement).value = "";
  });
  await page.type(selector, value);
}

export async function login(page: Page, name: string): Promise<void> {
  await fill(page, "#name", name);
  await page.click("#login");
  await page.waitForFunction((n) => document.getElementById("me")?.textContent === `as ${n}`, { timeout: WAIT_MS }, name);
}

export async function join(page: Page, room: string): Promise<void> {
  await fill(page, "#room", room);
  await page.click("#join");
  await page.waitForSelector(`#rooms li[data-room="${room}"]`, { timeout: WAIT_MS });
}

export async function say(page: Page, text: string): Promise<void> {
  await fill(page, "#text", text);
  await page.click("#say");
  // The page clears the input once it has taken the line.
  await page.waitForFunction(() => (document.getElementById("text") as HTMLInputElement).value === "", { timeout: WAIT_MS });
}

/** The room messages the page shows, as "from: text". */
export function messages(page: Page): Promise<string[]> {
  return page.$$eval("#log .msg", (els) => els.map((el) => `${(el as HTMLElement).dataset["from"]}: ${(el as HTMLElement).dataset["text"]}`));
}

/** Waits until the page shows `count` room messages. */
export async function waitForMessages(page: Page, count: number): Promise<string[]> {
  await page.waitForFunction((n) => document.querySelectorAll("#log .msg").length >= n, { timeout: WAIT_MS }, count);
  return messages(page);
}

/** Waits until the members list shows exactly `names`. */
export async function waitForMembers(page: Page, names: readonly string[]): Promise<void> {
  await page.waitForFunction(
    (want) => {
      const have = [...document.querySelectorAll("#members li")].map((li) => (li as HTMLElement).dataset["name"]);
      return JSON.stringify(have) === JSON.stringify(want);
    },
    { timeout: WAIT_MS },
    [...names].sort(),
  );
}
