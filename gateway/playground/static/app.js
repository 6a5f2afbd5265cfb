// The playground page: one realtime session with the gateway, its state machine and its UI.
//
// State is derived, not stored: `phase()` reads the connection, the player and the turn in flight,
// so the status line cannot disagree with what is actually happening. `window.playground` exposes
// the same facts (and the player's rendered-sample count) for the browser test.

import { AudioEngine, fromBase64, RATE, toBase64 } from "./audio.js";
import { argumentsText, callCard } from "./call-card.js";
import { toContentPart } from "./media.js";
import { RealtimeConnection } from "./realtime.js";
import { stallTitle, turnCells } from "./turn-metrics.js";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  statusText: $("status-text"),
  error: $("error"),
  connectForm: $("connect-form"),
  apiKey: $("api-key"),
  connect: $("connect"),
  disconnect: $("disconnect"),
  voice: $("voice"),
  instructions: $("instructions"),
  extra: $("extra"),
  talk: $("talk"),
  interrupt: $("interrupt"),
  level: $("level"),
  transcript: $("transcript"),
  messageForm: $("message-form"),
  message: $("message"),
  attach: $("attach"),
  attachments: $("attachments"),
  send: $("send"),
  metrics: document.querySelector("#metrics tbody"),
  played: $("played"),
};

const STATUS_TEXT = {
  disconnected: "Not connected",
  connecting: "Connecting…",
  ready: "Ready: hold the talk button (or Space) to speak, or type",
  listening: "Listening…",
  thinking: "Thinking…",
  speaking: "Speaking…",
  error: "Error",
};

const KEY_STORAGE = "omnistream.playground.apiKey";
const MAX_METRIC_ROWS = 20;

const session = {
  connection: null,
  connecting: false,
  failed: null, // the message of a failed or lost connection
  model: null,
  mode: "vad",
  pttHeld: false,
  userSpeaking: false,
  awaiting: false, // a turn was committed or sent; its answer has not finished
  responseActive: false,
  response: null, // {id, itemId, audioStart, received, cut}
  playing: false,
  turns: 0,
};

// samplesPlayed: 24 kHz samples the player rendered; cutPlayed: of those, rendered after an answer was
// cut and before the next one began (barge-in must keep it 0); lastFlush: the player's flush report.
const stats = {
  samplesPlayed: 0,
  samplesReceived: 0,
  micPiecesSent: 0,
  bargeIns: 0,
  flushes: 0,
  cutPlayed: 0,
  lastFlush: null,
};
const transcript = new Map(); // item id -> {role, element, text}
const metrics = [];
const eventCounts = {};
const serverErrors = []; // the last few error events, for the test and for debugging
const recentEvents = []; // the types of the last events received (debugging)

const audio = new AudioEngine({ onMicPiece, onPlayer });

window.playground = {
  get state() {
    return phase();
  },
  stats,
  metrics,
  eventCounts,
  serverErrors,
  transcript: () => [...transcript.values()].map(({ role, text, status }) => ({ role, text, status })),
  get error() {
    return ui.error.hidden ? null : ui.error.textContent;
  },
};

// ---- state ----------------------------------------------------------------------------------

function connected() {
  return session.connection !== null && session.connection.opened;
}

function phase() {
  if (session.connecting) return "connecting";
  if (!connected()) return session.failed ? "error" : "disconnected";
  if (session.playing) return "speaking";
  if (session.pttHeld || session.userSpeaking) return "listening";
  if (session.awaiting) return "thinking";
  return session.mode === "vad" ? "listening" : "ready";
}

function render() {
  const state = phase();
  ui.status.dataset.state = state;
  let text = STATUS_TEXT[state];
  if (state === "listening" && session.mode === "vad") {
    text = session.userSpeaking ? "Listening: hearing you…" : "Listening: speak any time";
  }
  if (state === "error") text = `Error: ${session.failed}`;
  if (ui.statusText.textContent !== text) ui.statusText.textContent = text;
  const live = connected();
  ui.connect.disabled = live || session.connecting;
  ui.disconnect.disabled = !live && !session.connecting;
  ui.apiKey.disabled = live || session.connecting;
  for (const control of [ui.voice, ui.message, ui.attach, ui.send]) control.disabled = !live;
  ui.talk.disabled = !live || session.mode !== "ptt";
  ui.talk.setAttribute("aria-pressed", String(session.pttHeld));
  ui.interrupt.disabled = !live || !(session.playing || session.responseActive);
  ui.played.textContent = (stats.samplesPlayed / RATE).toFixed(2);
}

