// The answer's player: a ring buffer of 24 kHz samples, read out at the AudioContext's rate.
//
// Why a worklet and not <audio>/AudioBufferSourceNodes: deltas arrive in small irregular pieces;
// one ring buffer plays them gap-free, and `flush` stops the sound within one render quantum
// (barge-in). Playback starts once a small jitter buffer is filled (or the answer has ended), and
// re-primes after an underrun. It counts the 24 kHz samples it actually rendered, which is what the
// page reports as "played" and what it truncates the assistant's item to.

const SOURCE_RATE = 24000;
const CAPACITY = 1 << 21; // ~87 s at 24 kHz: an answer arrives faster than real time

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const jitterMs = options?.processorOptions?.jitterMs ?? 80;
    this.jitter = Math.round((SOURCE_RATE * jitterMs) / 1000);
    this.ring = new Float32Array(CAPACITY);
    this.write = 0; // samples ever written (monotonic)
    this.read = 0; // fractional read position, in samples ever written
    this.ended = false; // the current answer has no more audio coming
    this.playing = false; // rendering from the ring now
    this.active = false; // inside an answer: from its start until drained or flushed (underruns too)
    this.played = 0; // whole 24 kHz samples rendered, ever
    this.dropped = 0; // samples refused because the ring was full
    this.step = SOURCE_RATE / sampleRate;
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(message) {
    switch (message.type) {
      case "push": {
        const pcm = new Int16Array(message.pcm);
        const room = CAPACITY - (this.write - Math.floor(this.read));
        const n = Math.min(pcm.length, room);
        for (let i = 0; i < n; i++) this.ring[(this.write + i) % CAPACITY] = pcm[i] / 32768;
        this.write += n;
        this.dropped += pcm.length - n;
        this.ended = false;
        break;
      }
      case "end":
        this.ended = true;
        if (!this.playing && this.buffered() === 0) {
          this.active = false;
          this.port.postMessage({ type: "drained", played: this.played });
        }
        break;
      case "flush": {
        // Barge-in: forget everything not yet rendered, at once.
        const had = this.write - Math.floor(this.read);
        this.read = this.write;
        this.ended = false;
        const wasPlaying = this.active;
        this.playing = false;
        this.active = false;
        this.port.postMessage({ type: "flushed", played: this.played, discarded: had, wasPlaying });
        break;
      }
    }
  }

  buffered() {
    return this.write - Math.floor(this.read);
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const channel = out[0];
    if (!this.playing && this.buffered() > 0 && (this.buffered() >= this.jitter || this.ended)) {
      this.playing = true;
      this.active = true;
      this.port.postMessage({ type: "started", played: this.played });
    }
    if (this.playing) {
      for (let i = 0; i < channel.length; i++) {
        const index = Math.floor(this.read);
        if (index >= this.write) {
          channel.fill(0, i);
          break;
        }
        const a = this.ring[index % CAPACITY];
        const b = index + 1 < this.write ? this.ring[(index + 1) % CAPACITY] : a;
        const frac = this.read - index;
        channel[i] = a + (b - a) * frac;
        this.read += this.step;
      }
      const before = this.played;
      this.played = Math.min(Math.floor(this.read), this.write);
      if (this.played >= this.write) {
        this.read = this.write;
        this.playing = false;
        if (this.ended) this.active = false;
        this.port.postMessage({ type: this.ended ? "drained" : "underrun", played: this.played });
      }
      this.sinceReport += this.played - before;
    } else {
      channel.fill(0);
    }
    for (let c = 1; c < out.length; c++) out[c].set(channel);
    if (this.sinceReport >= SOURCE_RATE / 20) {
      this.sinceReport = 0;
      this.port.postMessage({ type: "progress", played: this.played, buffered: this.buffered() });
    }
    return true;
  }
}

registerProcessor("player", PlayerProcessor);
