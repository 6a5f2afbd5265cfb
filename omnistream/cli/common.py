"""What the `omnistream` sub-commands share: the model flags and the default tiny checkpoint.

Its own module so that `cli` (which builds the parser) and `cli_services` (the service commands it
adds) both import it and neither imports the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnistream.engine.load_options import DeviceSettings
from omnistream.service.device_flags import add_dtype_arguments, add_stage_device_arguments

DEFAULT_TINY_DIR = Path(".cache/tiny-model")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=str(DEFAULT_TINY_DIR),
        help="Hugging Face checkpoint directory of a known model family (default: the tiny one)",
    )
    p.add_argument(
        "--device",
        default=DeviceSettings.device,
        help="cpu, cuda or cuda:N: every stage's, unless its own flag says",
    )
    add_stage_device_arguments(p)
    add_dtype_arguments(p)


def ensure_tiny_model(directory: Path) -> Path:
    """Build the default family's tiny checkpoint once (it is deterministic for its seed), and again
    when the builder changed since (a checkpoint from an older builder may lack files now read)."""
    from omnistream.models.build_lock import build_lock
    from omnistream.models.family import DEFAULT_FAMILY, family_named

    family = family_named(DEFAULT_FAMILY)
    with build_lock(directory):
        if not ((directory / "config.json").exists() and family.tiny_is_current(directory)):
            print(f"building the tiny model in {directory} ...", file=sys.stderr)
            family.make_tiny(directory)
    return directory


def ensure_default_model(model: str | Path) -> None:
    """The default --model is built on first use; any other directory must already exist."""
    if Path(model) == DEFAULT_TINY_DIR:
        ensure_tiny_model(DEFAULT_TINY_DIR)
