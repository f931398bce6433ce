/**
 * The demo page the gate serves at `/`: chat (log in, rooms, members, whispers), an
 * arena panel (join a match of the keyed arena service, move with the arrow keys, see
 * every player of the match on a canvas) and an echo panel with live latency, over the
 * SDK's public API only. It connects to the gate
 * that served it (`ws(s)://<host>/`), or to `?gate=ws://host:port/` when the page is
 * served from elsewhere; `?encoding=json` picks JSON frames. For a gate that checks
 * signed player tokens, the token field's value goes in the handshake (and a new one
 * refreshes an open session); log in with the token's name then.
 *
 * Beside the connection's state it shows what became of the session: `resumed` after a
 * dropped link was taken up again (nothing to restore, no message missed), or a new
 * session after a reconnect that could not resume (then the page logs in and rejoins).
 */
import {
  arena,
  chat,
  Client,
  echo,
  ShaddockError,
  type Arena,
  type arenaTypes,
  type Chat,
  type Echo,
  type Encoding,
  type StateEvent,
} from "../src/index.js";
import { drawHistogram, Latencies } from "./histogram.js";

const params = new URLSearchParams(location.search);
const gateUrl = params.get("gate") ?? `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;

function $<T extends HTMLElement = HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`#${id} missing from the page`);
  return el as T;
}

const ui = {
  state: $("state"),
  session: $("session"),
  stateDetail: $("state-detail"),
  encoding: $<HTMLSelectElement>("encoding"),
  reconnect: $<HTMLButtonElement>("reconnect"),
  token: $<HTMLInputElement>("token"),
  kick: $("kick"),
  error: $("error"),
  me: $("me"),
  name: $<HTMLInputElement>("name"),
  room: $<HTMLInputElement>("room"),
  rooms: $("rooms"),
  log: $("log"),
  text: $<HTMLInputElement>("text"),
  whisperTo: $<HTMLInputElement>("whisper-to"),
  whisperText: $<HTMLInputElement>("whisper-text"),
  members: $("members"),
  membersRoom: $("members-room"),
  match: $<HTMLInputElement>("match"),
  arenaMatch: $("arena-match"),
  arenaTick: $("arena-tick"),
  arenaLeave: $<HTMLButtonElement>("arena-leave"),
  arenaPad: $("arena-pad"),
  arenaCanvas: $<HTMLCanvasElement>("arena-canvas"),
  arenaPlayers: $("arena-players"),
  echoStart: $<HTMLButtonElement>("echo-start"),
  echoStop: $<HTMLButtonElement>("echo-stop"),
  echoStats: $("echo-stats"),
  echoHist: $<HTMLCanvasElement>("echo-hist"),
};

let client: Client;
let chatApi: Chat;
let echoApi: Echo;
let arenaApi: Arena;
/** Who this page logged in as, the rooms and the match it is in: restored after a reconnect. */
let me: string | undefined;
const rooms = new Set<string>();
let current: string | undefined;
let match: string | undefined;
/** This client has been open before: a new session now is a reconnect's. */
let wasOpen = false;

function connect(encoding: Encoding): void {
  client?.close("switching connection");
  ui.kick.hidden = true;
  ui.reconnect.hidden = true;
  wasOpen = false;
  client = new Client({ servers: gateUrl, encoding, serial: true, clientName: "shaddock-demo", token: ui.token.value.trim() });
  chatApi = chat(client);
  echoApi = echo(client);
  arenaApi = arena(client);
  client.onState(onState);
  client.onKick((reason) => {
    ui.kick.textContent = `Kicked: ${reason}`;
    ui.kick.dataset["reason"] = reason;
    ui.kick.hidden = false;
  });
  client.onError((error) => showError(error));
  chatApi.onMessage((m) => addLine({ kind: "msg", room: m.room, from: m.from, text: m.text, display: m.display, color: m.color }));
  chatApi.onWhisper((m) => addLine({ kind: "whisper", room: "", from: m.from, text: m.text, display: m.display, color: m.color }));
  chatApi.onJoined((e) => {
    if (e.name !== me) addLine({ kind: "event", room: e.room, from: e.name, text: "joined" });
    if (e.room === current) void refreshMembers();
  });
  chatApi.onLeft((e) => {
    if (e.name !== me) addLine({ kind: "event", room: e.room, from: e.name, text: `left (${e.reason})` });
    if (e.room === current) void refreshMembers();
  });
  // A late push of a match this page left is not shown.
  arenaApi.onState((state) => {
    if (state.match === match) showArena(state);
  });
  client.connect();
}

