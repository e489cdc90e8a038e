"""Generate the Kubernetes manifests of the five services: deploy/k8s/10-NAME.yaml.

Usage: ``python scripts/gen_deploy.py [--check]``. The services differ only in name,
port and a few settings, so they are one table (:data:`SERVICES`) rendered into a
Deployment and a Service each; ``--check`` exits non-zero when a file differs from
what would be generated (run by tests/integration/test_deploy.py). Shared settings
come from the ConfigMap ``couler-config``, secret values from the Secret
``couler-secrets`` (by key, never inline); the probes use the gRPC health service.

Each service connects to NATS as its own identity: its nkey seed from the Secret
``couler-bus`` (key ``seed-<service>``; only its own key is referenced) and the public keys
of all identities from the ConfigMap ``couler-bus-trust`` (mounted at
``/etc/couler/bus/trust.json``). Both are made by ``couler credentials init DIR
--kubernetes`` (``kubectl apply -f DIR/kubernetes.yaml``), never committed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "deploy" / "k8s"
IMAGE = "ghcr.io/couler-dev/couler-{name}:0.2.0"
METRICS_PORT = 9464  # /metrics for Prometheus (docs/metrics.md), scraped with the token


@dataclass(frozen=True)
class Service:
    name: str
    port: int
    memory: str = "512Mi"
    http_port: int | None = None  # the dashboard
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)  # VAR -> key in couler-secrets


SERVICES = (
    Service("generator", 50051,
            env={"COULER_LLM_BASE_URL": "", "COULER_LLM_MODEL": ""},
            secret_env={"COULER_LLM_API_KEY": "llm-api-key"}),
    Service("optimizer", 50052),
    Service("cache", 50053, env={"COULER_CACHE_BUDGET_BYTES": "10737418240"}),
    Service("submitter", 50054, memory="1Gi"),
    Service("monitor", 50055, http_port=8080, env={"COULER_DASHBOARD_ADDRESS": "0.0.0.0:8080"}),
)

COMMON_SECRETS = {
    "COULER_AUTH_TOKEN": "auth-token",
    "COULER_DATABASE_URL": "database-url",
    "COULER_S3_ACCESS_KEY": "s3-access-key",
    "COULER_S3_SECRET_KEY": "s3-secret-key",
}


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "couler",
            "app.kubernetes.io/component": "service"}


def manifests(svc: Service) -> list[dict[str, object]]:
    labels = _labels(svc.name)
    ports = [{"name": "grpc", "containerPort": svc.port},
             {"name": "metrics", "containerPort": METRICS_PORT}]
    service_ports = [{"name": "grpc", "port": svc.port, "targetPort": svc.port},
                     {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT}]
    if svc.http_port is not None:
        ports.append({"name": "http", "containerPort": svc.http_port})
        service_ports.append({"name": "http", "port": svc.http_port,
                              "targetPort": svc.http_port})
    env: list[dict[str, object]] = [{"name": "COULER_GRPC_ADDRESS",
                                     "value": f"0.0.0.0:{svc.port}"},
                                    {"name": "COULER_METRICS_ADDRESS",
                                     "value": f"0.0.0.0:{METRICS_PORT}"}]
    env += [{"name": k, "value": v} for k, v in sorted(svc.env.items())]
    secrets = {**COMMON_SECRETS, **svc.secret_env}
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": "couler-secrets", "key": v,
                                                       "optional": k == "COULER_LLM_API_KEY"}}}
            for k, v in sorted(secrets.items())]
    env.append({"name": "COULER_NATS_SEED",
                "valueFrom": {"secretKeyRef": {"name": "couler-bus", "key": f"seed-{svc.name}"}}})
    probe = {"grpc": {"port": svc.port, "service": f"couler.v1.{svc.name.capitalize()}Service"},
             "periodSeconds": 10}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": svc.name, "namespace": "couler", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": svc.name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                    "containers": [{
                        "name": svc.name,
                        "image": IMAGE.format(name=svc.name),
                        "ports": ports,
                        "envFrom": [{"configMapRef": {"name": "couler-config"}}],
                        "env": env,
                        "readinessProbe": probe,
                        "livenessProbe": {**probe, "failureThreshold": 6},
                        "resources": {"requests": {"cpu": "100m", "memory": svc.memory},
                                      "limits": {"memory": svc.memory}},
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": False},
                        "volumeMounts": [{"name": "bus-trust", "mountPath": "/etc/couler/bus",
                                          "readOnly": True}],
                    }],
                    "volumes": [{"name": "bus-trust",
                                 "configMap": {"name": "couler-bus-trust"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc.name, "namespace": "couler", "labels": labels},
        "spec": {"selector": {"app.kubernetes.io/name": svc.name}, "ports": service_ports},
    }
    return [deployment, service]


def render(svc: Service) -> str:
    head = (f"# Generated by scripts/gen_deploy.py: the {svc.name} service. Do not edit.\n")
    return head + yaml.safe_dump_all(manifests(svc), sort_keys=False)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for svc in SERVICES:
        path = OUT / f"10-{svc.name}.yaml"
        text = render(svc)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    if stale:
        print("stale (run python scripts/gen_deploy.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
