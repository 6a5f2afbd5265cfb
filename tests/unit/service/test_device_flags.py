"""The load flags the commands share (omnistream/service/device_flags.py), read back at the entry."""

from __future__ import annotations

import argparse

from omnistream.service.device_flags import add_dtype_arguments, add_stage_device_arguments, stage_devices


def test_stage_devices_default_to_device():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    add_stage_device_arguments(p)
    add_dtype_arguments(p)
    args = p.parse_args(["--device", "cuda:0", "--talker-device", "cuda:1", "--code2wav-device", "cuda:1"])
    assert stage_devices(args) == {"thinker": "cuda:0", "talker": "cuda:1", "code2wav": "cuda:1"}
    assert args.dtype == "auto" and not args.allow_float64
