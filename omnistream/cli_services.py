"""Sub-commands that run services (filled in by the service and gateway modules)."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Service commands register here; kept apart so `generate` needs no gRPC import."""
