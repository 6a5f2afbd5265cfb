#!/usr/bin/env node
// One request to the omnistream gateway (omni.v1.Gateway/Generate), from the .proto files as they
// are: text streams to stdout, the speech is written as a 32-bit float WAV, and the usage line goes
// to stderr.
//
//   node client.js --gateway 127.0.0.1:50051 --prompt "Hello" --out answer.wav [--seed 7]
//        [--max-tokens 24] [--max-audio-frames 40] [--initial-codec-chunk-frames 4]
//        [--temperature T] [--talker-temperature T] [--voice ethan] [--api-key KEY]
"use strict";

const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

function parseArgs(argv) {
  const args = { gateway: "127.0.0.1:50051", out: "answer.wav" };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    args[key] = argv[i + 1];
  }
  if (!args.prompt) throw new Error("--prompt is required");
  return args;
}

function loadGateway() {
  const protos = path.resolve(__dirname, "..", "..", "protos");
  const definition = protoLoader.loadSync(path.join(protos, "omni/v1/gateway.proto"), {
    includeDirs: [protos],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).omni.v1.Gateway;
}

// The same bytes as omnistream.audio.wav.float32_wav_bytes: IEEE float (format 3), mono, with a fact chunk.
function float32Wav(samples, sampleRate) {
  const data = Buffer.alloc(samples.length * 4);
  samples.forEach((v, i) => data.writeFloatLE(v, i * 4));
  const fmt = Buffer.alloc(16);
  fmt.writeUInt16LE(3, 0);
  fmt.writeUInt16LE(1, 2);
  fmt.writeUInt32LE(sampleRate, 4);
  fmt.writeUInt32LE(sampleRate * 4, 8);
  fmt.writeUInt16LE(4, 12);
  fmt.writeUInt16LE(32, 14);
  const u32 = (n) => { const b = Buffer.alloc(4); b.writeUInt32LE(n, 0); return b; };
  const body = Buffer.concat([
    Buffer.from("WAVE"), Buffer.from("fmt "), u32(fmt.length), fmt,
    Buffer.from("fact"), u32(4), u32(samples.length),
    Buffer.from("data"), u32(data.length), data,
  ]);
  return Buffer.concat([Buffer.from("RIFF"), u32(body.length), body]);
}

// The request table's defaults (README "Request defaults"): a set Sampling is taken as given, so a
// caller that names only a seed gets these for the rest, as REST and the Python client do.
const THINKER_DEFAULTS = { temperature: 1.0, top_p: 1.0, top_k: 0, repetition_penalty: 1.0 };
const TALKER_DEFAULTS = { temperature: 0.9, top_p: 1.0, top_k: 50, repetition_penalty: 1.05 };

function sampling(defaults, temperature, seed) {
  if (temperature === undefined && seed === undefined) return undefined;
  const msg = { ...defaults };
  if (temperature !== undefined) msg.temperature = Number(temperature);
  if (seed !== undefined) msg.seed = Number(seed);
  return msg;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const Gateway = loadGateway();
  const client = new Gateway(args.gateway, grpc.credentials.createInsecure());
  const request = {
    messages: [{ role: "user", content: args.prompt }],
    max_tokens: Number(args.maxTokens || 0),
    max_audio_frames: Number(args.maxAudioFrames || 0),
    speaker: args.voice || "",
  };
  const thinker = sampling(THINKER_DEFAULTS, args.temperature, args.seed);
  if (thinker) request.sampling = thinker;
  const talker = sampling(TALKER_DEFAULTS, args.talkerTemperature, args.seed);
  if (talker) request.talker_sampling = talker;
  if (args.initialCodecChunkFrames) request.initial_codec_chunk_frames = Number(args.initialCodecChunkFrames);
  const metadata = new grpc.Metadata();
  if (args.apiKey) metadata.set("authorization", `Bearer ${args.apiKey}`);

  const samples = [];
  let sampleRate = 24000;
  const call = client.Generate(request, metadata);
  call.on("data", (event) => {
    if (event.text) process.stdout.write(event.text.text);
    if (event.audio) {
      const t = event.audio.pcm;
      if (t.dtype !== "float32") throw new Error(`unexpected audio dtype ${t.dtype}`);
      const buf = Buffer.from(t.data);
      for (let i = 0; i < buf.length; i += 4) samples.push(buf.readFloatLE(i));
      sampleRate = event.audio.sample_rate;
    }
    if (event.usage) process.stderr.write(`usage ${JSON.stringify(event.usage)}\n`);
  });
  call.on("error", (err) => {
    process.stderr.write(`error: ${err.code} ${err.details}\n`);
    process.exitCode = 1;
  });
  call.on("end", () => {
    process.stdout.write("\n");
    fs.writeFileSync(args.out, float32Wav(samples, sampleRate));
    process.stderr.write(`${samples.length} samples at ${sampleRate} Hz -> ${args.out}\n`);
    client.close();
  });
}

main();
