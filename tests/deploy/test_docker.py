"""deploy/docker/Dockerfile: lint-clean under hadolint, and what it builds works.

No Docker engine runs here, so the image is never built in this suite. Instead: hadolint checks the
Dockerfile, its structure is checked below, and `test_image_install_steps_work` replays the build
steps that matter outside Docker (generate stubs, build the wheel, install it into a fresh venv with
no sources around) and then runs the image's command lines (`serve` with $OMNISTREAM_MODEL, the
HEALTHCHECK's `omnistream health`) from that installation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

from omnistream.cli.lifeline import spawn

from .conftest import BIN, DEPLOY, ROOT, cli_args, run, tool

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint():
    hadolint = tool("hadolint")
    result = run(hadolint, "--format", "json", DOCKERFILE)
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stdout + result.stderr


def test_vllm_dockerfile_passes_hadolint_and_copies_what_exists():
    """The vLLM thinker's image (deploy/docker/Dockerfile.vllm): lint-clean, its sources let through
    by its own .dockerignore, its command a vLLM thinker."""
    hadolint = tool("hadolint")
    path = DEPLOY / "docker" / "Dockerfile.vllm"
    result = run(hadolint, "--format", "json", path)
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stdout + result.stderr
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    ignore = (DEPLOY / "docker" / "Dockerfile.vllm.dockerignore").read_text().split()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
                assert f"!{source}" in ignore, source
    (cmd,) = [line for line in text.splitlines() if line.startswith("CMD ")]
    args = cli_args(json.loads(cmd[4:]), {"OMNISTREAM_MODEL": "/models/qwen3-omni"})
    assert args.stage == "thinker" and args.backend == "vllm"


def test_hadolint_is_not_vacuous(tmp_path):
    hadolint = tool("hadolint")
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install torch\n"
    )
    result = run(hadolint, "--format", "json", bad)
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert result.returncode != 0 and {"DL3007", "DL3008", "DL3013"} <= codes, codes


def test_dockerfile_shape():
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert froms and all(f.split()[0] == "python:3.11-slim" for f in froms)
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    run_lines = " ".join(args for word, args in steps if word == "RUN")
    assert re.search(r"--index-url \S+ torch==2\.13\.0", run_lines) and "whl/cpu" in DOCKERFILE.read_text()
    assert "omnistream.wire.protogen" in run_lines and "omnistream make-tiny-model /models/tiny" in run_lines
    assert "[dev]" not in run_lines  # runtime dependencies only
    env = " ".join(args for word, args in final if word == "ENV")
    assert "OMNISTREAM_MODEL=/models/tiny" in env
    (health,) = [args for word, args in final if word == "HEALTHCHECK"]
    probe = json.loads(health[health.index("CMD") + 3 :])
    assert probe[:2] == ["omnistream", "health"] and probe[2].endswith(":50051")
    cli_args(probe[1:])
    (entrypoint,) = [json.loads(args) for word, args in final if word == "ENTRYPOINT"]
    assert entrypoint == ["omnistream"]
    (cmd,) = [json.loads(args) for word, args in final if word == "CMD"]
    parsed = cli_args(cmd, {"OMNISTREAM_MODEL": "/models/tiny"})
    assert parsed.model == "/models/tiny"
    assert parsed.port == 50051 and parsed.host == "0.0.0.0" and parsed.metrics_port == 9090
    # everything the build copies exists and is let through by the Dockerfile's .dockerignore
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().split()
    for word, args in steps:
        if word == "COPY" and "--from" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert f"!{source}" in ignore, f"{source} is excluded from the build context"


def dev_only_modules() -> set[str]:
    """Top-level modules of the dev extras that no runtime dependency needs (absent from the image)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, todo = set(), [Requirement(r).name for r in project["dependencies"]]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in runtime:
            continue
        runtime.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    dev = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["dev"]} - runtime
    return {
        top
        for top, dists in metadata.packages_distributions().items()
        if dists and all(canonicalize_name(d) in dev for d in dists)
    }


