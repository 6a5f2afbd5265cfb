"""deploy/prometheus and deploy/grafana against the real stack, scraped by a real Prometheus.

promtool checks the alert rules and the scrape config. Then one stack (the three stages on the
tiny checkpoint and a gateway admitting one request at a time, real processes on ephemeral
loopback ports) serves a few audio chat completions, one that the test holds open and then drops
and one refused with 429, while the `prometheus` binary (Debian's package: `make sysdeps`) scrapes
every /metrics endpoint once a second with the project's alert rules loaded. What Prometheus
answers must be what the test did: the counts of requests finished, refused and opened at each
stage, the underrun histogram's observations, the in-flight gauges while a request is held. The
Grafana dashboard's and the alert rules' expressions may name only metrics a real scrape of the
stack exposes, and each of them must run on that Prometheus.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from omnistream.cli.launcher import ServiceProcess, start_services, stop_services
from omnistream.cli.lifeline import PR_SET_PDEATHSIG
from tests.integration.conftest import STAGES, gateway_args
from tests.procs import wait_until

from .conftest import DEPLOY, run

PROMETHEUS_DIR = DEPLOY / "prometheus"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "omnistream.json"
JOBS = ("gateway", *STAGES)
# Series Prometheus makes itself for every target (not in any /metrics body).
SYNTHETIC = {"up"}
# Grafana's interval variables, as Grafana would fill them in for a short range.
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "5m"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
READY_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 30.0  # the scrape interval is 1 s: a value shows up within a few seconds
COMPLETED = 3  # audio chat completions that run to their end
FRAMES = 12  # codec frames of each (80 ms each)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: `make sysdeps` installs it (Debian package prometheus)")
    return path


def test_promtool_checks_the_rules_and_the_scrape_config():
    promtool = binary("promtool")
    rules = run(promtool, "check", "rules", ALERTS)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    found = int(re.search(r"SUCCESS: (\d+) rules found", rules.stdout).group(1))
    assert found == sum(len(g["rules"]) for g in yaml.safe_load(ALERTS.read_text())["groups"])
    config = run(promtool, "check", "config", CONFIG)
    assert config.returncode == 0, config.stdout + config.stderr
    assert "1 rule files found" in config.stdout  # alerts.yml, found beside the config


def test_promtool_check_is_not_vacuous(tmp_path):
    promtool = binary("promtool")
    bad = tmp_path / "alerts.yml"
    bad.write_text(ALERTS.read_text().replace("histogram_quantile(", "histogram_quantil(", 1))
    result = run(promtool, "check", "rules", bad)
    assert result.returncode != 0 and "histogram_quantil" in result.stdout + result.stderr


def rule_tests() -> list[dict]:
    """promtool rule unit tests: for each alert, synthetic series of the stack's metrics (one
    sample a minute) that show its trouble, the labels it must fire with, and series it must stay
    quiet on."""
    gw = 'job="gateway",instance="gw:8000"'

    def case(series: dict[str, str], at: str, alerts: dict[str, list[dict]]) -> dict:
        return {
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [
                {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": e} for e in expected]}
                for name, expected in alerts.items()
            ],
        }

    warning, critical = {"severity": "warning"}, {"severity": "critical"}
    bucket = 'omnistream_audio_underrun_seconds_bucket{%s,le="%s"}'
    rss = 'process_resident_memory_bytes{job="talker",instance="%s"}'
    gc = 'python_gc_objects_uncollectable_total{job="thinker",instance="%s",generation="0"}'
    return [
        # 1 request in 10 stalls: over 3%; none stalls: quiet.
        case(
            {
                f"omnistream_audio_stalled_requests_total{{{gw}}}": "0+1x30",
                f"omnistream_audio_underrun_seconds_count{{{gw}}}": "0+10x30",
            },
            "15m",
            {"OmnistreamAudioStallsRising": [warning]},
        ),
        case(
            {
                f"omnistream_audio_stalled_requests_total{{{gw}}}": "0x30",
                f"omnistream_audio_underrun_seconds_count{{{gw}}}": "0+10x30",
            },
            "15m",
            {"OmnistreamAudioStallsRising": []},
        ),
        # Every underrun between 0.1 and 0.25 s: p99 over 100 ms; all under 50 ms: quiet.
        case(
            {
                bucket % (gw, le): v
                for le, v in (("0.05", "0x40"), ("0.1", "0x40"), ("0.25", "0+10x40"), ("+Inf", "0+10x40"))
            },
            "25m",
            {"OmnistreamAudioUnderrunP99High": [warning]},
        ),
        case(
            {bucket % (gw, le): "0+10x40" for le in ("0.05", "0.1", "0.25", "+Inf")},
            "25m",
            {"OmnistreamAudioUnderrunP99High": []},
        ),
        # 1 refused (429) for 9 finished: 10%; a 503 is the other alert's.
        case(
            {
                f'omnistream_requests_rejected_total{{{gw},reason="concurrency"}}': "0+1x30",
                f'omnistream_requests_finished_total{{{gw},status="ok"}}': "0+9x30",
            },
            "15m",
            {"OmnistreamRequestsRefused": [warning], "OmnistreamRequestsUnavailable": []},
        ),
        case(
            {
                f'omnistream_requests_rejected_total{{{gw},reason="unavailable"}}': "0+1x30",
                f'omnistream_requests_finished_total{{{gw},status="ok"}}': "0+9x30",
            },
            "15m",
            {"OmnistreamRequestsUnavailable": [critical], "OmnistreamRequestsRefused": []},
        ),
        # One talker of two down: that target, not the stage; the only code2wav down: both.
        case(
            {
                'up{job="talker",instance="a:9090"}': "0x10",
                'up{job="talker",instance="b:9090"}': "1x10",
                'up{job="code2wav",instance="c:9090"}': "0x10",
            },
            "5m",
            {
                "OmnistreamTargetDown": [
                    {**warning, "job": "talker", "instance": "a:9090"},
                    {**warning, "job": "code2wav", "instance": "c:9090"},
                ],
                "OmnistreamStageDown": [{**critical, "job": "code2wav"}],
            },
        ),
        # The gateway's view of its replicas: one talker out of rotation, no code2wav in rotation.
        case(
            {
                f'omnistream_stage_replicas{{{gw},stage="talker",state="out_of_rotation"}}': "1x20",
                f'omnistream_stage_replicas{{{gw},stage="talker",state="in_rotation"}}': "1x20",
                f'omnistream_stage_replicas{{{gw},stage="code2wav",state="in_rotation"}}': "0x20",
                f'omnistream_stage_replicas{{{gw},stage="code2wav",state="out_of_rotation"}}': "0x20",
            },
            "10m",
            {
                "OmnistreamReplicaOutOfRotation": [
                    {**warning, "job": "gateway", "instance": "gw:8000", "stage": "talker"}
                ],
                "OmnistreamStageUnserved": [
                    {**critical, "job": "gateway", "instance": "gw:8000", "stage": "code2wav"}
                ],
            },
        ),
        case(
            {
                'omnistream_stage_orphaned_requests{job="talker",instance="a:9090",stage="talker"}': "1x20",
                'omnistream_stage_orphaned_requests{job="talker",instance="b:9090",stage="talker"}': "0x20",
            },
            "10m",
            {"OmnistreamOrphanedRequests": [{**warning, "job": "talker", "instance": "a:9090"}]},
        ),
        # 20 MB a minute on top of 500 MB: half as large again as an hour before; a flat one: quiet.
        case(
            {rss % "a:9090": "500000000+20000000x200", rss % "b:9090": "500000000x200"},
            "100m",
            {"OmnistreamResidentMemoryGrowing": [{**warning, "job": "talker", "instance": "a:9090"}]},
        ),
        case(
            {
                gc % "t:9090": "0+1x60",
                gc % "u:9090": "0x60",
            },
            "45m",
            {
                "OmnistreamUncollectableObjects": [
                    {"severity": "info", "job": "thinker", "instance": "t:9090"}
                ]
            },
        ),
    ]


def test_alert_rules_fire_on_what_they_describe(tmp_path):
    """`promtool test rules` on rule_tests(): every alert fires on its trouble with the labels its
    annotations name, and not on a healthy stack. The rules are tested without their annotations
    (promtool would compare their rendered text; `promtool check rules` parses the templates)."""
    promtool = binary("promtool")
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    tests = rule_tests()
    (tmp_path / "alerts_test.yml").write_text(
        yaml.safe_dump({"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests})
    )
    result = run(promtool, "test", "rules", tmp_path / "alerts_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    fired = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(alert_names())


def test_alert_rule_tests_are_not_vacuous(tmp_path):
    """A rule whose threshold is off (p99 over 1 s instead of 100 ms) fails its test."""
    promtool = binary("promtool")
    rules = yaml.safe_load(ALERTS.read_text().replace(") > 0.1\n", ") > 1\n", 1))
    assert rules != yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "alerts_test.yml").write_text(
        yaml.safe_dump({"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": rule_tests()})
    )
    result = run(promtool, "test", "rules", tmp_path / "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "OmnistreamAudioUnderrunP99High" in result.stdout + result.stderr


def alert_names() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


# --- PromQL: the metric names an expression reads ---------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: label matchers, strings, ranges, offsets,
    `by (...)`-style label lists, function names, keywords and numbers left out."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    expr = re.sub(r"\boffset\s+\w+", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    # (?<![\w.]): not the exponent of a number (1e-9) nor a digit's tail
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


def test_metric_names_reads_what_an_expression_selects():
    expr = (
        'histogram_quantile(0.99, sum by (stage, le) (rate(omnistream_stage_step_seconds_bucket{job="x",'
        'le="0.1"}[$__rate_interval]))) / on (job) group_left (instance) up offset 1h > bool 1e-9 '
        "and process_resident_memory_bytes unless sum without (kind) (increase(foo:bar_total[5m]))"
    )
    assert metric_names(expr) == {
        "omnistream_stage_step_seconds_bucket",
        "up",
        "process_resident_memory_bytes",
        "foo:bar_total",
    }


def exposed_names(body: str) -> dict[str, str]:
    """Sample name -> metric type of one /metrics body: every sample line's name, and each
    declared family's sample names, also before it has samples (a labelled counter with no child
    yet, `# TYPE x_total counter` alone, declares `x_total`; a histogram `h`, `h_bucket`, `h_sum`
    and `h_count`)."""
    types: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            for suffix in suffixes:
                types[name + suffix] = kind
        elif line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][\w:]*", line).group(0)
            types.setdefault(name, "untyped")
    return types


# --- the stack and its Prometheus -------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tiny_model_dir) -> Iterator[dict[str, ServiceProcess]]:
    """The three stages and a gateway that admits one request at a time and queues none (so a
    second request while one runs is refused with 429 at once)."""
    # The stages' default dtype (float32): nothing here compares outputs, and it starts about a
    # third faster than the float64 of tests/integration's stages.
    services = start_services({s: ["serve", s, "--model", tiny_model_dir] for s in STAGES})
    try:
        services.update(
            start_services({"gateway": gateway_args(services, "--max-concurrency", "1", "--max-queue", "0")})
        )
        yield services
    finally:
        stop_services(services.values())


def metrics_url(name: str, service: ServiceProcess) -> str:
    port = service.http_port if name == "gateway" else service.metrics_port
    return f"http://{service.connect_host}:{port}/metrics"


def scrape_config(stack: dict[str, ServiceProcess]) -> dict:
    """deploy/prometheus/prometheus.yml with its targets pointed at this stack, scraped every
    second: its jobs, metrics paths and rule files, absolute paths for the rules."""
    deployed = yaml.safe_load(CONFIG.read_text())
    jobs = {job["job_name"]: job for job in deployed["scrape_configs"]}
    assert set(JOBS) <= set(jobs), "the deployed config lacks a job the stack has"
    scrapes = []
    for name in JOBS:
        service = stack[name]
        port = service.http_port if name == "gateway" else service.metrics_port
        scrapes.append(
            {
                "job_name": name,
                "metrics_path": jobs[name].get("metrics_path", "/metrics"),
                "static_configs": [{"targets": [f"{service.connect_host}:{port}"]}],
            }
        )
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS_DIR / f) for f in deployed["rule_files"]],
        "scrape_configs": scrapes,
    }


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def listening_ports(pid: int) -> set[int]:
    """TCP ports `pid` listens on (its sockets' inodes found in /proc/net/tcp{,6})."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = fd.readlink().as_posix()
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Prometheus:
    """The HTTP API of a running Prometheus."""

    def __init__(self, url: str, proc: subprocess.Popen, log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def get(self, path: str, **params: str) -> dict:
        reply = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        assert reply.status_code == 200, f"{path} {params}: {reply.status_code} {reply.text}"
        body = reply.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector (or, for a scalar, one sample without labels)."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def values(self, expr: str) -> dict[str, float]:
        """Each series of the query, as a key of its labels (`k=v,...`, sorted), to its value."""
        return {
            ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
            for r in self.query(expr)
        }

    def value(self, expr: str) -> float:
        """The query's one value (0 for no series: a counter never incremented has none)."""
        values = list(self.values(expr).values())
        assert len(values) <= 1, f"{expr}: {values}"
        return values[0] if values else 0.0

    def eventually(self, expr: str, holds: Callable[[float], bool], what: str) -> float:
        """Poll the query until its value holds (Prometheus scrapes every second); its last value."""
        last: list[float] = [0.0]

        def check() -> bool:
            last[0] = self.value(expr)
            return holds(last[0])

        if not wait_until(check, SCRAPE_TIMEOUT_S, 0.25):
            raise AssertionError(f"{what}: {expr} = {last[0]} after {SCRAPE_TIMEOUT_S}s\n{self.log_tail()}")
        return last[0]

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-20:])


