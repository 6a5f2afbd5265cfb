// Attachments: an image becomes an `input_image` part (a data URL), an audio file an `input_audio`
// part (decoded by the browser, mixed to mono and resampled to 24 kHz pcm16, base64).

import { RATE, toBase64 } from "./audio.js";

/** @param {File} file @returns {Promise<object>} a conversation item content part */
export async function toContentPart(file) {
  if (file.type.startsWith("image/")) {
    return { type: "input_image", image_url: await dataUrl(file) };
  }
  if (file.type.startsWith("audio/") || /\.(wav|mp3|ogg|flac|m4a|webm)$/i.test(file.name)) {
    return { type: "input_audio", audio: toBase64(await pcm16At24k(file)) };
  }
  throw new Error(`${file.name}: not an image or an audio file`);
}

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`${file.name}: could not be read`));
    reader.readAsDataURL(file);
  });
}

async function pcm16At24k(file) {
  const bytes = await file.arrayBuffer();
  const probe = new OfflineAudioContext(1, 1, RATE);
  let decoded;
  try {
    decoded = await probe.decodeAudioData(bytes);
  } catch {
    throw new Error(`${file.name}: this browser cannot decode it`);
  }
  const length = Math.max(1, Math.ceil(decoded.duration * RATE));
  const offline = new OfflineAudioContext(1, length, RATE); // mixes down and resamples
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = (await offline.startRendering()).getChannelData(0);
  const pcm = new Int16Array(rendered.length);
  for (let i = 0; i < rendered.length; i++) {
    const s = Math.max(-1, Math.min(1, rendered[i]));
    pcm[i] = s < 0 ? s * 32768 : s * 32767;
  }
  return pcm.buffer;
}
