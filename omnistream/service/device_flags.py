"""The load flags every command that loads a stage shares (`--dtype`, `--allow-float64`, and for
the commands that load all three, `--<stage>-device`), read back at the entry point: the engines get
typed settings (omnistream/engine/load_options.py), never a namespace."""

from __future__ import annotations

import argparse

from omnistream.engine.load_options import ALLOW_FLOAT64_HELP, DTYPE_CHOICES, DTYPE_HELP, DeviceSettings


def add_dtype_arguments(p: argparse.ArgumentParser) -> None:
    """`--dtype` and `--allow-float64`, the same for every command that loads a stage."""
    p.add_argument("--dtype", default=DeviceSettings.dtype, choices=list(DTYPE_CHOICES), help=DTYPE_HELP)
    p.add_argument("--allow-float64", action="store_true", help=ALLOW_FLOAT64_HELP)


STAGE_NAMES = ("thinker", "talker", "code2wav")


def add_stage_device_arguments(p: argparse.ArgumentParser) -> None:
    """`--thinker-device` etc.: one device per stage, each defaulting to `--device`."""
    for stage in STAGE_NAMES:
        p.add_argument(
            f"--{stage}-device", default=None, help=f"device of the {stage} (default: --device), e.g. cuda:1"
        )


def stage_devices(args: argparse.Namespace) -> dict[str, str]:
    """Each stage's device from parsed `--device` and `--<stage>-device` flags."""
    return {stage: getattr(args, f"{stage}_device", None) or args.device for stage in STAGE_NAMES}