function onState(event: StateEvent): void {
  ui.state.textContent = event.state;
  ui.state.dataset["state"] = event.state;
  const parts: string[] = [];
  if (event.url) parts.push(event.url);
  if (event.attempt !== undefined && event.attempt > 1) parts.push(`attempt ${event.attempt}`);
  if (event.delayMs) parts.push(`in ${event.delayMs} ms`);
  if (event.reason) parts.push(`(${event.reason})`);
  ui.stateDetail.textContent = parts.join(" ");
  showSession(event);
  // A resumed session has its login, rooms and match still: nothing to restore.
  if (event.state === "open" && !event.resumed) void restore();
  if (event.state === "closed") {
    ui.reconnect.hidden = false;
    stopEcho();
  }
}

/** What became of the session, once open: new, resumed, or a new one after a reconnect or a move. */
function showSession(event: StateEvent): void {
  let session = "";
  let text = "";
  if (event.state === "open") {
    if (event.resumed) {
      [session, text] = ["resumed", "resumed"];
    } else if (event.reason?.startsWith("moved: ")) {
      [session, text] = ["moved", "moved (new session)"];
    } else if (wasOpen) {
      const refused = event.resumeCode ? `, resume ${event.resumeCode}` : "";
      [session, text] = ["reconnected", `reconnected (new session${refused})`];
    } else {
      [session, text] = ["new", "new session"];
    }
    wasOpen = true;
  }
  ui.session.textContent = text;
  ui.session.dataset["session"] = session;
  if (event.resumeCode !== undefined) ui.session.dataset["resumeCode"] = String(event.resumeCode);
  else delete ui.session.dataset["resumeCode"];
}

/** A new session has none of the last one's state: log in and join the rooms and the match again. */
async function restore(): Promise<void> {
  if (me === undefined && match === undefined) return;
  await run(async () => {
    if (me !== undefined) {
      await chatApi.login(me);
      for (const room of rooms) await chatApi.join(room);
      await refreshMembers();
    }
    const rejoin = match;
    leftMatch();
    if (rejoin !== undefined) await joinMatch(rejoin);
  });
}

async function run(action: () => Promise<void>): Promise<void> {
  ui.error.textContent = "";
  try {
    await action();
  } catch (error) {
    showError(error);
  }
}

function showError(error: unknown): void {
  ui.error.textContent = error instanceof ShaddockError ? `${error.code}: ${error.reason}` : String(error);
}

interface Line {
  kind: "msg" | "whisper" | "event";
  room: string;
  /** The player's uid. */
  from: string;
  text: string;
  /** The sender's display name and colour (#rrggbb) from its profile (the profile service, which chat.login calls); absent for events. */
  display?: string;
  color?: string;
}

/** A colour the page applies: the profile service's #rrggbb, nothing else. */
const PROFILE_COLOR = /^#[0-9a-f]{6}$/;

function addLine(line: Line): void {
  const el = document.createElement("div");
  el.className = `line ${line.kind}`;
  Object.assign(el.dataset, { room: line.room, from: line.from, text: line.text, color: line.color ?? "" });
  if (line.room) {
    const room = document.createElement("span");
    room.className = "room";
    room.textContent = `#${line.room}`;
    el.append(room);
  }
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = line.display || line.from;
  who.title = line.from;
  if (line.color && PROFILE_COLOR.test(line.color)) who.style.color = line.color;
  const says = line.kind === "whisper" ? ` whispers: ${line.text}` : `${line.kind === "event" ? " " : ": "}${line.text}`;
  el.append(who, says);
  const atBottom = ui.log.scrollTop + ui.log.clientHeight >= ui.log.scrollHeight - 4;
  ui.log.append(el);
  if (atBottom) ui.log.scrollTop = ui.log.scrollHeight;
}