/** Show `message` in the alert; `source` lets a later success clear only its own kind of error. */
function showError(message, source = "") {
  ui.error.textContent = message;
  ui.error.dataset.source = source;
  ui.error.hidden = false;
}

function clearError(source = null) {
  if (source !== null && ui.error.dataset.source !== source) return;
  ui.error.hidden = true;
  ui.error.textContent = "";
}

// ---- connecting -----------------------------------------------------------------------------

async function connect() {
  clearError();
  session.failed = null;
  session.connecting = true;
  render();
  const key = ui.apiKey.value.trim();
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
    await audio.start(); // inside the click: the autoplay policy allows it
    const card = await modelCard(key);
    session.model = card.id;
    fillVoices(card.omnistream?.voices ?? []);
    const url = new URL(`/v1/realtime?model=${encodeURIComponent(card.id)}`, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const connection = new RealtimeConnection(url.href, key, { onEvent, onClose });
    session.connection = connection;
    await connection.ready;
    try {
      await audio.startMic();
    } catch (error) {
      // no microphone (or no permission): typing and attachments still work
      showError(`Microphone unavailable (${error.message}): you can still type and attach files`);
    }
  } catch (error) {
    session.connection?.close();
    session.connection = null;
    session.failed = error.message;
    showError(error.message);
  } finally {
    session.connecting = false;
    render();
  }
}

/** The served model and its voices, from GET /v1/models (which also checks the key). */
async function modelCard(key) {
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const reply = await fetch("/v1/models", { headers });
  const body = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(body?.error?.message ?? `GET /v1/models: HTTP ${reply.status}`);
  if (!body.data?.length) throw new Error("the gateway has not heard from every stage yet; try again");
  return body.data[0];
}

function fillVoices(voices) {
  const previous = ui.voice.value;
  ui.voice.replaceChildren(new Option("(the gateway's default)", ""), ...voices.map((v) => new Option(v, v)));
  if (voices.includes(previous)) ui.voice.value = previous;
}

function disconnect() {
  session.connection?.close();
}

function onClose({ code, reason, opened }) {
  const wasLive = opened;
  session.connection = null;
  resetTurn();
  audio.close(); // stops playback and releases the microphone (the browser's recording indicator)
  if (wasLive && code !== 1000) {
    session.failed = reason || `the connection was lost (code ${code})`;
    showError(session.failed);
  }
  render();
}

function resetTurn() {
  session.pttHeld = false;
  session.userSpeaking = false;
  session.awaiting = false;
  session.responseActive = false;
  session.playing = false;
}

// ---- session configuration --------------------------------------------------------------------

function sessionConfig() {
  const turnDetection =
    session.mode === "vad"
      ? { type: "server_vad", threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 }
      : null;
  const config = {
    type: "realtime",
    output_modalities: ["audio"],
    audio: {
      input: { format: { type: "audio/pcm", rate: RATE }, turn_detection: turnDetection },
      output: { format: { type: "audio/pcm", rate: RATE } },
    },
  };
  if (ui.voice.value) config.audio.output.voice = ui.voice.value;
  config.instructions = ui.instructions.value.trim();
  return merge(config, extraSettings());
}

/** The Advanced field's JSON object ({} when empty); throws with a readable message. */
function extraSettings() {
  const text = ui.extra.value.trim();
  if (!text) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(`More session settings: not JSON (${error.message})`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new Error("More session settings: must be a JSON object");
  }
  return value;
}

function merge(base, extra) {
  for (const [key, value] of Object.entries(extra)) {
    const plain = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
    base[key] = plain(value) && plain(base[key]) ? merge(base[key], value) : value;
  }
  return base;
}

function updateSession() {
  if (!connected()) return;
  let config;
  try {
    config = sessionConfig();
  } catch (error) {
    showError(error.message, "settings");
    return;
  }
  clearError("settings");
  session.connection.send({ type: "session.update", session: config });
}

// ---- events from the gateway ------------------------------------------------------------------

