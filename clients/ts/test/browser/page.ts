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

/** Waits until the page says what became of its session: `new`, `resumed`, `reconnected` or `moved`. */
export async function waitForSession(page: Page, session: string, timeout = WAIT_MS): Promise<void> {
  await page.waitForFunction((s) => document.getElementById("session")?.dataset["session"] === s, { timeout }, session);
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

/** The colour each room message's sender is shown in (its `data-color`, and the name's computed colour). */
export function messageColors(page: Page): Promise<{ color: string; shown: string }[]> {
  return page.$$eval("#log .msg", (els) =>
    els.map((el) => ({
      color: (el as HTMLElement).dataset["color"] ?? "",
      shown: getComputedStyle(el.querySelector(".who") as HTMLElement).color,
    })),
  );
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

/** Joins the arena match `match` from the arena panel. */
export async function joinMatch(page: Page, match: string): Promise<void> {
  await fill(page, "#match", match);
  await page.click("#arena-join");
  await page.waitForFunction((m) => document.getElementById("arena-match")?.dataset["match"] === m, { timeout: WAIT_MS }, match);
}

/** The arena players the page lists beside its canvas, as "uid (x, y)", sorted. */
export function arenaPlayers(page: Page): Promise<string[]> {
  return page.$$eval("#arena-players li", (els) => els.map((el) => el.textContent ?? "").sort());
}

/** Waits until the arena list shows exactly `players` ("uid (x, y)"), redrawn from the match's state pushes. */
export async function waitForArenaPlayers(page: Page, players: readonly string[]): Promise<void> {
  await page.waitForFunction(
    (want) => {
      const have = [...document.querySelectorAll("#arena-players li")].map((li) => li.textContent ?? "").sort();
      return JSON.stringify(have) === JSON.stringify(want);
    },
    { timeout: WAIT_MS },
    [...players].sort(),
  );
}

/** Whether the arena canvas is painted (a dot) where the list says player `uid` is drawn. */
export function arenaDotDrawn(page: Page, uid: string): Promise<boolean> {
  return page.evaluate((u) => {
    const li = [...document.querySelectorAll<HTMLElement>("#arena-players li")].find((el) => el.dataset["uid"] === u);
    const canvas = document.getElementById("arena-canvas") as HTMLCanvasElement;
    if (li === undefined) return false;
    const [x, y] = [Number(li.dataset["px"]), Number(li.dataset["py"])];
    const pixel = canvas.getContext("2d")?.getImageData(x, y, 1, 1).data;
    // The dot's fill is opaque; the canvas elsewhere is transparent or a pale axis line.
    return pixel !== undefined && pixel[3] === 255 && pixel[0]! + pixel[1]! + pixel[2]! < 600;
  }, uid);
}
