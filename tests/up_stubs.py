"""What the tests of `omnistream up`'s supervision share: stand-in services (a sleeping Python
process in a ServiceProcess record, so that only up's own logic is under test), parsed `up`
arguments, and the process's signal handlers put back after `run_up` installed its own."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator

from omnistream.cli import up
from omnistream.cli.launcher import ServiceProcess


def stand_in(name: str, *, ignore_sigterm: bool = False) -> ServiceProcess:
    """A process that sleeps like an idle service, ready once its signal handlers are in place."""
    code = "import signal, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"  # its handlers are in place
    return ServiceProcess(name, proc)


def up_args(http_port: int = 0, grpc_port: int = 0) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    return parser.parse_args(
        ["--model", "unused", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    )


@contextlib.contextmanager
def signal_handlers_restored() -> Iterator[None]:
    """run_up installs handlers for the process; the test process must get its own back."""
    saved = {sig: signal.getsignal(sig) for sig in up.STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