const GA_NAMES = {
  // beta names (a connection with OpenAI-Beta: realtime=v1) mapped onto the GA ones
  "response.audio.delta": "response.output_audio.delta",
  "response.audio.done": "response.output_audio.done",
  "response.audio_transcript.delta": "response.output_audio_transcript.delta",
  "response.audio_transcript.done": "response.output_audio_transcript.done",
  "response.text.delta": "response.output_text.delta",
  "conversation.item.created": "conversation.item.added",
};

function onEvent(event) {
  const type = GA_NAMES[event.type] ?? event.type;
  eventCounts[type] = (eventCounts[type] ?? 0) + 1;
  recentEvents.push(type);
  recentEvents.splice(0, recentEvents.length - 50);
  switch (type) {
    case "session.created":
      updateSession();
      break;
    case "input_audio_buffer.speech_started":
      session.userSpeaking = true;
      if (session.playing || session.responseActive) bargeIn("speech");
      break;
    case "input_audio_buffer.speech_stopped":
      session.userSpeaking = false;
      session.awaiting = true;
      break;
    case "input_audio_buffer.committed":
      session.awaiting = true;
      break;
    case "conversation.item.added":
    case "conversation.item.done":
      onItem(event.item);
      break;
    case "response.function_call_arguments.delta":
      appendArguments(event.item_id, event.delta);
      break;
    case "response.function_call_arguments.done":
      onItem({ type: "function_call", id: event.item_id, name: event.name, arguments: event.arguments });
      break;
    case "conversation.item.deleted":
      dropItem(event.item_id);
      break;
    case "conversation.item.input_audio_transcription.completed":
      setText(event.item_id, "user", event.transcript);
      break;
    case "response.created":
      session.response = { id: event.response?.id, itemId: null, audioStart: null, received: 0, cut: false };
      session.responseActive = true;
      session.awaiting = true;
      break;
    case "response.output_text.delta":
    case "response.output_audio_transcript.delta":
      if (!session.response?.cut) appendText(event.item_id, event.delta);
      break;
    case "response.output_audio_transcript.done":
      if (!session.response?.cut && event.transcript != null) setText(event.item_id, "assistant", event.transcript);
      break;
    case "response.output_audio.delta":
      onAudio(event);
      break;
    case "response.output_audio.done":
      audio.end();
      break;
    case "response.done":
      onResponseDone(event.response ?? {});
      break;
    case "conversation.item.truncated":
      markItem(event.item_id, "truncated");
      break;
    case "error":
      onServerError(event.error ?? {});
      break;
  }
  render();
}

function onItem(item) {
  const card = callCard(item);
  if (card && item.id) {
    showCard(item.id, card);
    if (item.status === "incomplete") markItem(item.id, "incomplete");
    return;
  }
  if (!item?.id || (item.role !== "user" && item.role !== "assistant")) return;
  let text = "";
  for (const part of item.content ?? []) {
    if (part.type === "input_text" || part.type === "text" || part.type === "output_text") text += part.text ?? "";
    else if (part.transcript) text += part.transcript;
    else if (part.type === "input_audio") text += "[spoken]";
    else if (part.type === "input_image") text += " [image]";
  }
  const entry = transcript.get(item.id);
  if (!entry || (text && !(item.role === "assistant" && entry.text))) setText(item.id, item.role, text);
}

function onAudio(event) {
  const response = session.response;
  if (!response || response.cut) return; // a cut answer's audio still in flight: not to be heard
  const pcm = fromBase64(event.delta);
  if (response.audioStart === null) {
    response.audioStart = audio.pushed;
    response.itemId = event.item_id;
  }
  response.received += pcm.byteLength / 2;
  stats.samplesReceived += pcm.byteLength / 2;
  audio.push(pcm);
}

function onResponseDone(response) {
  session.responseActive = false;
  const status = response.status ?? "completed";
  const current = session.response;
  // With audio to play out, the turn ends when the player drains; without, it ends now.
  if (current && !current.cut && current.audioStart !== null) audio.end();
  else session.awaiting = false;
  if (status !== "completed" && current?.itemId) markItem(current.itemId, status);
  session.turns += 1;
  addMetrics(session.turns, status, response.omnistream ?? {});
}

function onServerError(error) {
  // Stopping an answer that had just ended is a harmless race, not something to show.
  if (error.code === "response_cancel_not_active") return;
  serverErrors.push({ ...error, after: recentEvents.slice(-8, -1), mode: session.mode });
  serverErrors.splice(0, serverErrors.length - 20);
  const code = error.code ? ` (${error.code})` : "";
  showError(`${error.message ?? "error"}${code}`);
  console.warn("realtime error event", error);
}

