"""OpenAI's REST/SSE API: one module per endpoint with its router (`chat`, `speech`, `models`),
and what they share: request guards, message content, the error table, SSE encoding, audio files,
OpenAI's voice names (`voices`, which `/v1/realtime` uses too)."""