@pytest.fixture(scope="module")
def prometheus_exe() -> str:
    """The binary, looked up before the stack starts (a skip should not cost a stack start)."""
    return binary("prometheus")


@pytest.fixture(scope="module")
def prometheus(prometheus_exe, stack, tmp_path_factory) -> Iterator[Prometheus]:
    """`prometheus` on an ephemeral loopback port (port 0, read back from /proc), scraping the
    stack with deploy/prometheus/alerts.yml loaded; ready once /-/ready answers and every target
    has been scraped up; stopped however the module ends."""
    home = tmp_path_factory.mktemp("prometheus")
    config = home / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(stack)))
    log = home / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                prometheus_exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'data'}",
                "--web.listen-address=127.0.0.1:0",
                "--log.level=info",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        ports: set[int] = set()

        def listening() -> bool:
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}:\n{log.read_text()}"
            ports.update(listening_ports(proc.pid))
            return bool(ports)

        assert wait_until(listening, READY_TIMEOUT_S), log.read_text()
        (port,) = ports
        server = Prometheus(f"http://127.0.0.1:{port}", proc, log)

        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200
            return False

        assert wait_until(ready, READY_TIMEOUT_S, 0.2), server.log_tail()
        server.eventually("count(up == 1)", lambda n: n == len(JOBS), "every target scraped")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- traffic, and what Prometheus makes of it -------------------------------------------------------