// ---- the player -------------------------------------------------------------------------------

function onPlayer(message) {
  stats.samplesPlayed = message.played;
  if (message.type === "flushed") stats.lastFlush = message;
  else if (session.response?.cut && stats.lastFlush) {
    stats.cutPlayed += Math.max(0, message.played - stats.lastFlush.played);
    stats.lastFlush = { ...stats.lastFlush, played: message.played };
  }
  switch (message.type) {
    case "started":
      session.playing = true;
      break;
    case "drained":
      session.playing = false;
      if (!session.responseActive) session.awaiting = false;
      break;
    case "underrun":
      // more audio is coming: still speaking, only a gap
      break;
    case "flushed":
      session.playing = false;
      break;
  }
  render();
}

/** Stop the answer at once: flush the player, cancel the response if needed, truncate the item to
 * what was heard. `reason` "speech": the server's VAD heard the user (it cancels by itself);
 * "user": the stop button, Escape or push-to-talk. */
async function bargeIn(reason) {
  const response = session.response;
  const wasActive = session.responseActive;
  stats.lastFlush = null; // cutPlayed counts from this flush's report on
  if (response) response.cut = true;
  if (reason === "user" && wasActive) session.connection?.send({ type: "response.cancel" });
  const flushed = await audio.flush();
  stats.flushes += 1;
  if (flushed.wasPlaying || flushed.discarded > 0) stats.bargeIns += 1;
  session.playing = false;
  if (reason === "user") session.awaiting = false;
  if (response?.itemId && response.audioStart !== null && (flushed.discarded > 0 || wasActive)) {
    const heard = Math.min(Math.max(0, flushed.played - response.audioStart), response.received);
    session.connection?.send({
      type: "conversation.item.truncate",
      item_id: response.itemId,
      content_index: 0,
      audio_end_ms: Math.floor((heard * 1000) / RATE),
    });
  }
  render();
}

// ---- the microphone ---------------------------------------------------------------------------

function onMicPiece(pcm, peak) {
  ui.level.style.width = `${Math.min(100, Math.round(Math.sqrt(peak) * 100))}%`;
  if (!connected()) return;
  if (session.mode === "vad" || session.pttHeld) {
    session.connection.send({ type: "input_audio_buffer.append", audio: toBase64(pcm) });
    stats.micPiecesSent += 1;
  }
}

function pttDown() {
  if (!connected() || session.mode !== "ptt" || session.pttHeld) return;
  if (session.playing || session.responseActive) bargeIn("user");
  session.connection.send({ type: "input_audio_buffer.clear" });
  session.pttHeld = true;
  render();
}

function pttUp() {
  if (!session.pttHeld) return;
  session.pttHeld = false;
  if (connected()) {
    session.connection.send({ type: "input_audio_buffer.commit" });
    session.connection.send({ type: "response.create" });
    session.awaiting = true;
  }
  render();
}

// ---- typed messages and attachments -----------------------------------------------------------

async function sendMessage() {
  if (!connected()) return;
  const text = ui.message.value.trim();
  const files = [...ui.attach.files];
  if (!text && files.length === 0) return;
  let parts;
  try {
    parts = await Promise.all(files.map(toContentPart));
  } catch (error) {
    showError(error.message);
    return;
  }
  if (text) parts.unshift({ type: "input_text", text });
  if (session.playing || session.responseActive) await bargeIn("user");
  clearError();
  session.connection.send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: parts },
  });
  session.connection.send({ type: "response.create" });
  session.awaiting = true;
  ui.message.value = "";
  ui.attach.value = "";
  ui.attachments.textContent = "";
  render();
}

// ---- transcript and metrics -------------------------------------------------------------------

function entryFor(itemId, role) {
  let entry = transcript.get(itemId);
  if (!entry) {
    const element = document.createElement("li");
    element.className = role;
    element.dataset.itemId = itemId;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Assistant";
    const body = document.createElement("span");
    body.className = "text";
    element.append(who, body);
    ui.transcript.append(element);
    entry = { role, element, who, body, text: "", status: null };
    transcript.set(itemId, entry);
  }
  return entry;
}

