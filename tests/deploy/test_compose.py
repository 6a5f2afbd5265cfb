"""deploy/compose: valid under the Compose specification, and the stack it describes is coherent.

No Docker engine runs here, so `docker compose up` is never run in this suite: check-jsonschema
validates the files against the Compose specification's JSON schema, and the tests below check
what the schema cannot (command lines parse with the real CLI, health checks and start order,
replica counts, the gateway's stage addresses, Prometheus targets and rules, the OpenTelemetry
collector and where the services send traces).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gateway.cluster.discovery import Target

from .conftest import DEPLOY, cli_args, flag, run, tool

COMPOSE = DEPLOY / "compose"
FILES = [
    COMPOSE / "docker-compose.yml",
    COMPOSE / "docker-compose.checkpoint.yml",
    COMPOSE / "docker-compose.gpu.yml",
    COMPOSE / "docker-compose.vllm.yml",
]
STAGES = ("thinker", "talker", "code2wav")
OBSERVABILITY = ("prometheus", "otel-collector")  # the `observability` profile
PROMETHEUS = DEPLOY / "prometheus"
OTEL = DEPLOY / "otel"


def services() -> dict[str, dict]:
    return yaml.safe_load(FILES[0].read_text())["services"]


def test_compose_files_follow_the_compose_spec():
    checker = tool("check-jsonschema")
    result = run(checker, "--builtin-schema", "vendor.compose-spec", *FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_validation_is_not_vacuous(tmp_path):
    checker = tool("check-jsonschema")
    bad = tmp_path / "docker-compose.yml"
    text = FILES[0].read_text()
    bad.write_text(
        text.replace("    restart: unless-stopped", "    restart: unless-stopped\n    restrat: no", 1)
    )
    result = run(checker, "--builtin-schema", "vendor.compose-spec", bad)
    assert result.returncode != 0 and "restrat" in result.stdout + result.stderr


def test_stages_gateway_and_observability():
    svc = services()
    assert set(svc) == {*STAGES, "gateway", *OBSERVABILITY}
    assert svc["talker"]["deploy"]["replicas"] == 2 and svc["code2wav"]["deploy"]["replicas"] == 2
    for name in (*STAGES, "gateway"):
        check = svc[name]["healthcheck"]["test"]
        assert check[:3] == ["CMD", "omnistream", "health"] and check[3] == "127.0.0.1:50051", name
        assert int(svc[name]["stop_grace_period"].rstrip("s")) > 30  # longer than the drain
        assert "profiles" not in svc[name]  # the stack itself always starts
    for stage in STAGES:
        env = svc[stage]["environment"]
        args = cli_args(svc[stage]["command"], {"OMNISTREAM_MODEL": "/models/tiny"})
        assert args.command == "serve" and args.stage == stage
        assert args.host == "0.0.0.0" and args.port == 50051 and args.metrics_port == 9090
        assert args.metrics_host == "0.0.0.0" and args.grace_seconds == 30
        assert "OMNISTREAM_MODEL" in env


def test_gateway_waits_for_healthy_stages_and_finds_them_by_dns():
    svc = services()
    gateway = svc["gateway"]
    assert {s: d["condition"] for s, d in gateway["depends_on"].items()} == dict.fromkeys(
        STAGES, "service_healthy"
    )
    args = cli_args(gateway["command"])
    assert args.command == "serve" and args.service == "gateway"
    assert args.host == "0.0.0.0" and args.http_port == 8000 and args.grpc_port == 50051
    assert {"8000:8000", "50051:50051"} <= set(gateway["ports"])
    for stage in STAGES:
        (entry,) = getattr(args, stage)
        target = Target.parse(stage, entry)
        assert target.dynamic and target.host == stage and target.port == 50051
    assert float(flag(gateway["command"], "--discovery-interval")) <= 10
    assert "OMNISTREAM_API_KEY" in gateway["environment"]


def mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short syntax, relative to the file)."""
    out = {}
    for volume in service["volumes"]:
        host, container, *_ = volume.split(":")
        out[container] = (COMPOSE / host).resolve()
    return out


def mounted(service: dict, container_path: str) -> Path:
    """The host file behind `container_path` inside the service (a mounted file or folder)."""
    for target, host in mounts(service).items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return host / Path(container_path).relative_to(target)
    raise AssertionError(f"{container_path} is not mounted: {service['volumes']}")