function renderRooms(): void {
  ui.rooms.replaceChildren(
    ...[...rooms].map((room) => {
      const li = document.createElement("li");
      li.dataset["room"] = room;
      li.classList.toggle("current", room === current);
      const select = document.createElement("button");
      select.className = "select";
      select.textContent = `#${room}`;
      select.onclick = () => {
        current = room;
        renderRooms();
        void refreshMembers();
      };
      const leave = document.createElement("button");
      leave.className = "leave";
      leave.textContent = "×";
      leave.title = `leave ${room}`;
      leave.onclick = () =>
        void run(async () => {
          await chatApi.leave(room);
          rooms.delete(room);
          if (current === room) current = [...rooms][0];
          renderRooms();
          await refreshMembers();
        });
      li.append(select, leave);
      return li;
    }),
  );
}

async function refreshMembers(): Promise<void> {
  ui.membersRoom.textContent = current ? `#${current}` : "";
  const names = current ? await chatApi.members(current) : [];
  ui.members.replaceChildren(
    ...names.map((name) => {
      const li = document.createElement("li");
      li.textContent = name === me ? `${name} (you)` : name;
      li.dataset["name"] = name;
      return li;
    }),
  );
}

function onSubmit(id: string, action: () => Promise<void>): void {
  $<HTMLFormElement>(id).addEventListener("submit", (event) => {
    event.preventDefault();
    void run(action);
  });
}

onSubmit("login-form", async () => {
  const name = ui.name.value.trim();
  me = await chatApi.login(name);
  ui.me.textContent = `as ${me}`;
  for (const room of rooms) await chatApi.join(room);
});

onSubmit("join-form", async () => {
  const room = ui.room.value.trim();
  const joined = await chatApi.join(room);
  rooms.add(joined.room);
  current = joined.room;
  ui.room.value = "";
  renderRooms();
  await refreshMembers();
});

onSubmit("say-form", async () => {
  if (current === undefined) throw new Error("join a room first");
  const text = ui.text.value;
  ui.text.value = "";
  await chatApi.say(current, text);
});

onSubmit("whisper-form", async () => {
  const to = ui.whisperTo.value.trim();
  const text = ui.whisperText.value;
  ui.whisperText.value = "";
  await chatApi.whisper(to, text);
  addLine({ kind: "whisper", room: "", from: `you → ${to}`, text });
});

onSubmit("token-form", async () => {
  // An open session takes a fresh token for the same player; otherwise connect with it.
  delete ui.token.dataset["refreshed"];
  if (client.state === "open") {
    await client.refresh(ui.token.value.trim());
    ui.token.dataset["refreshed"] = "yes";
  } else {
    connect(selectedEncoding());
  }
});

// --- arena ---

/** Canvas pixels per position unit; positions wrap around the canvas's edges. */
const ARENA_STEP = 10;
const ARROWS: Record<string, readonly [number, number]> = {
  ArrowLeft: [-1, 0],
  ArrowUp: [0, -1],
  ArrowDown: [0, 1],
  ArrowRight: [1, 0],
};

/** Joins `name` (sent with the match as its key: the arena is a keyed service). */
async function joinMatch(name: string): Promise<void> {
  const joined = await arenaApi.join(name);
  match = joined.match;
  ui.arenaMatch.textContent = `#${match}`;
  ui.arenaMatch.dataset["match"] = match;
  setArenaControls(true);
}

/** Forgets the match: no more of its pushes shown, an empty canvas. */
function leftMatch(): void {
  match = undefined;
  ui.arenaMatch.textContent = "";
  delete ui.arenaMatch.dataset["match"];
  ui.arenaTick.textContent = "";
  setArenaControls(false);
  showPlayers([]);
}

function setArenaControls(inMatch: boolean): void {
  ui.arenaLeave.disabled = !inMatch;
  for (const button of ui.arenaPad.querySelectorAll("button")) button.disabled = !inMatch;
}

function move(dx: number, dy: number): void {
  if (match === undefined) return;
  void run(async () => {
    await arenaApi.input(dx, dy);
  });
}

/** A position (unbounded) as a canvas coordinate: scaled, the origin at the centre, wrapped. */
function wrap(value: bigint, size: number): number {
  const n = BigInt(size);
  return Number((((value * BigInt(ARENA_STEP) + n / 2n) % n) + n) % n);
}

function showArena(state: arenaTypes.State): void {
  ui.arenaTick.textContent = `tick ${state.tick}`;
  ui.arenaTick.dataset["tick"] = String(state.tick);
  showPlayers(state.players);
}

