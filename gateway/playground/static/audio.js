// The page's audio graph: microphone -> mic worklet (24 kHz pcm16 pieces) and player worklet ->
// speakers. One AudioContext at the device's own rate; both worklets convert to/from 24 kHz.

export const RATE = 24000;

export class AudioEngine {
  /** @param {{onMicPiece: (pcm: ArrayBuffer, peak: number) => void, onPlayer: (msg: object) => void}} hooks */
  constructor(hooks) {
    this.hooks = hooks;
    this.context = null;
    this.player = null;
    this.mic = null;
    this.stream = null;
    this.pushed = 0; // 24 kHz samples handed to the player, ever
    this.played = 0; // 24 kHz samples the player rendered, ever (its last report)
    this.waiters = [];
  }

  /** Create the context and the player. Must follow a user gesture (autoplay rules). */
  async start() {
    if (this.context) return;
    this.context = new AudioContext({ latencyHint: "interactive" });
    const base = new URL(".", import.meta.url);
    await this.context.audioWorklet.addModule(new URL("player-worklet.js", base));
    await this.context.audioWorklet.addModule(new URL("mic-worklet.js", base));
    this.player = new AudioWorkletNode(this.context, "player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { jitterMs: 80 },
    });
    this.player.port.onmessage = (event) => this.onPlayerMessage(event.data);
    this.player.connect(this.context.destination);
    if (this.context.state !== "running") await this.context.resume();
  }

  /** Open the microphone (asks for permission once). */
  async startMic() {
    if (this.mic) return;
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    const source = this.context.createMediaStreamSource(this.stream);
    this.mic = new AudioWorkletNode(this.context, "mic", { numberOfOutputs: 0 });
    this.mic.port.onmessage = (event) => this.hooks.onMicPiece(event.data.pcm, event.data.peak);
    source.connect(this.mic);
  }

  onPlayerMessage(message) {
    this.played = message.played;
    this.hooks.onPlayer(message);
    if (message.type === "flushed") {
      for (const resolve of this.waiters.splice(0)) resolve(message);
    }
  }

  /** @param {ArrayBuffer} pcm 24 kHz mono pcm16 */
  push(pcm) {
    this.pushed += pcm.byteLength / 2;
    this.player.port.postMessage({ type: "push", pcm }, [pcm]);
  }

  /** No more audio for this answer: play out what is buffered even if under the jitter buffer. */
  end() {
    this.player?.port.postMessage({ type: "end" });
  }

  /** Stop playback at once; resolves with the player's final count. */
  flush() {
    if (!this.player) return Promise.resolve({ played: 0, discarded: 0, wasPlaying: false });
    const done = new Promise((resolve) => this.waiters.push(resolve));
    this.player.port.postMessage({ type: "flush" });
    return done;
  }

  async close() {
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.stream = null;
    this.mic = null;
    this.player = null;
    const context = this.context;
    this.context = null;
    if (context) await context.close();
    for (const resolve of this.waiters.splice(0)) resolve({ played: this.played, discarded: 0 });
  }
}

/** Base64 of an ArrayBuffer (chunked: String.fromCharCode has an argument limit). */
export function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

/** The ArrayBuffer a base64 string encodes. */
export function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}