/** A function call (or its result) as a card: its name, and its arguments as they stream. */
function showCard(itemId, card) {
  const entry = entryFor(itemId, "call");
  entry.element.className = "call";
  entry.who.textContent = card.title;
  entry.body.replaceChildren(
    Object.assign(document.createElement("code"), { className: "call-name", textContent: card.name }),
    Object.assign(document.createElement("pre"), { className: "call-args", textContent: card.body }),
  );
  entry.text = card.plain;
  entry.args = entry.body.querySelector("pre");
  entry.raw = "";
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

function appendArguments(itemId, delta) {
  const entry = transcript.get(itemId);
  if (!entry?.args || !delta) return;
  entry.raw += delta;
  entry.args.textContent = argumentsText(entry.raw);
}

/** An item the gateway took out of the conversation (a call cut short, one dropped for the context). */
function dropItem(itemId) {
  const entry = transcript.get(itemId);
  if (!entry) return;
  entry.element.remove();
  transcript.delete(itemId);
}

function setText(itemId, role, text) {
  if (!itemId) return;
  const entry = entryFor(itemId, role);
  entry.text = text ?? "";
  entry.body.textContent = entry.text;
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

function appendText(itemId, delta) {
  if (!itemId || !delta) return;
  const entry = entryFor(itemId, "assistant");
  setText(itemId, entry.role, entry.text + delta);
}

function markItem(itemId, status) {
  const entry = transcript.get(itemId);
  if (!entry) return;
  entry.status = status;
  entry.element.dataset.status = status;
}

const STALL_CELL = 5; // turnCells' stall column: its tooltip and a mark when continuity was lost

function addMetrics(turn, status, omni) {
  const row = { turn, status, ...omni };
  metrics.unshift(row);
  metrics.splice(MAX_METRIC_ROWS);
  const tr = document.createElement("tr");
  const cells = turnCells(turn, status, omni);
  for (const [index, value] of cells.entries()) {
    const td = document.createElement("td");
    if (index === STALL_CELL) {
      td.textContent = value;
      td.title = stallTitle(omni);
      if (omni.continuity_ok === false) td.className = "stalled";
    } else if (Array.isArray(value)) {
      td.className = "replicas";
      for (const line of value) td.append(Object.assign(document.createElement("div"), { textContent: line }));
    } else {
      td.textContent = value;
    }
    tr.append(td);
  }
  ui.metrics.prepend(tr);
  while (ui.metrics.rows.length > MAX_METRIC_ROWS) ui.metrics.deleteRow(-1);
}

// ---- wiring -----------------------------------------------------------------------------------

ui.apiKey.value = sessionStorage.getItem(KEY_STORAGE) ?? "";
ui.connectForm.addEventListener("submit", (event) => {
  event.preventDefault();
  connect();
});
ui.disconnect.addEventListener("click", disconnect);
ui.voice.addEventListener("change", updateSession);
ui.instructions.addEventListener("change", updateSession);
ui.extra.addEventListener("change", updateSession);
for (const radio of document.querySelectorAll("input[name=mode]")) {
  radio.addEventListener("change", () => {
    session.mode = radio.value;
    session.pttHeld = false;
    if (connected()) session.connection.send({ type: "input_audio_buffer.clear" });
    updateSession();
    render();
  });
}
ui.talk.addEventListener("pointerdown", (event) => {
  ui.talk.setPointerCapture?.(event.pointerId);
  pttDown();
});
ui.talk.addEventListener("pointerup", pttUp);
ui.talk.addEventListener("pointercancel", pttUp);
ui.talk.addEventListener("keydown", (event) => {
  if ((event.key === " " || event.key === "Enter") && !event.repeat) {
    event.preventDefault();
    pttDown();
  }
});
ui.talk.addEventListener("keyup", (event) => {
  if (event.key === " " || event.key === "Enter") {
    event.preventDefault();
    pttUp();
  }
});
ui.talk.addEventListener("blur", pttUp);
ui.interrupt.addEventListener("click", () => bargeIn("user"));
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && (session.playing || session.responseActive)) bargeIn("user");
});
ui.messageForm.addEventListener("submit", (event) => {
  event.preventDefault();
  sendMessage();
});
ui.message.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    sendMessage();
  }
});
ui.attach.addEventListener("change", () => {
  ui.attachments.textContent = [...ui.attach.files].map((f) => f.name).join(", ");
});
render();
