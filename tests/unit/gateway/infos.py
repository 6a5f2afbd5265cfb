"""StageInfos as a Qwen3-Omni deployment's stages report them, for tests without stages."""

from __future__ import annotations

from typing import Any

from gateway.cluster.deployment import STAGES, Deployment
from omnistream.proto.omni.v1 import common_pb2, stage_pb2

VOICES = ("aiden", "chelsie", "ethan")


def stage_info(stage: str, **overrides: Any) -> stage_pb2.StageInfo:
    """What a `stage` replica of the default deployment says; `overrides` replace fields."""
    fields: dict[str, Any] = {
        "stage": common_pb2.Stage.Value(f"STAGE_{stage.upper()}"),
        "model_id": "qwen3-omni",
        "family": "qwen3_omni",
        "chunk_protocol_version": 1,
        "software_version": "0.1.0",
        "limits": stage_pb2.StageLimits(max_batch=8, max_requests=32, max_message_bytes=16 << 20),
    }
    if stage == "thinker":
        fields["input_modalities"] = ["text"]
    if stage == "talker":
        fields |= {"voices": list(VOICES), "codebooks": 16, "frames_per_second": 12.5}
    if stage == "code2wav":
        fields |= {"sample_rate": 24000, "codebooks": 16, "frames_per_second": 12.5}
    fields |= overrides
    if stage == "talker" and "default_voice" not in overrides:
        # The talker's default voice as Qwen3-Omni's picks it: ethan, else its first voice.
        voices = fields["voices"]
        fields["default_voice"] = "ethan" if "ethan" in voices else next(iter(voices), "")
    return stage_pb2.StageInfo(**fields)


def deployment(**talker: Any) -> Deployment:
    """A deployment that accepted one replica of every stage (`talker` overrides the talker's info)."""
    d = Deployment()
    for stage in STAGES:
        reason = d.admit(stage, stage_info(stage, **(talker if stage == "talker" else {})))
        assert reason is None, reason
    return d


def deployment_taking(modalities: tuple[str, ...]) -> Deployment:
    """`deployment()` whose thinker takes these input modalities."""
    d = deployment()
    thinker = d.accepted["thinker"]
    del thinker.input_modalities[:]
    thinker.input_modalities.extend(modalities)
    return d
