// OpenAI's Agents SDK for JavaScript (@openai/agents-realtime), unmodified and with its default
// settings, against an omnistream gateway: what tests/integration/test_framework_agents_realtime_node.py
// asserts on. Only the URL and the API key are given (and `toolChoice: "required"` in the tool mode:
// a random checkpoint never picks a tool on `auto`).
//
//   node realtime_agent.mjs --url ws://127.0.0.1:PORT/v1/realtime --key KEY --mode spoken|tool \
//       --audio speech.pcm [--timeout-ms 120000]
//
// --audio: the user's utterance, raw pcm16 24 kHz mono (the SDK's default input format), sent as a
// microphone sends it: 20 ms `sendAudio` appends paced at real time; the SDK's default turn detection
// (semantic_vad) ends the turn. One JSON line per observation on stdout:
//   {"kind": "agent", "instructions", "tools"} the agent as configured (tools: name and JSON schema)
//   {"kind": "server_event", "event": {...}}  every raw server event, as received (the transport's `*`
//                                            event, which the session re-emits as `transport_event`)
//   {"kind": "unparsed", "type", "issues"}   a server event the SDK's own event schema rejects (the SDK
//                                            then drops it silently as a "generic" event)
//   {"kind": "error", "error"}               the session's `error` event
//   {"kind": "log", "level", "message"}      what the SDK logged with console.error / console.warn
//   {"kind": "fetch", "url"}                 an HTTP request the process tried (none may leave the machine)
//   {"kind": "tool_start"|"tool_end", ...}   the tool run by the SDK, and the result it sent back
//   {"kind": "audio", "bytes"}               the audio the session played (its `audio` event), in total
//   {"kind": "history", "history": [...]}    the session's history at the end
//   {"kind": "timeout", "phase"}             a phase that did not finish in --timeout-ms
//   {"kind": "done"}                         the run finished
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';

import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { z } from 'zod';

// The SDK's own server-event schema (the one its transport parses every event with). The package's
// exports do not list it, so it is imported by its file: the same module the SDK runs.
import { realtimeServerEventSchema } from './node_modules/@openai/agents-realtime/dist/openaiRealtimeEvents.mjs';

const { values: args } = parseArgs({
  options: {
    url: { type: 'string' },
    key: { type: 'string' },
    mode: { type: 'string', default: 'spoken' },
    audio: { type: 'string' },
    'timeout-ms': { type: 'string', default: '120000' },
  },
});
const TIMEOUT_MS = Number(args['timeout-ms']);
// How long after the answer the user's transcript may take: the thinker transcribes as background
// work, after the answers it runs.
const TRANSCRIPT_MS = 30_000;

function emit(observation) {
  process.stdout.write(`${JSON.stringify(observation)}\n`);
}

// What the SDK logs (its logger's error and warn are console.error / console.warn): observed, not hidden.
for (const level of ['error', 'warn']) {
  const original = console[level].bind(console);
  console[level] = (...parts) => {
    const message = parts
      .map((p) => (p instanceof Error ? `${p.name}: ${p.message}` : typeof p === 'string' ? p : JSON.stringify(p)))
      .join(' ');
    emit({ kind: 'log', level, message });
    original(...parts);
  };
}

// Nothing may reach off the machine: any HTTP request (fetch) is recorded, and refused.
globalThis.fetch = (input) => {
  emit({ kind: 'fetch', url: String(input?.url ?? input) });
  return Promise.reject(new Error('no network in this test'));
};

const seen = []; // raw server events, in order
const waiters = [];

function onServerEvent(raw) {
  seen.push(raw);
  emit({ kind: 'server_event', event: raw });
  const parsed = realtimeServerEventSchema.safeParse(raw);
  if (!parsed.success) {
    emit({ kind: 'unparsed', type: raw?.type, issues: parsed.error.issues });
  }
  for (const waiter of [...waiters]) {
    if (waiter.predicate(raw)) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve(raw);
    }
  }
}

/** The first server event from index `from` on that satisfies `predicate` (one already seen counts). */
function until(phase, predicate, from = 0, timeoutMs = TIMEOUT_MS) {
  const found = seen.slice(from).find(predicate);
  if (found) return Promise.resolve(found);
  return new Promise((resolve, reject) => {
    const waiter = { predicate, resolve };
    waiters.push(waiter);
    setTimeout(() => {
      const i = waiters.indexOf(waiter);
      if (i >= 0) {
        waiters.splice(i, 1);
        reject(Object.assign(new Error(`timeout: ${phase}`), { phase }));
      }
    }, timeoutMs).unref();
  });
}

/** The utterance in 20 ms appends at real time, as a microphone delivers it. */
async function speak(session, pcm) {
  const piece = 24000 * 2 * 0.02; // 20 ms of pcm16 at 24 kHz: 960 bytes
  const start = performance.now();
  for (let i = 0, n = 0; i < pcm.length; i += piece, n += 1) {
    const chunk = pcm.subarray(i, i + piece);
    session.sendAudio(chunk.buffer.slice(chunk.byteOffset, chunk.byteOffset + chunk.byteLength));
    const delay = start + (n + 1) * 20 - performance.now();
    if (delay > 0) await sleep(delay);
  }
}

const getWeather = tool({
  name: 'get_weather',
  description: "Today's weather in a city.",
  parameters: z.object({ city: z.enum(['Paris', 'Rome', 'Oslo']) }),
  execute: async ({ city }) => `It is sunny in ${city}.`,
});