/** Each player as a dot labelled with its uid, and as a line "uid (x, y)" beside the canvas. */
function showPlayers(players: readonly arenaTypes.Player[]): void {
  const canvas = ui.arenaCanvas;
  const { width, height } = canvas;
  const dots = players.map((p) => ({ uid: p.uid, x: wrap(p.x, width), y: wrap(p.y, height) }));
  ui.arenaPlayers.replaceChildren(
    ...players.map((p, i) => {
      const li = document.createElement("li");
      li.textContent = `${p.uid} (${p.x}, ${p.y})`;
      Object.assign(li.dataset, { uid: p.uid, x: String(p.x), y: String(p.y), px: String(dots[i]!.x), py: String(dots[i]!.y) });
      li.classList.toggle("me", p.uid === me);
      return li;
    }),
  );
  const ctx = canvas.getContext("2d");
  if (ctx === null) return;
  ctx.clearRect(0, 0, width, height);
  ctx.strokeStyle = "#e3e5ea";
  ctx.beginPath();
  ctx.moveTo(width / 2, 0);
  ctx.lineTo(width / 2, height);
  ctx.moveTo(0, height / 2);
  ctx.lineTo(width, height / 2);
  ctx.stroke();
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "center";
  for (const dot of dots) {
    ctx.fillStyle = dot.uid === me ? "#b3261e" : "#3558c8";
    ctx.beginPath();
    ctx.arc(dot.x, dot.y, 5, 0, 2 * Math.PI);
    ctx.fill();
    ctx.fillStyle = "#1d2330";
    ctx.fillText(dot.uid, dot.x, dot.y < 16 ? dot.y + 17 : dot.y - 8);
  }
}

onSubmit("arena-form", async () => {
  const name = ui.match.value.trim();
  if (match !== undefined && match !== name) {
    leftMatch();
    await arenaApi.leave();
  }
  await joinMatch(name);
  // The arrow keys move the player, not the cursor in the field.
  ui.match.blur();
});

ui.arenaLeave.onclick = () =>
  void run(async () => {
    if (match === undefined) return;
    leftMatch();
    await arenaApi.leave();
  });

for (const button of ui.arenaPad.querySelectorAll("button")) {
  button.onclick = () => move(Number(button.dataset["dx"]), Number(button.dataset["dy"]));
}

document.addEventListener("keydown", (event) => {
  const delta = ARROWS[event.key];
  const target = event.target;
  if (delta === undefined || match === undefined) return;
  if (target instanceof HTMLInputElement || target instanceof HTMLSelectElement || target instanceof HTMLTextAreaElement) return;
  event.preventDefault();
  move(...delta);
});

showPlayers([]);

// --- echo latency ---

const latencies = new Latencies();
let echoing = false;
/** Pause between echo requests, so the demo measures latency, not saturation. */
const ECHO_GAP_MS = 20;

async function echoLoop(): Promise<void> {
  const payload = new TextEncoder().encode("ping from the demo page");
  while (echoing) {
    const start = performance.now();
    try {
      await echoApi.echo(payload);
      latencies.add(performance.now() - start);
    } catch (error) {
      showError(error);
    }
    await new Promise((resolve) => setTimeout(resolve, ECHO_GAP_MS));
  }
}

function stopEcho(): void {
  echoing = false;
  ui.echoStart.disabled = false;
  ui.echoStop.disabled = true;
}

ui.echoStart.onclick = () => {
  echoing = true;
  ui.echoStart.disabled = true;
  ui.echoStop.disabled = false;
  void echoLoop();
};
ui.echoStop.onclick = stopEcho;

setInterval(() => {
  if (latencies.total === 0) return;
  const p50 = latencies.percentile(50);
  const p99 = latencies.percentile(99);
  ui.echoStats.textContent = `p50 ${p50.toFixed(2)} ms · p99 ${p99.toFixed(2)} ms · ${latencies.total} samples`;
  ui.echoStats.dataset["p50"] = String(p50);
  ui.echoStats.dataset["p99"] = String(p99);
  drawHistogram(ui.echoHist, latencies);
}, 250);

// --- connection ---

const initial: Encoding = params.get("encoding") === "json" ? "json" : "protobuf";
ui.encoding.value = initial;
function selectedEncoding(): Encoding {
  return ui.encoding.value === "json" ? "json" : "protobuf";
}
ui.encoding.onchange = () => connect(selectedEncoding());
ui.reconnect.onclick = () => connect(selectedEncoding());
connect(initial);
