"""Production shape, validated offline: docker-compose.yml and the Kubernetes manifests.

No Docker engine or Kubernetes runs here. The compose file is checked by Debian's
``docker-compose`` (1.29, ``config -q`` parses, validates and interpolates without an
engine; scripts/test.sh installs it); the manifests by ``kubernetes-validate`` against
the Kubernetes 1.30 OpenAPI schemas in strict mode (unknown fields are errors). Both
are also checked for what schemas cannot see: service addresses that point at real
services and ports, secrets only by reference, one Dockerfile per service.
"""

from __future__ import annotations

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
              "MINIO_ROOT_PASSWORD": "secret", "COULER_AUTH_TOKEN": "token"}


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
        dockerfile = services[name]["build"]["dockerfile"]
        assert dockerfile == f"services/{name}/Dockerfile"


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
    sensitive = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY|DATABASE_URL")
    for path, doc in manifests():
        assert doc["kind"] != "Secret", f"{path}: secret values do not belong in the repository"
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                if sensitive.search(var["name"]):
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], var


def test_generated_manifests_are_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_deploy.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
