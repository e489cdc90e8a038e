"""Production shape, validated offline: docker-compose.yml and the Kubernetes manifests.

No Docker engine or Kubernetes runs here. The compose file is checked by Debian's
``docker-compose`` (1.29, ``config -q`` parses, validates and interpolates without an
engine; scripts/test.sh installs it); the manifests by ``kubernetes-validate`` against
the Kubernetes 1.30 OpenAPI schemas in strict mode (unknown fields are errors). Both
are also checked for what schemas cannot see: service addresses that point at real
services and ports, secrets only by reference, one Dockerfile per service.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
SERVICES = ("generator", "optimizer", "cache", "submitter", "monitor")
K8S_VERSION = "1.30.0"
SECRET_ENV = {"POSTGRES_PASSWORD": "pw", "MINIO_ROOT_USER": "user",
              "MINIO_ROOT_PASSWORD": "secret", "COULER_AUTH_TOKEN": "token",
              **{f"COULER_NATS_SEED_{n.upper()}": f"SU-{n}" for n in (*SERVICES, "admin")}}


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is missing: scripts/test.sh installs it "
                    "(apt-get install docker-compose)", pytrace=False)
    clean = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    return subprocess.run([binary, "-f", str(COMPOSE), *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


def test_compose_file_is_valid() -> None:
    proc = compose("config", "-q", env=SECRET_ENV)
    assert proc.returncode == 0, proc.stderr


def test_compose_refuses_to_start_without_the_secrets() -> None:
    proc = compose("config", "-q")
    assert proc.returncode != 0 and "set POSTGRES_PASSWORD" in proc.stderr
    no_seed = {k: v for k, v in SECRET_ENV.items() if k != "COULER_NATS_SEED_OPTIMIZER"}
    proc = compose("config", "-q", env=no_seed)
    assert proc.returncode != 0 and "couler credentials init" in proc.stderr


def test_compose_runs_an_authenticated_bus() -> None:
    services = resolved_compose()["services"]
    nats = services["nats"]
    command = nats["command"]
    assert command[command.index("-c") + 1] == "/etc/nats/nats.conf"
    assert "-m" not in command and "healthcheck" not in nats  # /connz answers anyone
    assert any(v.startswith("./bus/nats.conf:") or "/bus/nats.conf:" in v
               for v in nats["volumes"])
    setup = services["bus-setup"]
    assert setup["command"][-2:] == ["bus", "setup"]
    assert setup["environment"]["COULER_NATS_SEED"] == "SU-admin"


def test_compose_validation_catches_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace('ports: ["50051:50051"]',
                                                  'ports: "50051:50051"'))
    binary = shutil.which("docker-compose")
    assert binary is not None
    proc = subprocess.run([binary, "-f", str(broken), "config", "-q"],
                          env={**os.environ, **SECRET_ENV}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode != 0 and "ports" in proc.stderr


def resolved_compose() -> dict[str, Any]:
    proc = compose("config", env=SECRET_ENV)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = yaml.safe_load(proc.stdout)
    return data


def test_compose_has_the_stack_and_wires_addresses_to_real_ports() -> None:
    services = resolved_compose()["services"]
    assert {"nats", "postgres", "minio", "otel-collector", *SERVICES} <= set(services)
    ports = {name: services[name]["environment"]["COULER_GRPC_ADDRESS"].rsplit(":", 1)[1]
             for name in SERVICES}
    for name in SERVICES:
        env = services[name]["environment"]
        for other in SERVICES:
            assert env[f"COULER_{other.upper()}_ADDRESS"] == f"{other}:{ports[other]}"
        assert env["COULER_NATS_URL"] == "nats://nats:4222"
        assert "-js" in services["nats"]["command"]
        # its own bus identity, the deployment's public keys, after the streams exist
        assert env["COULER_NATS_SEED"] == f"SU-{name}"
        assert env["COULER_NATS_TRUST_FILE"] == "/etc/couler/bus/trust.json"
        assert any(v.endswith(":/etc/couler/bus/trust.json:ro")
                   for v in services[name]["volumes"])
        assert services[name]["depends_on"]["bus-setup"]["condition"] == \
            "service_completed_successfully"
        assert "COULER_BUS_INSECURE" not in env
        dockerfile = services[name]["build"]["dockerfile"]
        assert dockerfile == f"services/{name}/Dockerfile"


def test_the_packages_bring_the_drivers_the_deployment_names() -> None:
    """compose's ``postgresql+psycopg://`` URLs need psycopg in every image (each installs
    ``./libs/runtime``); the core library carries no dependency it never imports."""
    import tomllib

    def deps(path: str) -> list[str]:
        return [re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in tomllib.loads(
            (ROOT / path).read_text())["project"]["dependencies"]]

    env = resolved_compose()["services"]["submitter"]["environment"]
    assert env["COULER_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "psycopg" in deps("libs/runtime/pyproject.toml")
    assert "hera" not in deps("libs/core/pyproject.toml")
    for name in SERVICES:
        assert "./libs/runtime" in (ROOT / "services" / name / "Dockerfile").read_text(), name


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_has_its_own_dockerfile(name: str) -> None:
    text = (ROOT / "services" / name / "Dockerfile").read_text()
    assert f"COPY services/{name} " in text
    assert re.search(rf'CMD \["couler-{name}"\]', text)
    assert "USER " in text  # not root
    pyproject = (ROOT / "services" / name / "pyproject.toml").read_text()
    assert f'couler-{name} = "couler_{name}.main:main"' in pyproject


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def test_kubernetes_manifests_validate_strictly() -> None:
    docs = manifests()
    assert len(docs) >= 12
    for path, doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"].get("namespace", "couler") == "couler", path


def test_strict_validation_rejects_unknown_fields() -> None:
    _, doc = next((p, d) for p, d in manifests() if d["kind"] == "Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_service_has_a_deployment_service_and_grpc_probes() -> None:
    docs = manifests()
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    for name in SERVICES:
        assert ("Deployment", name) in kinds and ("Service", name) in kinds
    config = next(d for _, d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "couler-config")
    ports = {d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]}
             for _, d in docs if d["kind"] == "Service"}
    for key, value in config["data"].items():
        if key.endswith("_ADDRESS"):
            host, port = value.split(":")
            assert int(port) in ports[host], key
    for _, d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"] in SERVICES:
            (container,) = d["spec"]["template"]["spec"]["containers"]
            probe = container["readinessProbe"]["grpc"]
            grpc_port = next(p["containerPort"] for p in container["ports"]
                             if p["name"] == "grpc")
            assert probe["port"] == grpc_port


def test_secrets_are_references_never_values() -> None:
    sensitive = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY|DATABASE_URL|SEED")
    for path, doc in manifests():
        assert doc["kind"] != "Secret", f"{path}: secret values do not belong in the repository"
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                if sensitive.search(var["name"]):
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], var


def test_generated_manifests_are_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_deploy.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_kubernetes_services_connect_as_their_own_bus_identity() -> None:
    for _, d in manifests():
        if d["kind"] == "Deployment" and d["metadata"]["name"] in SERVICES:
            name = d["metadata"]["name"]
            (container,) = d["spec"]["template"]["spec"]["containers"]
            refs = [v["valueFrom"]["secretKeyRef"] for v in container["env"]
                    if v["name"] == "COULER_NATS_SEED"]
            assert refs == [{"name": "couler-bus", "key": f"seed-{name}"}]
            assert {"name": "bus-trust", "mountPath": "/etc/couler/bus",
                    "readOnly": True} in container["volumeMounts"]
    nats = next(d for _, d in manifests() if d["kind"] == "StatefulSet")
    args = nats["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["-c", "/etc/nats/nats.conf"] and "-m" not in args
    job = next(d for _, d in manifests() if d["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["bus", "setup"]


@pytest.mark.parametrize("tls", [False, True])
def test_credentials_for_kubernetes_are_valid_objects(tmp_path: Path, tls: bool) -> None:
    """What `couler credentials init DIR --kubernetes` writes: the objects the manifests
    reference, valid for the API server, one seed per identity."""
    from couler_runtime.bus_keys import BusFiles

    files = BusFiles.create(tmp_path / "bus", tls=tls)
    objects = files.kubernetes_objects()
    for doc in objects:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    by_name = {d["metadata"]["name"]: d for d in objects}  # type: ignore[index]
    seeds = by_name["couler-bus"]["stringData"]
    assert set(seeds) == {f"seed-{n}" for n in (*SERVICES, "admin")}
    config = by_name["couler-nats-config"]["stringData"]["nats.conf"]
    assert str(tmp_path) not in config  # no path of this machine in the cluster's config
    assert ("/etc/nats/server.pem" in config) is tls
    assert "trust.json" in by_name["couler-bus-trust"]["data"]
    lines = files.env_lines()
    assert {line.split("=", 1)[0] for line in lines} == {
        f"COULER_NATS_SEED_{n.upper()}" for n in (*SERVICES, "admin")}


# ---------------------------------------------------------------------------- metrics

PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "couler.json"


def test_compose_runs_prometheus_scraping_every_service_with_the_token() -> None:
    services = resolved_compose()["services"]
    prometheus = services["prometheus"]
    assert any(v.endswith(":/etc/prometheus/prometheus.yml:ro") or
                   v.get("target") == "/etc/prometheus/prometheus.yml"
               for v in prometheus["volumes"] if isinstance(v, (str, dict)))
    # its UI has no login: published on the host's loopback only
    assert all(str(p).startswith("127.0.0.1:") or
                   (isinstance(p, dict) and p.get("host_ip") == "127.0.0.1")
               for p in prometheus.get("ports", []))
    command = " ".join(prometheus["command"])
    assert "/prometheus/couler-token" in command and "COULER_AUTH_TOKEN" in command
    assert prometheus["environment"]["COULER_AUTH_TOKEN"] == "token"

    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = config["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer",
                                    "credentials_file": "/prometheus/couler-token"}
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    wanted = set()
    for name in SERVICES:
        env = services[name]["environment"]
        port = env["COULER_METRICS_ADDRESS"].rsplit(":", 1)[1]
        assert env["COULER_METRICS_ADDRESS"].startswith("0.0.0.0:")
        assert "COULER_METRICS_ANONYMOUS" not in env  # scrapes need the token
        assert not any(str(p).endswith(f":{port}") for p in services[name].get("ports", []))
        wanted.add(f"{name}:{port}")
    assert targets == wanted


def dashboard_exprs() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_the_grafana_dashboard_uses_the_metrics_the_services_export() -> None:
    from couler_runtime.metrics import METRIC_NAMES

    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    used: set[str] = set()
    for title, expr in exprs:
        names = set(re.findall(r"\bcouler_[a-z_]+", expr))
        assert names, title
        for name in names:
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert base in METRIC_NAMES, f"panel {title!r}: {name} is not exported"
            used.add(base)
    assert used == METRIC_NAMES, f"no panel for {sorted(METRIC_NAMES - used)}"


def test_the_dashboard_check_catches_a_misspelt_metric(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "couler.json"
    broken.write_text(DASHBOARD.read_text().replace("couler_cache_lookups_total",
                                                    "couler_cache_lookup_total"))
    monkeypatch.setattr(sys.modules[__name__], "DASHBOARD", broken)
    with pytest.raises(AssertionError, match="couler_cache_lookup_total is not exported"):
        test_the_grafana_dashboard_uses_the_metrics_the_services_export()


def test_kubernetes_services_serve_metrics_with_the_token() -> None:
    for _, d in manifests():
        if d["kind"] == "Deployment" and d["metadata"]["name"] in SERVICES:
            (container,) = d["spec"]["template"]["spec"]["containers"]
            env = {v["name"]: v for v in container["env"]}
            port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
            assert env["COULER_METRICS_ADDRESS"]["value"] == f"0.0.0.0:{port}"
            assert "COULER_METRICS_ANONYMOUS" not in env
            assert "secretKeyRef" in env["COULER_AUTH_TOKEN"]["valueFrom"]
        if d["kind"] == "Service" and d["metadata"]["name"] in SERVICES:
            assert "metrics" in {p["name"] for p in d["spec"]["ports"]}
