"""Command-line arguments of `omnistream serve gateway` (no heavy imports).

Every `GatewayConfig` field is a flag, generated from the field (omnistream/service/settings.py):
its name dashed, its type, its help and default as the field says. Only what is no setting is
written here: the YAML file to start from, `--sequential`, the older spelling of
`--no-async-chunk`, and `--otlp-traces-endpoint` (tracing is the process's, as in every stage:
omnistream/service/tracing.py).
"""

from __future__ import annotations

import argparse

from gateway.config import GatewayConfig
from omnistream.service.settings import add_flags
from omnistream.service.tracing import add_endpoint_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file (see deploy/gateway.example.yaml); flags override it")
    p.add_argument("--sequential", action="store_true", help="default to sequential mode (async chunk off)")
    add_flags(p, GatewayConfig)  # absent flags parse to None: the YAML's values (or the defaults) stay
    add_endpoint_argument(p, ": a span per request and per stage call")