def chat_body(frames: int | None) -> dict:
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": "Hello"}],
        "modalities": ["text", "audio"],
        "max_tokens": 4,
        "stream": True,
        "seed": 5,  # the tiny checkpoint may sample the end of its speech at once: not this seed's
    }
    if frames is not None:
        body["max_audio_frames"] = frames
    return body


def audio_chunks(lines: list[str]) -> int:
    """SSE events of an answer that carry audio data."""
    return sum(
        1
        for line in lines
        if line.startswith("data: {")
        and ((json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("audio") or {}).get("data")
    )


COUNTERS = {
    "finished ok": 'sum(omnistream_requests_finished_total{job="gateway",status="ok"})',
    "finished": 'sum(omnistream_requests_finished_total{job="gateway"})',
    "refused (concurrency)": 'sum(omnistream_requests_rejected_total{job="gateway",reason="concurrency"})',
    "underrun observations": 'sum(omnistream_audio_underrun_seconds_count{job="gateway"})',
    "underrun +Inf bucket": 'sum(omnistream_audio_underrun_seconds_bucket{job="gateway",le="+Inf"})',
    **{
        f"{stage} requests": f'sum(omnistream_stage_requests_total{{job="{stage}",stage="{stage}"}})'
        for stage in STAGES
    },
}


def test_prometheus_sees_the_traffic_the_test_made(prometheus, stack):
    url = f"http://127.0.0.1:{stack['gateway'].http_port}/v1/chat/completions"
    before = {name: prometheus.value(expr) for name, expr in COUNTERS.items()}

    for _ in range(COMPLETED):
        reply = httpx.post(url, json=chat_body(FRAMES), timeout=120)
        assert reply.status_code == 200, reply.text
        lines = [line for line in reply.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]" and audio_chunks(lines) >= 1, reply.text[-500:]

    # One request held open (audio of its default length, minutes of it: it cannot end by itself
    # before the test drops it), seen in flight at the gateway and streaming at the talker; while
    # it holds the one slot, another is refused.
    with httpx.stream("POST", url, json=chat_body(None), timeout=120) as held:
        assert held.status_code == 200
        events = held.iter_lines()  # kept: a dropped iterator would close the connection
        assert next(events).startswith("data: ")  # the stream has started: the request is admitted
        prometheus.eventually('sum(omnistream_requests_in_flight{job="gateway"})', lambda v: v == 1, "held")
        for stage in ("talker", "code2wav"):  # the thinker is done with its 4 tokens by now
            prometheus.eventually(
                f'sum(omnistream_stage_open_streams{{job="{stage}"}})', lambda v: v == 1, f"held at {stage}"
            )
        refused = httpx.post(url, json=chat_body(FRAMES), timeout=30)
        assert refused.status_code == 429, refused.text
    # Dropped: the gateway and every stage let it go.
    prometheus.eventually('sum(omnistream_requests_in_flight{job="gateway"})', lambda v: v == 0, "dropped")
    prometheus.eventually("sum(omnistream_stage_engine_requests)", lambda v: v == 0, "stages idle")

    admitted = COMPLETED + 1
    expected = {
        "finished ok": COMPLETED,
        "finished": admitted,  # every admitted request ends once, the dropped one too
        "refused (concurrency)": 1,
        "underrun observations": COMPLETED,  # one per completed request with audio
        "underrun +Inf bucket": COMPLETED,
        **{f"{stage} requests": admitted for stage in STAGES},  # a refusal never reaches a stage
    }
    for name, expr in COUNTERS.items():
        prometheus.eventually(
            expr,
            lambda v, name=name: v - before[name] == expected[name],
            f"{name} increased by {expected[name]}",
        )
    # The histogram's buckets are cumulative and end at its count.
    buckets = prometheus.values('sum by (le) (omnistream_audio_underrun_seconds_bucket{job="gateway"})')
    counts = [v for _, v in sorted(((float(k[3:]), v) for k, v in buckets.items()))]
    assert (
        len(counts) > 2
        and counts == sorted(counts)
        and counts[-1] == before["underrun observations"] + COMPLETED
    )
    # Every stage's speed is measured by now (0 would be "unknown").
    capacity = prometheus.values('omnistream_stage_capacity_per_second{job="gateway"}')
    assert {k.split("stage=")[1].split(",")[0] for k in capacity} == set(STAGES)
    assert all(v > 0 for v in capacity.values()), capacity


def test_dashboard_and_alerts_read_only_exported_metrics(prometheus, stack):
    """Every expression of the dashboard and the alert rules names only metrics a real scrape of
    the stack exposes (histograms read through _bucket, _sum or _count), and runs on Prometheus:
    a result wherever its metrics have samples."""
    exposed: dict[str, str] = {}
    with_samples: set[str] = set()
    for name in JOBS:
        body = httpx.get(metrics_url(name, stack[name]), timeout=10).text
        exposed.update(exposed_names(body))
        with_samples |= {m.group(0) for m in re.finditer(r"^[A-Za-z_:][\w:]*", body, re.M)}
    assert {"omnistream_audio_underrun_seconds_bucket", "process_resident_memory_bytes"} <= set(exposed)

    expressions = dashboard_expressions() + [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    assert len(expressions) > 20
    for where, expr in expressions:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - set(exposed) - SYNTHETIC
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the stack ({expr})"
        for name in names:  # _bucket, _sum and _count only of a histogram
            if name.endswith(("_bucket", "_sum", "_count")):
                assert exposed[name] == "histogram", f"{where}: {name} is a {exposed[name]}"
        if "histogram_quantile" in expr:
            assert any(n.endswith("_bucket") for n in names), f"{where}: a quantile of no histogram"
        query = expr
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        result = prometheus.query(query)  # fails on a PromQL error
        if where.startswith("panel") and names <= with_samples | SYNTHETIC and not result:
            # A rate needs two scrapes of a series: one that the test before created (a 429's
            # reason) may have been scraped once so far.
            assert wait_until(lambda q=query: prometheus.query(q), SCRAPE_TIMEOUT_S, 0.25), (
                f"{where}: {query} returns nothing, though its metrics have samples"
            )

    # The rules load and evaluate without error on the stack's series.
    def evaluated() -> bool:
        rules = [r for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
        return {r["name"] for r in rules} == set(alert_names()) and all(
            r["health"] == "ok" and not r.get("lastError") for r in rules
        )

    assert wait_until(evaluated, SCRAPE_TIMEOUT_S, 0.5), prometheus.get("/api/v1/rules")


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard_panels() -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    panels = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])
    return panels


def dashboard_expressions() -> list[tuple[str, str]]:
    return [
        (f"panel {p['title']!r} {t['refId']}", t["expr"])
        for p in dashboard_panels()
        for t in p.get("targets", [])
    ]


def test_dashboard_is_a_grafana_dashboard_on_a_prometheus_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in dashboard_panels():
        assert panel["id"] not in ids, panel["title"]
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": f"${{{variable['name']}}}"}, panel
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"] and target["expr"].strip()
    titles = " ".join(p["title"] for p in dashboard_panels()).lower()
    for topic in (
        "ttft",
        "ttfp",
        "underrun",
        "stall",
        "capacity",
        "in flight",
        "refused",
        "rss",
        "step time",
    ):
        assert topic in titles, f"no panel on {topic}"


pytestmark = pytest.mark.timeout(300)
