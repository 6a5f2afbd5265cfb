"""What the deployment serves, as its stages said in their Info, and which replicas may join it.

The gateway has no model of its own: the model name, voices, default voice and sample rate it
reports and checks come from the stages. The first info accepted for a stage becomes the
deployment's; a later replica of that stage must agree with it on every fact a client or another
stage relies on, and every stage must agree with the other stages on what they share. A replica
that does not is refused (kept out of rotation): mixing checkpoints or protocol versions would
answer some requests with another model, another voice set, or codes the next stage cannot decode.

Limits and the software version may differ between replicas: hardware differs, and a rolling
upgrade runs two releases side by side (the chunk protocol version is what must match); where a
limit bounds what the gateway sends (the thinkers' max_model_len, which a realtime conversation
fills), the smallest of the replicas in rotation is the deployment's. So may the
input modalities of thinkers: a transformers thinker takes audio, images and video, a vLLM one text
only; the deployment takes what its thinkers in rotation take between them, and each request goes
to a thinker that takes all of its media (gateway/cluster/replica.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from omnistream.request.stage_chain import STAGES
from omnistream.wire.protogen import ensure_generated

ensure_generated()

from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, stage_pb2  # noqa: E402  (generated above)

log = logging.getLogger(__name__)

StageInfo = stage_pb2.StageInfo

# Replicas of one stage must agree on all of these (a stage leaves the facts it does not own empty,
# so comparing them all is the same as comparing the owned ones).
SAME_STAGE_FIELDS = (
    "model_id",
    "family",
    "chunk_protocol_version",
    "voices",
    "sample_rate",
    "codebooks",
    "frames_per_second",
)
# Every stage must agree with every other on these: one model, one protocol.
SHARED_FIELDS = ("model_id", "family", "chunk_protocol_version")
# The talker's codes are the code2wav's input: same codebooks per frame, same frame rate.
CODEC_FIELDS = ("codebooks", "frames_per_second")


def stage_name(info: StageInfo) -> str:
    """The lowercase stage name of `info.stage` ("unspecified" for a value this gateway does not know)."""
    name = common_pb2.Stage.Name(info.stage) if info.stage in common_pb2.Stage.values() else ""
    return name.removeprefix("STAGE_").lower() or "unspecified"


def _value(info: StageInfo, field: str) -> Any:
    value = getattr(info, field)
    return list(value) if field in ("voices", "input_modalities") else value


def differences(info: StageInfo, reference: StageInfo, fields: tuple[str, ...]) -> list[str]:
    """`field value (reference: value)` for each of `fields` on which `info` differs from `reference`."""
    return [
        f"{field} {_value(info, field)!r} (deployment: {_value(reference, field)!r})"
        for field in fields
        if _value(info, field) != _value(reference, field)
    ]


def refusal(stage: str, info: StageInfo, accepted: Mapping[str, StageInfo]) -> str | None:
    """Why a `stage` replica describing itself as `info` may not join a deployment whose accepted
    infos are `accepted` (stage name -> info); None when it may."""
    if stage_name(info) != stage:
        return f"its Info says it is a {stage_name(info)} stage, not a {stage}"
    problems: list[str] = []
    reference = accepted.get(stage)
    if reference is not None and reference is not info:
        problems += differences(info, reference, SAME_STAGE_FIELDS)
        # The default voice too, unless one of them predates the field ("": the talker picks its own).
        if info.default_voice and reference.default_voice:
            problems += differences(info, reference, ("default_voice",))
    for other, other_info in accepted.items():
        if other == stage:
            continue
        fields: tuple[str, ...] = SHARED_FIELDS
        if {stage, other} == {"talker", "code2wav"}:
            fields += CODEC_FIELDS
        problems += [f"{d} of the {other}" for d in differences(info, other_info, fields)]
    if not problems:
        return None
    return "disagrees with the deployment: " + "; ".join(dict.fromkeys(problems))


class Deployment:
    """The accepted info of each stage: the first one that agreed with the others."""

    def __init__(self) -> None:
        self.accepted: dict[str, StageInfo] = {}
        # What the thinkers in rotation take between them (set by Replicas); None: the first's.
        self.thinker_modalities: Callable[[], tuple[str, ...] | None] | None = None
        # The smallest context of the thinkers in rotation (set by Replicas); None: the first's.
        self.thinker_max_model_len: Callable[[], int | None] | None = None

    def admit(self, stage: str, info: StageInfo) -> str | None:
        """Accept `info` (the first of its stage becomes the deployment's), or return why not."""
        reason = refusal(stage, info, self.accepted)
        if reason is None and stage not in self.accepted:
            self.accepted[stage] = info
            log.info(
                "deployment %s: model %r (%s, chunk protocol %d)",
                stage,
                info.model_id,
                info.family,
                info.chunk_protocol_version,
            )
        return reason

    def forget(self, stage: str) -> None:
        """Let the next replica of `stage` define it again (its last accepted replica is gone)."""
        if self.accepted.pop(stage, None) is not None:
            log.info("deployment %s: no accepted replica left; the next one defines it", stage)

    @property
    def complete(self) -> bool:
        return all(stage in self.accepted for stage in STAGES)

    @property
    def known(self) -> bool:
        """A thinker was accepted: the model is known and text can be served (a deployment of
        thinkers alone is one; its `output_modalities` are then text only)."""
        return "thinker" in self.accepted

    def _first(self, field: str, *stages: str) -> Any:
        for stage in stages or STAGES:
            info = self.accepted.get(stage)
            if info is not None:
                return _value(info, field)
        return None

    @property
    def model_id(self) -> str | None:
        model_id: str | None = self._first("model_id")
        return model_id

    @property
    def voices(self) -> tuple[str, ...] | None:
        """The talker's voices; None until a talker was accepted (nothing can speak before)."""
        voices = self._first("voices", "talker")
        return None if voices is None else tuple(voices)

    @property
    def default_voice(self) -> str | None:
        """The voice the talker speaks when a request names none; None until a talker that reports
        one was accepted (a request then leaves its speaker empty and the talker picks)."""
        voice: str | None = self._first("default_voice", "talker") or None
        return voice

    @property
    def input_modalities(self) -> tuple[str, ...] | None:
        """What the thinkers take in a prompt ("text", "audio", ...), all those in rotation
        together; None until one was accepted."""
        modalities = self.thinker_modalities() if self.thinker_modalities is not None else None
        if modalities is None:
            modalities = self._first("input_modalities", "thinker")
        return None if modalities is None else tuple(modalities)

    @property
    def max_model_len(self) -> int | None:
        """The thinker's context in tokens (prompt and output), the smallest of those in rotation:
        what a realtime conversation may fill (gateway/realtime/context.py). None until a thinker
        that reports one was accepted."""
        length = self.thinker_max_model_len() if self.thinker_max_model_len is not None else None
        if length is None:
            info = self.accepted.get("thinker")
            length = info.limits.max_model_len if info is not None else None
        return length or None

    @property
    def sample_rate(self) -> int | None:
        rate: int | None = self._first("sample_rate", "code2wav")
        return rate

    @property
    def frames_per_second(self) -> float | None:
        """Codec frames per second of audio (what one listener consumes); None before a talker or
        code2wav was accepted."""
        return self._first("frames_per_second", "code2wav", "talker") or None

    def to_proto(self) -> gateway_pb2.GatewayInfo:
        return gateway_pb2.GatewayInfo(
            model_id=self.model_id or "",
            family=self._first("family") or "",
            voices=self.voices or (),
            sample_rate=self.sample_rate or 0,
            frames_per_second=self._first("frames_per_second", "code2wav", "talker") or 0.0,
            input_modalities=self.input_modalities or (),
            output_modalities=self.output_modalities,
            stages=[self.accepted[s] for s in STAGES if s in self.accepted],
        )

    @property
    def output_modalities(self) -> list[str]:
        audio = "talker" in self.accepted and "code2wav" in self.accepted
        return ["text", "audio"] if audio else ["text"]

    def model_card(self) -> dict[str, Any] | None:
        """The `/v1/models` entry (OpenAI's shape plus an `omnistream` object); None before a
        thinker was heard from (without talker and code2wav: no voices, output text only)."""
        if not self.known:
            return None
        info = self.to_proto()
        return {
            "id": info.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "omnistream",
            "omnistream": {
                "family": info.family,
                "voices": list(info.voices),
                "sample_rate": info.sample_rate,
                "frames_per_second": info.frames_per_second,
                "input_modalities": list(info.input_modalities),
                "output_modalities": list(info.output_modalities),
                "chunk_protocol_version": self.accepted["thinker"].chunk_protocol_version,
            },
        }