BLOCKER = """import sys

# Absent as in the image: `import X` raises ModuleNotFoundError ("import of X halted; None in
# sys.modules") and `importlib.util.find_spec(X)` returns None, as libraries probing for optional
# packages expect (a finder that raised instead would break those probes, unlike a real absence).
for _name in {blocked!r}:
    sys.modules.setdefault(_name, None)
"""


def _start(cmd: list[str], cwd: Path, env: dict) -> tuple[subprocess.Popen, dict]:
    """Start an installed `omnistream` command tied to this test process, as every launcher does:
    it dies with pytest even when pytest is killed (see omnistream/cli/lifeline.py)."""
    proc = spawn(cmd, env, cwd=cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "listening":
            return proc, json.loads(line)
    raise AssertionError(f"{cmd[1:3]} exited with {proc.wait(10)} before listening")


def _wait_healthy(omnistream: str, address: str, cwd: Path, env: dict, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:  # the image's HEALTHCHECK command
        health = run(omnistream, "health", address, "--timeout", "2", cwd=cwd, env=env)
        if health.returncode == 0 or time.monotonic() > deadline or proc.poll() is not None:
            break
        time.sleep(0.3)
    assert health.returncode == 0 and "SERVING" in health.stdout, health.stdout + health.stderr


def test_image_install_steps_work(tmp_path):
    """The build's steps and the image's commands, replayed without Docker: stubs generated into the
    package, the wheel installed into a fresh venv with no sources around and no dev-only package
    importable, the tiny model built, then a stage and the gateway served from that installation."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("protos", "omnistream", "services", "gateway"):
        skip = shutil.ignore_patterns("__pycache__", "proto", "*.pyc", ".protogen-*")
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    python = str(BIN / "python")
    assert run(python, "-m", "omnistream.wire.protogen", cwd=src).returncode == 0
    dist = tmp_path / "dist"
    wheel = run(
        python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", dist, cwd=src
    )
    assert wheel.returncode == 0, wheel.stderr
    (whl,) = dist.glob("omnistream-*.whl")
    # A fresh venv: the wheel in its own site-packages, the runtime dependencies from this venv.
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", venv).returncode == 0
    purelib = run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    site = Path(purelib.stdout.strip())
    (site / "runtime-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    blocked = dev_only_modules()
    assert {"pytest", "openai", "cryptography"} <= blocked
    (site / "_omnistream_runtime_only.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    (site / "runtime-only.pth").write_text("import _omnistream_runtime_only\n")
    installed = run(
        python, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps", whl
    )
    assert installed.returncode == 0, installed.stderr
    shutil.rmtree(src)  # no sources left to import by accident

    omnistream = str(venv / "bin" / "omnistream")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNISTREAM_MODEL": str(tmp_path / "models" / "tiny")}
    env.pop("PYTHONPATH", None)
    probe = "import omnistream.proto.omni.v1.stage_pb2 as m, pytest"
    where = run(venv / "bin" / "python", "-c", probe, cwd=tmp_path, env=env)
    assert "None in sys.modules" in where.stderr, where.stderr  # the blocker is active
    where = run(
        venv / "bin" / "python",
        "-c",
        "import omnistream.proto.omni.v1.stage_pb2 as m; print(m.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert str(venv) in where.stdout, where.stdout + where.stderr
    made = run(omnistream, "make-tiny-model", env["OMNISTREAM_MODEL"], cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr[-2000:]

    procs = []
    try:
        stage, listening = _start(
            [omnistream, "serve", "code2wav", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0"],
            tmp_path,
            env,
        )
        procs.append(stage)
        address = f"127.0.0.1:{listening['port']}"
        _wait_healthy(omnistream, address, tmp_path, env, stage)
        gateway_cmd = [omnistream, "serve", "gateway", "--http-port", "0", "--grpc-port", "0"]
        gateway_cmd += ["--thinker", address, "--talker", address, "--code2wav", address]
        gateway, listening = _start(gateway_cmd, tmp_path, env)
        procs.append(gateway)
        _wait_healthy(omnistream, f"127.0.0.1:{listening['grpc_port']}", tmp_path, env, gateway)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
