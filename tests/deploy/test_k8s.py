"""deploy/k8s: every manifest valid under kubernetes-validate (strict, a fixed Kubernetes version),
both variants rendered with kustomize and validated again, and the wiring checked.

No cluster is reachable here, so nothing is applied: strict schema validation catches wrong fields
and types, and the tests below check what a schema cannot (Services select their pods and are
headless, probes hit the gRPC port, grace periods outlast the drain, the gateway's ConfigMap loads
and names the stage Services, the GPU variant requests GPUs and mounts the checkpoint).
"""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from gateway.cluster.discovery import Target
from gateway.config import GatewayConfig

from .conftest import DEPLOY, cli_args, flag, run, tool

K8S = DEPLOY / "k8s"
MONITORING = K8S / "monitoring"  # optional: needs the Prometheus Operator's CRDs
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
STAGES = ("thinker", "talker", "code2wav")
LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/component")


def resource_files() -> list:
    """Every file a kustomization lists as a resource (patches are checked once rendered); the
    ServiceMonitors are custom resources no Kubernetes schema knows (checked on their own below)."""
    files = []
    for kustomization in sorted(K8S.glob("*/kustomization.yaml")):
        if kustomization.parent == MONITORING:
            continue
        for entry in yaml.safe_load(kustomization.read_text())["resources"]:
            path = kustomization.parent / entry
            if path.is_file():
                files.append(path)
    return files


