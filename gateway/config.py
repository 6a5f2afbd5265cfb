"""Gateway configuration: flags or a YAML file (see deploy/gateway.example.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from omnistream.qwen3_omni.codec_chunks import DEFAULT_CHUNK_FRAMES, DEFAULT_LEFT_CONTEXT_FRAMES

# The real checkpoint's voices; a --model directory replaces them with its own config's.
DEFAULT_VOICES = ("chelsie", "ethan", "aiden")


@dataclass
class GatewayConfig:
    thinker: list[str] = field(default_factory=list)
    talker: list[str] = field(default_factory=list)
    code2wav: list[str] = field(default_factory=list)
    model_name: str = "qwen3-omni"
    model_dir: str | None = None  # optional: voices (and nothing else) are read from its config
    voices: tuple[str, ...] = DEFAULT_VOICES
    async_chunk: bool = True
    codec_chunk_frames: int = DEFAULT_CHUNK_FRAMES
    codec_left_context_frames: int = DEFAULT_LEFT_CONTEXT_FRAMES
    max_concurrency: int = 16
    max_queue: int = 0
    queue_timeout: float = 10.0
    request_timeout: float = 600.0
    max_tokens_limit: int = 4096
    default_max_tokens: int = 256
    max_audio_frames: int = 2048
    max_message_bytes: int = 16 * 1024 * 1024
    health_interval: float = 1.0
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 50051
    metrics_in_http: bool = True

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatewayConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        stages = data.pop("stages", {})
        for stage in ("thinker", "talker", "code2wav"):
            if stage in stages:
                data[stage] = list(stages[stage])
        if "voices" in data:
            data["voices"] = tuple(data["voices"])
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown gateway config keys: {sorted(unknown)}")
        return cls(**data)

    def resolve_voices(self) -> None:
        if self.model_dir:
            import json

            config = json.loads((Path(self.model_dir) / "config.json").read_text())
            speakers = config.get("talker_config", {}).get("speaker_id") or {}
            if speakers:
                self.voices = tuple(sorted(k.lower() for k in speakers))

    def validate(self) -> None:
        for stage in ("thinker", "talker", "code2wav"):
            if not getattr(self, stage):
                raise ValueError(f"no {stage} replica configured")
