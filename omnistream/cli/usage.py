"""What `omnistream up` prints once the stack serves: where to point a browser, a chat, curl and the
openai SDK."""

from __future__ import annotations

import json


def usage_text(host: str, http_port: int, grpc_port: int) -> str:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"},
            "stream": True,
            "max_tokens": 32,
        }
    )
    return f"""
omnistream is serving: REST http://{host}:{http_port}  gRPC {host}:{grpc_port}

  Playground: http://{host}:{http_port}/   (open it in a browser: talk, type, attach, listen)

  omnistream chat --gateway {host}:{grpc_port}        (type a line, hear it in answer-1.wav)

  curl -N http://{host}:{http_port}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{body}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="http://{host}:{http_port}/v1", api_key="none")
stream = client.chat.completions.create(model="qwen3-omni", messages=[{{"role": "user", "content": "Hello"}}],
    modalities=["text", "audio"], audio={{"voice": "ethan", "format": "pcm16"}}, stream=True, max_tokens=32)
for chunk in stream:
    delta = chunk.choices[0].delta if chunk.choices else None
    if delta and delta.audio and delta.audio.transcript:  # with audio, the text is its transcript
        print(delta.audio.transcript, end="", flush=True)
PY

Metrics: http://{host}:{http_port}/metrics   Ready: http://{host}:{http_port}/ready   Ctrl-C stops everything.
"""
