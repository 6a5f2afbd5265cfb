// Microphone capture: the AudioContext's rate resampled to 24 kHz mono pcm16, posted in 20 ms
// pieces (480 samples), the unit the page sends as input_audio_buffer.append.
//
// Resampling is linear interpolation after a short box filter when downsampling: enough for
// speech going to a voice activity detector and a speech model, with no library.

const TARGET_RATE = 24000;
const PIECE = 480; // 20 ms at 24 kHz

class MicProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / TARGET_RATE; // input samples per output sample
    this.taps = Math.max(1, Math.round(this.step));
    this.history = new Float32Array(this.taps + 2);
    this.pos = 0; // position of the next output sample in the current block, in input samples
    this.piece = new Int16Array(PIECE);
    this.filled = 0;
    this.prev = 0;
  }

  emit(sample) {
    const clipped = Math.max(-1, Math.min(1, sample));
    this.piece[this.filled++] = clipped < 0 ? clipped * 32768 : clipped * 32767;
    if (this.filled === PIECE) {
      let peak = 0;
      for (let i = 0; i < PIECE; i++) peak = Math.max(peak, Math.abs(this.piece[i]));
      this.port.postMessage({ pcm: this.piece.buffer, peak: peak / 32768 }, [this.piece.buffer]);
      this.piece = new Int16Array(PIECE);
      this.filled = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const n = input[0].length;
    // mono: the mean of the channels, then a box filter of `taps` samples against aliasing
    const mono = new Float32Array(n);
    for (const channel of input) for (let i = 0; i < n; i++) mono[i] += channel[i] / input.length;
    const smooth = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      this.history.copyWithin(0, 1);
      this.history[this.history.length - 1] = mono[i];
      let sum = 0;
      for (let k = 0; k < this.taps; k++) sum += this.history[this.history.length - 1 - k];
      smooth[i] = sum / this.taps;
    }
    // linear interpolation; a position between this block's last sample and the next block's first
    // waits for the next block (it is then at index -1, the remembered `prev`)
    while (this.pos < n - 1) {
      const index = Math.floor(this.pos);
      const frac = this.pos - index;
      const a = index < 0 ? this.prev : smooth[index];
      const b = smooth[index + 1];
      this.emit(a + (b - a) * frac);
      this.pos += this.step;
    }
    this.pos -= n;
    this.prev = smooth[n - 1];
    return true;
  }
}

registerProcessor("mic", MicProcessor);