def test_prometheus_scrapes_every_service_with_the_deploy_config_and_rules():
    """One scrape config (deploy/prometheus/), mounted with the rules it loads; its targets are
    the services' metrics ports; under the profile, like the collector."""
    svc = services()
    prometheus = svc["prometheus"]
    assert prometheus["profiles"] == ["observability"]
    (config_flag,) = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    config_path = mounted(prometheus, config_flag.split("=", 1)[1])
    assert config_path == PROMETHEUS / "prometheus.yml"
    assert not (COMPOSE / "prometheus.yml").exists()  # one source, no stale copy beside the compose file
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:  # relative to the config file: inside the same mount
        assert (config_path.parent / rule_file).is_file(), rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_port = cli_args(svc["gateway"]["command"]).http_port
    assert jobs["gateway"]["static_configs"][0]["targets"] == [f"gateway:{gateway_port}"]
    for stage in STAGES:
        (sd,) = jobs[stage]["dns_sd_configs"]  # every replica's address, not one of them
        metrics_port = cli_args(svc[stage]["command"], {"OMNISTREAM_MODEL": "/m"}).metrics_port
        assert sd["names"] == [stage] and sd["type"] == "A" and sd["port"] == metrics_port


def test_otel_collector_receives_what_the_services_are_pointed_at():
    """The collector (profile observability) listens for OTLP/gRPC where the documented endpoint
    points, prints traces with its debug exporter, and every omnistream service gets the standard
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT from the environment of `docker compose up`, empty (off)
    when unset."""
    svc = services()
    collector = svc["otel-collector"]
    assert collector["profiles"] == ["observability"]
    assert collector["image"].startswith("otel/opentelemetry-collector:")
    (config_flag,) = [a for a in collector["command"] if a.startswith("--config=")]
    config_path = mounted(collector, config_flag.split("=", 1)[1])
    assert config_path == OTEL / "collector.yaml"
    config = yaml.safe_load(config_path.read_text())
    grpc_port = int(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1])
    assert grpc_port == 4317 and f"{grpc_port}:{grpc_port}" in collector["ports"]
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and "debug" in traces["exporters"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(traces.get(kind, [])) <= set(config.get(kind) or {}), kind  # all defined
    for name in (*STAGES, "gateway"):
        env = svc[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:-}", name
    (documented,) = set(re.findall(r"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=(\S+)", FILES[0].read_text()))
    endpoint = urlsplit(documented)
    assert endpoint.hostname == "otel-collector" and endpoint.port == grpc_port
    # A service of the default stack that waited on a profiled one would not start without it.
    for name in (*STAGES, "gateway"):
        assert not set(svc[name].get("depends_on", {})) & set(OBSERVABILITY), name


def test_checkpoint_override_mounts_a_real_model_into_every_stage():
    override = yaml.safe_load(FILES[1].read_text())["services"]
    assert set(override) == set(STAGES)
    for stage in STAGES:
        (volume,) = override[stage]["volumes"]
        assert volume["read_only"] is True
        assert override[stage]["environment"]["OMNISTREAM_MODEL"] == volume["target"]


def test_gpu_override_gives_each_stage_its_own_gpu_and_the_same_command_on_cuda():
    base = services()
    override = yaml.safe_load(FILES[2].read_text())["services"]
    assert set(override) == set(STAGES)
    gpus = []
    for stage in STAGES:
        command = override[stage]["command"]
        args = cli_args(command, {"OMNISTREAM_MODEL": "/models/tiny"})
        assert args.stage == stage and args.device == "cuda" and args.dtype == "auto"
        # Everything but the device is the base stack's command (the override replaces it whole).
        assert [a for a in command if a not in ("--device", "cuda")] == base[stage]["command"]
        (device,) = override[stage]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus += device["device_ids"]
    assert len(gpus) == len(set(gpus)) == len(STAGES)  # one GPU per stage, none shared


def test_vllm_override_adds_a_vllm_thinker_under_the_thinker_name():
    """One more thinker, on vLLM: its own image and GPU, the checkpoint, and the `thinker` alias, so
    the gateway's `dns:///thinker:50051` finds both thinkers."""
    ((name, service),) = yaml.safe_load(FILES[3].read_text())["services"].items()
    assert name == "thinker-vllm"
    args = cli_args(service["command"], service["environment"])
    assert args.stage == "thinker" and args.backend == "vllm" and args.device == "cuda"
    assert service["build"]["dockerfile"] == "deploy/docker/Dockerfile.vllm"
    assert service["networks"]["default"]["aliases"] == ["thinker"]
    (volume,) = service["volumes"]
    assert volume["read_only"] is True and volume["target"] == service["environment"]["OMNISTREAM_MODEL"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    gpu_override = yaml.safe_load(FILES[2].read_text())["services"]
    taken = {
        d
        for s in gpu_override.values()
        for d in s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    }
    assert device["driver"] == "nvidia" and not set(device["device_ids"]) & taken
    assert service["healthcheck"]["test"] == ["CMD", "omnistream", "health", "127.0.0.1:50051"]
