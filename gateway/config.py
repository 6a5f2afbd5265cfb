"""Gateway configuration: flags or a YAML file (see deploy/gateway.example.yaml).

Nothing here describes the model: its name, voices and sample rate come from the stages' Info
(`gateway.cluster.deployment`), so the gateway cannot disagree with what it routes to.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from gateway.admission.audio_capacity import (
    DEFAULT_MARGIN,
    DEFAULT_START_JITTER_PER_STREAM_S,
    DEFAULT_START_JITTER_S,
)
from gateway.admission.permits import DEFAULT_QUEUE_TIMEOUT_S
from gateway.media.limits import MediaLimits
from omnistream.request.defaults import DEFAULTS
from omnistream.service.settings import from_mapping, given, load_yaml, setting
from omnistream.wire.limits import MAX_MESSAGE_BYTES

API_KEY_ENV = "OMNISTREAM_API_KEY"
STAGES = ("thinker", "talker", "code2wav")

# Room in one stage message for everything but the prompt text (ids, sampling, framing). A request's
# text reaches the thinker in one gRPC message, so the size limits below must leave this much free.
STAGE_MESSAGE_HEADROOM = 64 * 1024
# The most bytes one prompt unit takes in that message: a character is at most 4 bytes of UTF-8, a
# token id of `prompt_ids` at most 5 bytes of varint.
BYTES_PER_PROMPT_UNIT = 5
# A REST body carries media as base64: 4 characters for every 3 bytes.
BASE64_RATIO = 4 / 3
_MEDIA = MediaLimits()  # the media defaults, reasons in gateway/media/limits.py and docs/serving.md


# --help sections of the flags (docs/serving.md's and docs/realtime.md's sections of the same names).
MEDIA = "media limits (docs/serving.md: Audio, images and video)"
REALTIME = "realtime (docs/realtime.md: Realtime voice)"
TLS = "transport security"


@dataclass
class GatewayConfig:
    """Every gateway setting, each written once: its type, default and help are the table that
    `omnistream serve gateway`'s flags and the YAML file (deploy/gateway.example.yaml) are read
    through (omnistream/service/settings.py)."""

    thinker: list[str] = setting(list, metavar="ADDR", help="thinker replica address")
    talker: list[str] = setting(list, metavar="ADDR", help="talker replica address")
    code2wav: list[str] = setting(list, metavar="ADDR", help="code2wav replica address")
    # What a request gets when it does not say (omnistream/request/defaults.py, docs/serving.md's table).
    async_chunk: bool = setting(
        DEFAULTS.async_chunk,
        help="stream each stage's output to the next as it is made (--no-async-chunk or --sequential: "
        "each stage waits for the previous one)",
    )
    codec_chunk_frames: int = setting(
        DEFAULTS.codec_chunk_frames, help="codec frames per audio chunk after the first ones (80 ms each)"
    )
    codec_left_context_frames: int = setting(
        DEFAULTS.codec_left_context_frames, help="codec frames of left context each chunk is decoded with"
    )
    seed: int | None = setting(
        None,
        shown="from the OS",
        help="a sampled request that gives no seed gets one derived from this and its content, so the "
        "same request gets the same sampled answer (unset: a fresh seed from the OS each time)",
    )
    # Admission (docs/serving.md "Admission", gateway/admission/limits.py): unset, the limits follow
    # what the stages' replicas in rotation report they hold; set, the operator's cap wins.
    max_concurrency: int | None = setting(
        None,
        shown="max_requests of the thinkers in rotation, summed",
        help="requests admitted at once; beyond this (and the queue) requests get 429",
    )
    max_queue: int | None = setting(
        None,
        shown="--max-concurrency's value, at least 16 while it is not given",
        help="requests that may wait for a slot, each at most --queue-timeout",
    )
    queue_timeout: float = setting(
        DEFAULT_QUEUE_TIMEOUT_S,
        help="seconds a request may wait for admission, the audio hold included, before its 429",
    )
    # Audio hold (docs/serving.md "Admission"): an audio request waits (up to queue_timeout) while the talker
    # and code2wav, at the speed they measure, could not keep one more stream plus the ones playing
    # real time with `audio_hold_margin` to spare; at most `audio_hold_queue` wait (None: as many as
    # max_queue's default; 0: refuse at once instead of holding). Off: admitted as before, whatever the
    # speed. Text-only requests are never held.
    audio_hold: bool = setting(
        True,
        help="hold new audio requests while the measured talker/code2wav speed could not keep one more "
        "stream real time (--no-audio-hold: every audio request is admitted up to the concurrency limit)",
    )
    audio_hold_margin: float = setting(
        DEFAULT_MARGIN,
        help="speed to spare: admit while capacity >= (1 + margin) x streams x 12.5 frames/s",
    )
    audio_hold_queue: int | None = setting(
        None,
        shown="--max-queue's default",
        help="audio requests held at most; more get 429 (0: 429 at once instead of holding)",
    )
    # Start guard (admission/start_guard.py): while a stream whose first chunk is
    # shorter than this many seconds has less than this in hand, new audio requests wait, then start
    # together; 0 turns it off.
    audio_start_guard: float = setting(
        1.0,
        help="seconds: while a stream with a first chunk shorter than this has less audio than this in "
        "hand, new audio requests wait, then start together, each sized knowing the others (0: off)",
    )
    # First-chunk sizing (admission/audio_capacity.py): a starting stream's later windows are predicted this
    # many seconds later than its measured speed says (jitter of a shared machine); 0: speed alone.
    audio_start_jitter: float = setting(
        DEFAULT_START_JITTER_S,
        help="seconds: a new stream's first chunk is sized as if its later windows came this much later "
        "than measured speed says, so the jitter of a shared machine finds audio in hand (0: off)",
    )
    # ... and this many seconds more for each other audio stream (their work shares the cores: at
    # 16 streams at once a starting stream's windows came ~0.25 s late, at 1 ~0.1 s).
    audio_start_jitter_per_stream: float = setting(
        DEFAULT_START_JITTER_PER_STREAM_S,
        help="seconds added to --audio-start-jitter for each other audio stream (0: off)",
    )
    request_timeout: float = setting(600.0, help="seconds before a request ends with 504")
    # Failover (serving/resume.py): a stage replica lost mid-stream, its requests move to a sibling
    # that continues or regenerates them; this many moves per request at most, then the loss's error.
    max_resumes: int = setting(
        2, help="times a request's stages may move to a sibling replica after a loss (0: never)"
    )
    max_tokens_limit: int = setting(4096, help="the most max_tokens a request may ask for")
    default_max_tokens: int = setting(DEFAULTS.max_tokens, help="max_tokens of a request that does not say")
    max_audio_frames: int = setting(
        DEFAULTS.max_audio_frames, help="codec frames of audio per request: the default and the limit"
    )
    max_message_bytes: int = setting(
        MAX_MESSAGE_BYTES, help="gRPC message limit, to the stages and on the public gRPC port"
    )
    # A larger REST body gets 413 before it is parsed. 8 MiB holds a full `max_prompt_chars` prompt
    # even when a client escapes every character as \uXXXX (6 bytes, json.dumps' default), and
    # stays far under the stage message limit.
    max_request_bytes: int = setting(8 * 1024 * 1024, help="REST bodies over this get 413")
    # A prompt with more characters of message text (or more prompt_ids) gets 413, on REST and gRPC.
    # A million characters are hundreds of thousands of tokens, past any Qwen3-Omni context, so only
    # prompts that could never run are refused; it bounds the thinker's tokenizing work, and at 5
    # bytes a unit such a prompt always fits one stage message.
    max_prompt_chars: int = setting(1_000_000, help="longer prompts (or more prompt_ids) get 413")
    # Media (docs/serving.md "Audio, images and video"). Encoded bytes of all media of one request: 5 MiB is
    # 6.7 MiB of base64, inside the 8 MiB REST body with room for text.
    max_media_bytes: int = setting(_MEDIA.max_media_bytes, group=MEDIA, help="encoded media per request")
    # Decoded media of one request travel to the thinker in one stage message beside the text: this
    # budget plus the prompt must fit max_message_bytes (checked here, and per request at run time).
    max_decoded_media_bytes: int = setting(
        _MEDIA.max_decoded_bytes, group=MEDIA, help="decoded media per request, must fit the stage message"
    )
    max_audio_seconds: float = setting(
        _MEDIA.max_audio_seconds, group=MEDIA, help="seconds of audio per request, video sound included"
    )
    max_image_input_pixels: int = setting(
        _MEDIA.max_image_input_pixels, group=MEDIA, help="pixels of an image (or video frame) as sent"
    )
    image_max_pixels: int = setting(
        _MEDIA.image_max_pixels, group=MEDIA, help="pixels of an image after resizing (1280 visual tokens)"
    )
    max_video_seconds: float = setting(
        _MEDIA.max_video_seconds, group=MEDIA, help="seconds of a video; longer ones get 413"
    )
    max_video_frames: int = setting(
        _MEDIA.max_video_frames, group=MEDIA, help="frames sampled per video (longer: sparser)"
    )
    video_fps: float = setting(
        _MEDIA.video_fps, group=MEDIA, help="frames sampled per second of video (the reference's)"
    )
    video_total_pixels: int = setting(
        _MEDIA.video_total_pixels, group=MEDIA, help="the reference's total_pixels budget of one video"
    )
    vision_factor: int = setting(
        _MEDIA.vision_factor, group=MEDIA, help="patch_size x spatial_merge_size of the model"
    )
    media_decode_timeout: float = setting(
        _MEDIA.decode_timeout, group=MEDIA, help="seconds to decode one request's media"
    )
    media_decode_workers: int = setting(
        _MEDIA.decode_workers, group=MEDIA, help="decoding threads (and requests decoded at once)"
    )
    # http(s):// or file:// prefixes media URLs may start with; empty: data: URLs only.
    media_url_prefixes: list[str] = setting(
        list,
        flag="media-url-prefix",
        group=MEDIA,
        metavar="PREFIX",
        help="allow media URLs starting with this http(s):// or file:// prefix (none: data: URLs only)",
    )
    media_url_timeout: float = setting(_MEDIA.url_timeout, group=MEDIA, help="seconds to fetch one media URL")
    health_interval: float = setting(
        1.0, help="seconds between health rounds (each also reads the stages' measured speed)"
    )
    # Stage entries that are DNS names ("dns:///talker:50051", "talker:50051") are resolved this
    # often; every address found is a replica (a headless Service lists one per ready pod).
    discovery_interval: float = setting(5.0, help="seconds between DNS look-ups of stage names")
    host: str = setting("127.0.0.1", help="address the REST and gRPC ports bind")
    http_port: int = setting(8000, help="REST/SSE port; 0 picks a free port (printed on stdout)")
    grpc_port: int = setting(50051, help="gRPC port; 0 picks a free port (printed on stdout)")
    metrics_in_http: bool = setting(True, help="serve /metrics on the REST port")
    # TLS on the public ports (REST and gRPC); with tls_client_ca clients need a certificate (mTLS).
    tls_cert: str | None = setting(None, group=TLS, help="PEM certificate: serve REST and gRPC over TLS")
    tls_key: str | None = setting(None, group=TLS, help="PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(None, group=TLS, help="PEM CA: require client certificates (mTLS)")
    # TLS from the gateway to the stages: the CA that signed their certificates, and this gateway's
    # client certificate when the stages require one. stage_tls_server_name: the name the stages'
    # certificates carry when it is neither the dialled IP nor the DNS name of the entry.
    stage_tls_ca: str | None = setting(None, group=TLS, help="PEM CA that signed the stages' certificates")
    stage_tls_cert: str | None = setting(
        None, group=TLS, help="client certificate for stages that require one"
    )
    stage_tls_key: str | None = setting(None, group=TLS, help="private key of --stage-tls-cert")
    stage_tls_server_name: str | None = setting(None, group=TLS, help="name on the stages' certificates")
    # Bearer API key for /v1/* and the gRPC Gateway service (default: $OMNISTREAM_API_KEY).
    api_key: str | None = setting(
        None,
        group=TLS,
        shown=f"${API_KEY_ENV}",
        repr=False,
        help="require `Authorization: Bearer KEY` on /v1/* and the gRPC Gateway service",
    )
    # /v1/realtime (docs/realtime.md "Realtime voice"): open WebSocket sessions at most (each response also
    # takes an admission slot while it runs); a session with no client event and no response for
    # `realtime_idle_timeout` seconds is closed; the uncommitted input buffer holds at most
    # `realtime_max_buffer_seconds` of audio, and appends may run ahead of real time by at most
    # `realtime_append_burst_seconds`. A conversation keeps every item the thinker's context holds
    # (gateway/realtime/context.py): `realtime_context_tokens` caps that context below the thinker's
    # max_model_len, and `realtime_max_history_items` / `realtime_history_audio_seconds` optionally
    # cap the items and the user audio kept (none: only the context and the stage message bound).
    realtime_max_sessions: int = setting(16, group=REALTIME, help="open /v1/realtime sessions (0: none)")
    realtime_idle_timeout: float = setting(
        300.0, group=REALTIME, help="seconds without a client event or a response before a session closes"
    )
    realtime_max_buffer_seconds: float = setting(
        60.0, group=REALTIME, help="seconds of uncommitted input audio a session holds"
    )
    realtime_append_burst_seconds: float = setting(
        10.0, group=REALTIME, help="seconds appends may run ahead of real time"
    )
    # With server turn detection, the answer is started this long before the detector's window
    # would end (gateway/realtime/speculation.py): once the silence has lasted the window less this,
    # on the turn's audio, its output held until the decision. Longer: ready sooner under load, more
    # work wasted on pauses the user speaks after; 0: off.
    realtime_speculation_lead_ms: int = setting(
        300,
        group=REALTIME,
        help="ms before the turn detector decides that the answer is started, speculatively, its "
        "output held until the decision (0: off; a lead as long as the window: at once)",
    )
    # gateway/realtime/work_ahead.py: a turn's whole audio encoder windows encoded while it is
    # spoken. Shorter: a window is found sooner after it is complete, at more sends; 0: off.
    realtime_work_ahead_ms: int = setting(
        2000,
        group=REALTIME,
        help="ms of new audio in a turn after which the audio so far goes to the thinker to encode "
        "its complete encoder windows ahead of the commit (0: off)",
    )
    realtime_context_tokens: int | None = setting(
        None,
        group=REALTIME,
        shown="the thinker's max_model_len",
        help="tokens a conversation's prompt plus its answer's max_output_tokens may take, at most "
        "the thinker's max_model_len; the oldest items past it are dropped",
    )
    realtime_max_history_items: int | None = setting(
        None, group=REALTIME, help="conversation items kept at most (none: as many as the context holds)"
    )
    realtime_history_audio_seconds: float | None = setting(
        None,
        group=REALTIME,
        help="seconds of user audio a conversation keeps at most (none: as much as the context holds)",
    )

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatewayConfig:
        """The settings of a YAML file (deploy/gateway.example.yaml), through the same table as the
        flags: an unknown key or a value of the wrong type is a ValueError naming it. The stages'
        addresses may sit under `stages:` (as in the example) or at the top level."""
        data = load_yaml(path)
        stages = data.pop("stages", None) or {}
        if not isinstance(stages, dict) or set(stages) - set(STAGES):
            raise ValueError(f"{path}: stages takes a mapping of {', '.join(STAGES)} to addresses")
        data |= stages
        return cls(**from_mapping(cls, data, source=f"gateway config {path}"))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GatewayConfig:
        """defaults <- the YAML file of `--config` <- the flags given (`add_flags(..., GatewayConfig)`)."""
        config = cls.from_yaml(args.config) if getattr(args, "config", None) else cls()
        for name, value in given(args, cls).items():
            setattr(config, name, value)
        return config

    def resolve_api_key(self) -> None:
        if not self.api_key:
            self.api_key = os.environ.get(API_KEY_ENV) or None

    def validate(self) -> None:
        # Thinkers alone are a deployment (text chat; audio requests get 503, cluster/readiness.py); a
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
        if self.realtime_speculation_lead_ms < 0:
            raise ValueError("realtime_speculation_lead_ms must be at least 0")
        if self.realtime_work_ahead_ms < 0:
            raise ValueError("realtime_work_ahead_ms must be at least 0")
        if self.max_resumes < 0:
            raise ValueError("max_resumes must be at least 0")
        if self.audio_hold_margin < 0:
            raise ValueError("audio_hold_margin must be at least 0")
        if self.audio_start_guard < 0:
            raise ValueError("audio_start_guard must be at least 0")
        if not 0 <= self.audio_start_jitter <= 10:
            raise ValueError("audio_start_jitter must be in [0, 10] seconds")
        if not 0 <= self.audio_start_jitter_per_stream <= 1:
            raise ValueError("audio_start_jitter_per_stream must be in [0, 1] seconds")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1 (or none: what the stages hold)")
        for name in ("max_queue", "audio_hold_queue"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be at least 0")
        if self.discovery_interval <= 0:
            raise ValueError("discovery_interval must be positive")
        if self.realtime_max_sessions < 0:
            raise ValueError("realtime_max_sessions must be at least 0 (0: no realtime sessions)")
        for name in (
            "realtime_idle_timeout",
            "realtime_max_buffer_seconds",
            "realtime_append_burst_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.realtime_history_audio_seconds is not None and self.realtime_history_audio_seconds <= 0:
            raise ValueError("realtime_history_audio_seconds must be positive (or none: no cap)")
        for name in ("realtime_max_history_items", "realtime_context_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or none: no cap)")
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
