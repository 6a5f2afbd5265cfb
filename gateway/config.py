"""Gateway configuration: flags or a YAML file (see deploy/gateway.example.yaml).

Nothing here describes the model: its name, voices and sample rate come from the stages' Info
(`gateway.deployment`), so the gateway cannot disagree with what it routes to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gateway.admission.audio_capacity import (
    DEFAULT_MARGIN,
    DEFAULT_START_JITTER_PER_STREAM_S,
    DEFAULT_START_JITTER_S,
)
from gateway.media.limits import MediaLimits
from omnistream.request.defaults import DEFAULTS

API_KEY_ENV = "OMNISTREAM_API_KEY"

# Room in one stage message for everything but the prompt text (ids, sampling, framing). A request's
# text reaches the thinker in one gRPC message, so the size limits below must leave this much free.
STAGE_MESSAGE_HEADROOM = 64 * 1024
# The most bytes one prompt unit takes in that message: a character is at most 4 bytes of UTF-8, a
# token id of `prompt_ids` at most 5 bytes of varint.
BYTES_PER_PROMPT_UNIT = 5
# A REST body carries media as base64: 4 characters for every 3 bytes.
BASE64_RATIO = 4 / 3
_MEDIA = MediaLimits()  # the media defaults, reasons in gateway/media_limits.py and README


@dataclass
class GatewayConfig:
    thinker: list[str] = field(default_factory=list)
    talker: list[str] = field(default_factory=list)
    code2wav: list[str] = field(default_factory=list)
    # What a request gets when it does not say (omnistream/request/defaults.py, README's table).
    async_chunk: bool = DEFAULTS.async_chunk
    codec_chunk_frames: int = DEFAULTS.codec_chunk_frames
    codec_left_context_frames: int = DEFAULTS.codec_left_context_frames
    max_concurrency: int = 16
    max_queue: int = 0
    queue_timeout: float = 10.0
    # Audio hold (README "Admission"): an audio request waits (up to queue_timeout) while the talker
    # and code2wav, at the speed they measure, could not keep one more stream plus the ones playing
    # real time with `audio_hold_margin` to spare; at most `audio_hold_queue` wait (None: as many as
    # max_concurrency; 0: refuse at once instead of holding). Off: admitted as before, whatever the
    # speed. Text-only requests are never held.
    audio_hold: bool = True
    audio_hold_margin: float = DEFAULT_MARGIN
    audio_hold_queue: int | None = None
    # Start guard (part of the audio hold, admission.py): while a stream whose first chunk is
    # shorter than this many seconds has less than this in hand, new audio requests wait, then start
    # together; 0 turns it off.
    audio_start_guard: float = 1.0
    # First-chunk sizing (audio_capacity.py): a starting stream's later windows are predicted this
    # many seconds later than its measured speed says (jitter of a shared machine); 0: speed alone.
    audio_start_jitter: float = DEFAULT_START_JITTER_S
    # ... and this many seconds more for each other audio stream (their work shares the cores: at
    # 16 streams at once a starting stream's windows came ~0.25 s late, at 1 ~0.1 s).
    audio_start_jitter_per_stream: float = DEFAULT_START_JITTER_PER_STREAM_S
    request_timeout: float = 600.0
    max_tokens_limit: int = 4096
    default_max_tokens: int = DEFAULTS.max_tokens
    max_audio_frames: int = DEFAULTS.max_audio_frames  # the default and the limit
    max_message_bytes: int = 16 * 1024 * 1024
    # A larger REST body gets 413 before it is parsed. 8 MiB holds a full `max_prompt_chars` prompt
    # even when a client escapes every character as \uXXXX (6 bytes, json.dumps' default), and
    # stays far under the stage message limit.
    max_request_bytes: int = 8 * 1024 * 1024
    # A prompt with more characters of message text (or more prompt_ids) gets 413, on REST and gRPC.
    # A million characters are hundreds of thousands of tokens, past any Qwen3-Omni context, so only
    # prompts that could never run are refused; it bounds the thinker's tokenizing work, and at 5
    # bytes a unit such a prompt always fits one stage message.
    max_prompt_chars: int = 1_000_000
    # Media (README "Audio, images and video"). Encoded bytes of all media of one request: 5 MiB is
    # 6.7 MiB of base64, inside the 8 MiB REST body with room for text.
    max_media_bytes: int = _MEDIA.max_media_bytes
    # Decoded media of one request travel to the thinker in one stage message beside the text: this
    # budget plus the prompt must fit max_message_bytes (checked here, and per request at run time).
    max_decoded_media_bytes: int = _MEDIA.max_decoded_bytes
    max_audio_seconds: float = _MEDIA.max_audio_seconds  # per request, a video's sound included
    max_image_input_pixels: int = _MEDIA.max_image_input_pixels  # per image (or video frame), as sent
    image_max_pixels: int = _MEDIA.image_max_pixels  # per image after resizing (1280 visual tokens)
    max_video_seconds: float = _MEDIA.max_video_seconds  # per video; longer ones get 413
    max_video_frames: int = _MEDIA.max_video_frames  # frames sampled per video (longer: sparser)
    video_fps: float = _MEDIA.video_fps  # frames sampled per second of video (the reference's 2.0)
    video_total_pixels: int = _MEDIA.video_total_pixels  # the reference's total_pixels of a video
    vision_factor: int = _MEDIA.vision_factor  # patch_size x spatial_merge_size of the model
    media_decode_timeout: float = _MEDIA.decode_timeout  # seconds for one request's decode
    media_decode_workers: int = _MEDIA.decode_workers  # decoding threads (and requests at once)
    # http(s):// or file:// prefixes media URLs may start with; empty: data: URLs only.
    media_url_prefixes: list[str] = field(default_factory=list)
    media_url_timeout: float = _MEDIA.url_timeout
    health_interval: float = 1.0
    # Stage entries that are DNS names ("dns:///talker:50051", "talker:50051") are resolved this
    # often; every address found is a replica (a headless Service lists one per ready pod).
    discovery_interval: float = 5.0
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 50051
    metrics_in_http: bool = True
    # TLS on the public ports (REST and gRPC); with tls_client_ca clients need a certificate (mTLS).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # TLS from the gateway to the stages: the CA that signed their certificates, and this gateway's
    # client certificate when the stages require one. stage_tls_server_name: the name the stages'
    # certificates carry when it is neither the dialled IP nor the DNS name of the entry.
    stage_tls_ca: str | None = None
    stage_tls_cert: str | None = None
    stage_tls_key: str | None = None
    stage_tls_server_name: str | None = None
    # Bearer API key for /v1/* and the gRPC Gateway service (default: $OMNISTREAM_API_KEY).
    api_key: str | None = field(default=None, repr=False)
    # /v1/realtime (README "Realtime voice"): open WebSocket sessions at most (each response also
    # takes an admission slot while it runs); a session with no client event and no response for
    # `realtime_idle_timeout` seconds is closed; the uncommitted input buffer holds at most
    # `realtime_max_buffer_seconds` of audio, and appends may run ahead of real time by at most
    # `realtime_append_burst_seconds`; `realtime_max_history_items` conversation items (user audio
    # within `realtime_history_audio_seconds`) are kept for the next turns.
    realtime_max_sessions: int = 16
    realtime_idle_timeout: float = 300.0
    realtime_max_buffer_seconds: float = 60.0
    realtime_append_burst_seconds: float = 10.0
    realtime_max_history_items: int = 16
    realtime_history_audio_seconds: float = 120.0

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatewayConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        stages = data.pop("stages", {})
        for stage in ("thinker", "talker", "code2wav"):
            if stage in stages:
                data[stage] = list(stages[stage])
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown gateway config keys: {sorted(unknown)}")
        return cls(**data)

    def resolve_api_key(self) -> None:
        if not self.api_key:
            self.api_key = os.environ.get(API_KEY_ENV) or None

    def validate(self) -> None:
        # Thinkers alone are a deployment (text chat; audio requests get 503, readiness.py); a
        # talker without a code2wav, or the reverse, would serve nothing more, so it is a mistake.
        if not self.thinker:
            raise ValueError("no thinker replica configured")
        if bool(self.talker) != bool(self.code2wav):
            missing = "code2wav" if self.talker else "talker"
            raise ValueError(f"no {missing} replica configured (audio needs talker and code2wav)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key")
        if bool(self.stage_tls_cert) != bool(self.stage_tls_key):
            raise ValueError("stage_tls_cert and stage_tls_key go together")
        if self.audio_hold_margin < 0:
            raise ValueError("audio_hold_margin must be at least 0")
        if self.audio_start_guard < 0:
            raise ValueError("audio_start_guard must be at least 0")
        if not 0 <= self.audio_start_jitter <= 10:
            raise ValueError("audio_start_jitter must be in [0, 10] seconds")
        if not 0 <= self.audio_start_jitter_per_stream <= 1:
            raise ValueError("audio_start_jitter_per_stream must be in [0, 1] seconds")
        if self.audio_hold_queue is not None and self.audio_hold_queue < 0:
            raise ValueError("audio_hold_queue must be at least 0")
        if self.discovery_interval <= 0:
            raise ValueError("discovery_interval must be positive")
        if self.realtime_max_sessions < 0:
            raise ValueError("realtime_max_sessions must be at least 0 (0: no realtime sessions)")
        for name in (
            "realtime_idle_timeout",
            "realtime_max_buffer_seconds",
            "realtime_append_burst_seconds",
            "realtime_history_audio_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.realtime_max_history_items < 1:
            raise ValueError("realtime_max_history_items must be at least 1")
        self._validate_size_limits()

    def _validate_size_limits(self) -> None:
        """Refuse limits that would let a request past the gateway that no stage message can carry
        (the stage would fail it with an internal error instead of the client getting 413)."""
        if self.max_request_bytes <= 0 or self.max_prompt_chars <= 0:
            raise ValueError("max_request_bytes and max_prompt_chars must be positive")
        room = self.max_message_bytes - STAGE_MESSAGE_HEADROOM
        if self.max_request_bytes > room:
            raise ValueError(
                f"max_request_bytes ({self.max_request_bytes}) must leave {STAGE_MESSAGE_HEADROOM} bytes "
                f"free under max_message_bytes ({self.max_message_bytes})"
            )
        if self.max_prompt_chars * BYTES_PER_PROMPT_UNIT > room:
            raise ValueError(
                f"max_prompt_chars ({self.max_prompt_chars}) at up to {BYTES_PER_PROMPT_UNIT} bytes each "
                f"must fit max_message_bytes ({self.max_message_bytes}) less {STAGE_MESSAGE_HEADROOM}"
            )
        self.media_limits.validate()  # each media limit fits max_decoded_media_bytes
        if self.max_decoded_media_bytes > room:
            raise ValueError(
                f"max_decoded_media_bytes ({self.max_decoded_media_bytes}) must fit max_message_bytes "
                f"({self.max_message_bytes}) less {STAGE_MESSAGE_HEADROOM}: decoded media reach the "
                "thinker in one message"
            )
        if self.max_media_bytes * BASE64_RATIO > self.max_request_bytes:
            raise ValueError(
                f"max_media_bytes ({self.max_media_bytes}) as base64 ({BASE64_RATIO:.3g}x) must fit "
                f"max_request_bytes ({self.max_request_bytes})"
            )

    @property
    def media_limits(self) -> MediaLimits:
        return MediaLimits.of(self)