def load(*paths) -> list[dict]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def validate(*paths) -> None:
    validator = tool("kubernetes-validate")
    result = run(validator, "--strict", "--kubernetes-version", KUBERNETES_VERSION, "--quiet", *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def render(variant: str, tmp_path) -> tuple[list[dict], object]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered")
    result = run(kubectl, "kustomize", K8S / variant)
    assert result.returncode == 0, result.stderr
    out = tmp_path / f"{variant}.yaml"
    out.write_text(result.stdout)
    return load(out), out


def test_every_manifest_passes_strict_validation():
    files = resource_files()
    assert {f.name for f in files} >= {
        "namespace.yaml",
        "configmap.yaml",
        "otel.yaml",
        "thinker.yaml",
        "talker.yaml",
        "code2wav.yaml",
        "gateway.yaml",
        "pdb.yaml",
        "hpa.yaml",
        "checkpoint-pvc.yaml",
    }
    validate(*files)


def test_validation_is_not_vacuous(tmp_path):
    bad = tmp_path / "talker.yaml"
    bad.write_text((K8S / "base" / "talker.yaml").read_text().replace("grpc:\n", "grcp:\n", 1))
    validator = tool("kubernetes-validate")
    result = run(validator, "--strict", "--kubernetes-version", KUBERNETES_VERSION, "--quiet", bad)
    assert result.returncode != 0 and "grcp" in result.stdout + result.stderr


VARIANTS = ["base", "gpu", "gpu-vllm"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_variants_pass_strict_validation(variant, tmp_path):
    docs, path = render(variant, tmp_path)
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"}
    validate(path)


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, str]:
    """The container's literal env values (those from a ConfigMap or Secret are not known here)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_stages_have_headless_services_grpc_probes_and_resources():
    docs = load(*sorted((K8S / "base").glob("*.yaml")))
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    for stage in STAGES:
        pod = deployments[stage]["spec"]["template"]
        selector = deployments[stage]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        service = services[stage]["spec"]
        assert service["clusterIP"] == "None"  # headless: DNS lists every ready pod
        assert service["selector"] == selector
        container = _container(deployments[stage])
        args = cli_args(container["args"], _env(container))
        assert args.command == "serve" and args.stage == stage and args.host == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"grpc": args.port, "metrics": args.metrics_port}
        assert {p["name"]: p["targetPort"] for p in service["ports"]} == {
            "grpc": "grpc",
            "metrics": "metrics",
        }
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == args.port, (stage, probe)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        assert grace > args.grace_seconds, f"{stage}: the kill would come before the drain ends"


def test_gateway_config_names_the_stage_services(tmp_path):
    docs = load(*sorted((K8S / "base").glob("*.yaml")))
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    gateway = _container(deployments["gateway"])
    args = cli_args(gateway["args"])
    config_path = flag(gateway["args"], "--config")
    (mount,) = gateway["volumeMounts"]
    assert config_path.startswith(mount["mountPath"] + "/")
    (volume,) = deployments["gateway"]["spec"]["template"]["spec"]["volumes"]
    configmap = by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]
    config_file = config_path.rsplit("/", 1)[1]
    path = tmp_path / config_file
    path.write_text(configmap["data"][config_file])
    config = GatewayConfig.from_yaml(path)
    config.validate()
    for stage in STAGES:
        (entry,) = getattr(config, stage)
        target = Target.parse(stage, entry)
        assert target.dynamic and target.host == stage  # the headless Service, found by DNS
        grpc_port = {p["name"]: p["port"] for p in services[stage]["spec"]["ports"]}["grpc"]
        assert target.port == grpc_port
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": config.http_port, "grpc": config.grpc_port}
    for probe in ("readinessProbe", "livenessProbe"):
        assert gateway[probe]["grpc"]["port"] == config.grpc_port
    (key,) = [e for e in gateway["env"] if e["name"] == "OMNISTREAM_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"]["optional"] is True
    assert deployments["gateway"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
    assert args.config == config_path


def test_disruption_budgets_and_autoscalers_match_their_targets():
    docs = load(*sorted((K8S / "base").glob("*.yaml")))
    deployments = by_kind(docs, "Deployment")
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert set(budgets) == {*STAGES, "gateway"}
    for name, budget in budgets.items():
        assert (
            budget["spec"]["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
        )
        assert budget["spec"]["minAvailable"] == 1
    autoscalers = by_kind(docs, "HorizontalPodAutoscaler")
    assert autoscalers
    for hpa in autoscalers.values():
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        assert hpa["spec"]["minReplicas"] >= 2
        # a Deployment's own replica count would fight the autoscaler on every apply
        assert "replicas" not in deployments[target["name"]]["spec"]


def test_gpu_variant_requests_gpus_and_mounts_the_checkpoint(tmp_path):
    docs, _ = render("gpu", tmp_path)
    deployments = by_kind(docs, "Deployment")
    (claim,) = by_kind(docs, "PersistentVolumeClaim").values()
    for stage in STAGES:
        spec = deployments[stage]["spec"]["template"]["spec"]
        container = _container(deployments[stage])
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        args = cli_args(container["args"], _env(container))
        assert args.device == "cuda"
        volumes = {v["name"]: v for v in spec["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if volumes[m["name"]].get("persistentVolumeClaim")]
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert mount["readOnly"] is True
        assert _env(container)["OMNISTREAM_MODEL"] == mount["mountPath"]
        assert spec["terminationGracePeriodSeconds"] > args.grace_seconds
    assert "nvidia.com/gpu" not in _container(deployments["gateway"])["resources"].get("limits", {})


def test_gpu_vllm_variant_adds_one_vllm_thinker_the_gateway_knows(tmp_path):
    """A mixed deployment: the transformers thinker (media) and a vLLM thinker of its own
    Deployment and headless Service (the other's selector never matches its pods), both in the
    gateway's thinker list, the vLLM one on a GPU with the checkpoint and its own image."""
    docs, _ = render("gpu-vllm", tmp_path)
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    vllm = deployments["thinker-vllm"]
    container = _container(vllm)
    args = cli_args(container["args"], _env(container))
    assert args.stage == "thinker" and args.backend == "vllm" and args.device == "cuda"
    assert container["image"].startswith("omnistream-vllm:")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert _env(container)["OMNISTREAM_MODEL"] == "/models/qwen3-omni"
    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == args.port
    pod_labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert services["thinker-vllm"]["spec"]["selector"].items() <= pod_labels.items()
    assert services["thinker-vllm"]["spec"]["clusterIP"] == "None"
    thinker_selector = deployments["thinker"]["spec"]["selector"]["matchLabels"]
    assert not thinker_selector.items() <= pod_labels.items()
    assert deployments["thinker"]["spec"]["replicas"] == 1
    thinker = _container(deployments["thinker"])
    assert cli_args(thinker["args"], _env(thinker)).backend == "transformers"
    configmap = by_kind(docs, "ConfigMap")["omnistream-gateway"]
    config = yaml.safe_load(configmap["data"]["gateway.yaml"])
    assert config["stages"]["thinker"] == ["dns:///thinker:50051", "dns:///thinker-vllm:50051"]


def _component(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_carry_scrape_annotations_and_the_traces_endpoint(variant, tmp_path):
    """Every pod says where its metrics are (prometheus.io/scrape, port, path: the port its
    container serves them on), and every container takes OTEL_EXPORTER_OTLP_TRACES_ENDPOINT from
    the omnistream-otel ConfigMap, which is in the variant and empty (tracing off) by default."""
    docs, _ = render(variant, tmp_path)
    configmaps = by_kind(docs, "ConfigMap")
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) >= {*STAGES, "gateway"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        container = _container(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        metrics_port = ports["http"] if _component(deployment) == "gateway" else ports["metrics"]
        if _component(deployment) != "gateway":
            assert cli_args(container["args"], _env(container)).metrics_port == metrics_port, name
        assert annotations["prometheus.io/scrape"] == "true", name
        assert int(annotations["prometheus.io/port"]) == metrics_port, name
        assert annotations["prometheus.io/path"] == "/metrics", name
        (otel,) = [e for e in container["env"] if e["name"] == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        ref = otel["valueFrom"]["configMapKeyRef"]
        assert ref["optional"] is True, name  # a cluster without the ConfigMap still starts
        assert configmaps[ref["name"]]["data"][ref["key"]] == "", name


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In/NotIn) against a set of labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        inside = value in expression["values"]
        if inside != {"In": True, "NotIn": False}[expression["operator"]]:
            return False
    return True


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus' `replace` relabeling (anchored regex, $n in the replacement), enough for a
    ServiceMonitor's relabelings."""
    labels = dict(labels)
    for rule in rules:
        source = ";".join(labels.get(s, "") for s in rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), source)
        if match:
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["targetLabel"]] = match.expand(replacement)  # an unmatched group: ""
    return labels


def test_service_monitors_scrape_every_service_under_the_jobs_the_rules_use(tmp_path):
    """deploy/k8s/monitoring (kept out of the variants: it needs the Operator's CRDs): its
    ServiceMonitors select every Service of the stack, on a port that Service has, and name each
    target's job as deploy/prometheus/prometheus.yml does (the jobs the alert rules select)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered")
    result = run(kubectl, "kustomize", MONITORING)
    assert result.returncode == 0, result.stderr
    monitors = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert monitors and {(d["apiVersion"], d["kind"]) for d in monitors} == {
        ("monitoring.coreos.com/v1", "ServiceMonitor")
    }
    for variant in VARIANTS:  # a plain `kubectl apply -k` of a variant needs no CRD
        docs, _ = render(variant, tmp_path)
        assert not any(d["apiVersion"].startswith("monitoring.coreos.com/") for d in docs), variant
    jobs = {
        j["job_name"]
        for j in yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    }
    docs, _ = render("gpu-vllm", tmp_path)  # every Service there is: the vLLM thinker's too
    services = by_kind(docs, "Service")
    scraped: dict[str, str] = {}
    for service_name, service in services.items():
        labels = service["metadata"]["labels"]
        for monitor in monitors:
            if monitor["metadata"]["namespace"] != service["metadata"]["namespace"]:
                continue
            if not _selects(monitor["spec"]["selector"], labels):
                continue
            ports = {p["name"] for p in service["spec"]["ports"]}
            for endpoint in monitor["spec"]["endpoints"]:
                assert endpoint["port"] in ports, (monitor["metadata"]["name"], service_name)
                assert endpoint.get("path", "/metrics") == "/metrics"
                meta = {
                    f"__meta_kubernetes_service_label_{re.sub(r'[^A-Za-z0-9_]', '_', k)}": v
                    for k, v in labels.items()
                }
                target = _relabel(endpoint.get("relabelings", []), {"job": service_name, **meta})
                assert service_name not in scraped, f"{service_name} is scraped twice"
                scraped[service_name] = target["job"]
    assert set(scraped) == set(services)
    assert set(scraped.values()) <= jobs and set(scraped.values()) == {*STAGES, "gateway"}
    assert scraped["thinker-vllm"] == "thinker"  # a thinker, whatever its backend