const agent = new RealtimeAgent({
  name: 'Assistant',
  instructions: 'You are a helpful voice assistant. Answer briefly.',
  tools: [getWeather],
});

// The SDK's defaults but for `tracingDisabled`: the brief's "telemetry off" (with
// OPENAI_AGENTS_DISABLE_TRACING=1 in the environment for the client side). It sends `tracing: null`
// where the default sends `tracing: "auto"`; neither is applied by omnistream.
const options = { tracingDisabled: true };
if (args.mode === 'tool') {
  // The one setting the tool mode adds: a random checkpoint never picks a tool on `auto`.
  options.config = { toolChoice: 'required' };
}
const session = new RealtimeSession(agent, options);

let audioBytes = 0;
session.on('transport_event', onServerEvent);
/** An error as JSON: a server `error` event as it came, an Error (or a socket's ErrorEvent) by its message. */
function describe(error) {
  if (error instanceof Error) return { name: error.name, message: error.message };
  if (error && typeof error === 'object' && 'type' in error && 'error' in error && !(error.error instanceof Error)) {
    return error; // the server's error event
  }
  if (error && typeof error === 'object' && 'message' in error) return { message: String(error.message) };
  if (error && typeof error === 'object' && error.error instanceof Error) return describe(error.error);
  return { message: String(error) };
}
session.on('error', (event) => emit({ kind: 'error', error: describe(event?.error) }));
session.on('audio', (event) => {
  audioBytes += event.data.byteLength;
});
session.on('agent_tool_start', (_context, _agent, usedTool, details) => {
  emit({ kind: 'tool_start', name: usedTool.name, arguments: details?.toolCall?.arguments });
});
session.on('agent_tool_end', (_context, _agent, usedTool, result, details) => {
  emit({ kind: 'tool_end', name: usedTool.name, result, call_id: details?.toolCall?.callId });
});

const isType = (type) => (e) => e?.type === type;

async function spokenTurn(pcm) {
  const from = seen.length;
  const speaking = speak(session, pcm);
  const created = await until('response.created', isType('response.created'), from);
  const done = await until(
    'response.done',
    (e) => e.type === 'response.done' && e.response?.id === created.response.id,
    from,
  );
  await speaking;
  // The user's transcript reaches the history through `...input_audio_transcription.completed`, after
  // which the SDK retrieves the item (`conversation.item.retrieve`) and takes the item it gets back.
  const user = seen.find((e) => e.type === 'conversation.item.added' && e.item?.role === 'user');
  if (user) {
    try {
      const ended = await until(
        'input_audio_transcription',
        (e) =>
          (e.type === 'conversation.item.input_audio_transcription.completed' ||
            e.type === 'conversation.item.input_audio_transcription.failed') &&
          e.item_id === user.item.id,
        from,
        TRANSCRIPT_MS,
      );
      // The SDK sends its retrieve only for a `completed` event its schema takes.
      if (ended.type.endsWith('.completed') && realtimeServerEventSchema.safeParse(ended).success) {
        await until(
          'conversation.item.retrieved',
          (e) => e.type === 'conversation.item.retrieved' && e.item?.id === user.item.id,
          from,
          TRANSCRIPT_MS,
        );
      }
    } catch {
      // Reported by the history below: the test asserts on it.
    }
  }
  return done;
}

async function toolRoundTrip(pcm) {
  const from = seen.length;
  const speaking = speak(session, pcm);
  const toolEnded = new Promise((resolve, reject) => {
    session.once('agent_tool_end', resolve);
    setTimeout(() => reject(Object.assign(new Error('timeout: tool run'), { phase: 'tool run' })), TIMEOUT_MS).unref();
  });
  const call = await until(
    'function call',
    (e) => e.type === 'response.output_item.done' && e.item?.type === 'function_call',
    from,
  );
  await toolEnded;
  const output = await until(
    'function_call_output',
    (e) =>
      e.type === 'conversation.item.added' &&
      e.item?.type === 'function_call_output' &&
      e.item?.call_id === call.item.call_id,
    from,
  );
  const after = seen.indexOf(output);
  // The response the SDK asked for with the result: with `required` still set it may call the tool
  // again (OpenAI's semantics); the run stops once it is done.
  const next = await until('response.created after the result', isType('response.created'), after);
  await until(
    'response.done after the result',
    (e) => e.type === 'response.done' && e.response?.id === next.response.id,
    after,
  );
  await speaking;
}

emit({
  kind: 'agent',
  instructions: agent.instructions,
  tools: [{ name: getWeather.name, parameters: getWeather.parameters }],
});
try {
  const pcm = readFileSync(args.audio);
  await session.connect({ apiKey: args.key, url: args.url });
  // The agent's session.update applied (instructions and tools), before the user speaks.
  await until('session.updated', (e) => e.type === 'session.updated' && e.session?.instructions === agent.instructions);
  if (args.mode === 'tool') {
    await toolRoundTrip(pcm);
  } else {
    await spokenTurn(pcm);
  }
} catch (error) {
  if (error?.phase) {
    emit({ kind: 'timeout', phase: error.phase });
  } else {
    emit({ kind: 'error', error: describe(error) });
  }
} finally {
  emit({ kind: 'audio', bytes: audioBytes });
  emit({ kind: 'history', history: session.history });
  session.close();
  emit({ kind: 'done' });
  // Exit once stdout is flushed: the socket is closed, nothing else should hold the loop, but a
  // pending SDK timer must not keep the test waiting.
  process.stdout.write('', () => process.exit(0));
}
