"""Gateway metrics (gateway/serving/metrics.py): the replica gauges read the gateway's view at each
scrape, and the process collectors make the gateway's RSS and GC visible like the stages'."""

from __future__ import annotations

from prometheus_client import generate_latest

from gateway.serving.metrics import GatewayMetrics


def _samples(metrics: GatewayMetrics) -> dict[str, float]:
    out = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_replica_gauges_follow_the_gateways_view_at_each_scrape():
    metrics = GatewayMetrics()
    rotation = {"talker": [True, False, True], "code2wav": [False]}
    metrics.watch_replicas(rotation, lambda stage, rotating: sum(r == rotating for r in rotation[stage]))
    seen = _samples(metrics)
    assert seen["omnistream_stage_replicas{stage=talker,state=in_rotation}"] == 2
    assert seen["omnistream_stage_replicas{stage=talker,state=out_of_rotation}"] == 1
    assert seen["omnistream_stage_replicas{stage=code2wav,state=in_rotation}"] == 0
    rotation["code2wav"][0] = True  # back in rotation: the next scrape says so
    assert _samples(metrics)["omnistream_stage_replicas{stage=code2wav,state=in_rotation}"] == 1


def test_the_gateway_exports_its_process_and_gc_metrics():
    text = generate_latest(GatewayMetrics().registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= names
    assert "python_gc_objects_uncollectable_total" in names
