"""Steps that need Kubernetes run as pods: ``KubernetesPodOperator`` tasks.

A step whose placement or size only a Kubernetes pod can honour -- CPU / memory
requests or limits, GPUs, a node selector, tolerations or volumes, its own or the
workflow's -- compiles to a ``_CoulerPod`` task, a ``KubernetesPodOperator``
(provider ``apache-airflow-providers-cncf-kubernetes``) subclass written into the
DAG file. Every other step stays a worker subprocess, so a workflow without such
needs runs on any Airflow without a cluster. The pod runs the step's own image;
``_CoulerPod.execute`` applies the step runner's gates (exit-hook status, edges,
depends expression, when) and placeholders before it starts the pod, pushes the
step's outputs (read by a shell wrapper into ``/airflow/xcom/return.json``) as one
XCom each, classifies a failed pod from its container status (``OOMKilled`` ...),
exit code and log tail, and raises the memory limit on a retry after an OOM kill
(``memory_factor``, up to ``memory_ceiling``; earlier tries' pods are kept and read
by their labels).

A pod step's artifacts pass through a PersistentVolumeClaim the workers mount too: the
Airflow Variable ``couler_artifact_claim`` names it and ``couler_artifact_root`` is
``file://PATH``, where the workers mount it; the pod mounts the claim at PATH and a shell
wrapper copies the input artifacts from PATH/RUN_ID/STEP/NAME to the paths the step reads
before its command and the output artifacts there after it (the image needs ``/bin/sh``
and ``cp``, as for outputs). Without those Variables the step fails, naming them.

Not carried by a pod step (refused): maps, loops, artifacts with their own location, and
claim-template volumes mounted by more than one step (a pod's ephemeral volume is not
shared).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from couler import ir
from couler.engines.base import Feature

__all__ = ["POD_RUNTIME", "XCOM_RETURN", "needs_pod", "pod_kwargs"]

XCOM_RETURN = "/airflow/xcom/return.json"  # what KubernetesPodOperator's sidecar reads
_SCRIPT_FLAG = {ir.ScriptLanguage.PYTHON: "-c", ir.ScriptLanguage.BASH: "-c",
                ir.ScriptLanguage.SH: "-c"}
Fail = Callable[[str, Feature, str], Exception]


def needs_pod(wf: ir.Workflow, step: ir.Step) -> bool:
    """Whether ``step`` asks for what only a Kubernetes pod gives."""
    resources = step.resources if step.resources is not None else wf.defaults.resources
    return bool(resources is not None or step.node_selector or wf.node_selector
                or step.tolerations or wf.tolerations or step.volume_mounts)


@dataclass(frozen=True)
class _Call:
    """A constructor call in the generated source, e.g. ``k8s.V1Toleration(key='a')``."""

    func: str
    fields: tuple[tuple[str, Any], ...]


def _k8s(kind: str, **fields: Any) -> _Call:
    return _Call(f"k8s.{kind}", tuple((k, v) for k, v in fields.items()
                                      if v not in (None, "", {}, [])))


def _render(value: Any, indent: str) -> str:
    """Source text of ``value`` (calls, lists, dicts, literals), one item per line when
    the one-line form would pass 80 characters."""
    flat = _flat(value)
    if len(flat) + len(indent) <= 80:
        return flat
    inner = indent + "    "
    if isinstance(value, _Call):
        items = [f"{inner}{k}={_render(v, inner)},\n" for k, v in value.fields]
        return f"{value.func}(\n" + "".join(items) + f"{indent})"
    if isinstance(value, list):
        return "[\n" + "".join(f"{inner}{_render(v, inner)},\n" for v in value) + f"{indent}]"
    if isinstance(value, dict):
        items = [f"{inner}{k!r}: {_render(v, inner)},\n" for k, v in value.items()]
        return "{\n" + "".join(items) + f"{indent}}}"
    return flat


def _flat(value: Any) -> str:
    if isinstance(value, _Call):
        return f"{value.func}({', '.join(f'{k}={_flat(v)}' for k, v in value.fields)})"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_flat(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _resources(res: ir.Resources) -> _Call:
    requests = {k: v for k, v in (("cpu", res.cpu_request), ("memory", res.memory_request))
                if v}
    limits = {k: v for k, v in (("cpu", res.cpu_limit), ("memory", res.memory_limit)) if v}
    if res.gpu:
        limits[res.gpu_resource] = str(res.gpu)
    return _k8s("V1ResourceRequirements", requests=requests, limits=limits)


def pod_kwargs(wf: ir.Workflow, step: ir.Step, claim_users: dict[str, int], fail: Fail,
               indent: str) -> tuple[list[str], dict[str, Any]]:
    """The keyword arguments (source text, continuation lines indented by ``indent``) of
    the step's ``_CoulerPod`` and what its STEPS entry adds (memory escalation)."""
    for what, value in (("a map", step.foreach), ("a loop", step.loop)):
        if value is not None:
            raise fail(step.name, Feature.MAP_STATIC if what == "a map" else Feature.LOOP,
                       f"{what} of a Kubernetes pod step (resources / placement) is not "
                       "generated: the pod operator runs one command")
    for a in step.input_artifacts:
        if not isinstance(a.source, ir.StepArtifactRef):
            raise fail(step.name, Feature.ARTIFACTS, f"input artifact {a.name!r} reads its "
                       "own location: a pod step (resources / placement) reads artifacts from "
                       "the artifact store's claim only")
    for o in step.output_artifacts:
        if o.location is not None and o.location != ir.ArtifactLocation():
            raise fail(step.name, Feature.ARTIFACTS, f"output artifact {o.name!r} has its own "
                       "location: a pod step (resources / placement) writes artifacts to the "
                       "artifact store's claim only")
    body = step.body
    if isinstance(body, ir.ContainerSpec):
        argv = [*body.command, *body.args]
        image, pull = body.image, body.image_pull_policy
    elif isinstance(body, ir.ScriptSpec):
        interpreter = list(body.command) or [body.language.value]
        argv = [*interpreter, _SCRIPT_FLAG[body.language], body.source, *body.args]
        image, pull = body.image, body.image_pull_policy
    else:  # pragma: no cover - jobs are rejected by the capability check
        raise fail(step.name, Feature.JOB, "not a container or script step")
    if not argv:
        raise fail(step.name, Feature.CONTAINER, "a pod step needs a command (the image's "
                   "entrypoint cannot be wrapped to collect outputs)")
    fields: list[tuple[str, Any]] = [
        ("name", step.name), ("image", image), ("cmds", argv[:1]), ("arguments", argv[1:]),
        ("get_logs", True),
        ("on_finish_action", "delete_succeeded_pod"),  # failed pods: read on retry
        ("do_xcom_push", bool(step.outputs))]  # outputs: see _couler_wrapper
    if pull:
        fields.append(("image_pull_policy", pull))
    if wf.tenant:
        fields.append(("namespace", wf.tenant))
    if wf.service_account:
        fields.append(("service_account_name", wf.service_account))
    if wf.image_pull_secrets:
        fields.append(("image_pull_secrets", [_k8s("V1LocalObjectReference", name=n)
                                              for n in wf.image_pull_secrets]))
    env = [_k8s("V1EnvVar", name=v.name, value=v.value) for v in step.env if v.secret is None]
    if env:
        fields.append(("env_vars", env))
    secrets = [_Call("Secret", (("deploy_type", "env"), ("deploy_target", v.name),
                                ("secret", v.secret.name), ("key", v.secret.key)))
               for v in step.env if v.secret is not None]
    if secrets:
        fields.append(("secrets", secrets))
    resources = step.resources if step.resources is not None else wf.defaults.resources
    if resources is not None:
        fields.append(("container_resources", _resources(resources)))
    selector = dict(wf.node_selector) | dict(step.node_selector)
    if selector:
        fields.append(("node_selector", selector))
    tolerations = [*wf.tolerations, *step.tolerations]
    if tolerations:
        fields.append(("tolerations", [
            _k8s("V1Toleration", key=t.key, operator=t.operator, value=t.value,
                 effect=t.effect, toleration_seconds=t.toleration_seconds)
            for t in tolerations]))
    if step.volume_mounts:
        volumes, mounts = _volumes(wf, step, claim_users, fail)
        fields += [("volumes", volumes), ("volume_mounts", mounts)]
    kwargs = [f"{k}={_render(v, indent)}" for k, v in fields]
    extra: dict[str, Any] = {}
    retry = step.retry if step.retry is not None else wf.defaults.retry
    if retry is not None and retry.memory_factor is not None:
        extra["memory"] = {"factor": retry.memory_factor, "ceiling": retry.memory_ceiling}
    return kwargs, extra


def _volumes(wf: ir.Workflow, step: ir.Step, claim_users: dict[str, int],
             fail: Fail) -> tuple[list[_Call], list[_Call]]:
    by_name = {v.name: v for v in wf.volumes}
    volumes: list[_Call] = []
    mounts: list[_Call] = []
    for m in step.volume_mounts:
        vol = by_name.get(m.name)
        if vol is None:
            raise fail(step.name, Feature.VOLUMES, f"volume {m.name!r} is not declared")
        ref = vol.claim_name or vol.name
        if vol.kind is ir.VolumeKind.PVC:
            source = ("persistent_volume_claim",
                      _k8s("V1PersistentVolumeClaimVolumeSource", claim_name=ref))
        elif vol.kind is ir.VolumeKind.CONFIG_MAP:
            source = ("config_map", _k8s("V1ConfigMapVolumeSource", name=ref))
        elif vol.kind is ir.VolumeKind.SECRET:
            source = ("secret", _k8s("V1SecretVolumeSource", secret_name=ref))
        elif vol.kind is ir.VolumeKind.EMPTY_DIR:
            source = ("empty_dir", _k8s("V1EmptyDirVolumeSource"))
        else:  # a claim made per workflow: a pod's generic ephemeral volume
            if claim_users.get(vol.name, 0) > 1:
                raise fail(step.name, Feature.VOLUMES,
                           f"the claim template {vol.name!r} is mounted by several steps: "
                           "each pod's ephemeral volume would be its own, not shared")
            claim = _k8s("V1PersistentVolumeClaimSpec",
                         access_modes=list(vol.access_modes) or ["ReadWriteOnce"],
                         storage_class_name=vol.storage_class,
                         resources=_k8s("V1VolumeResourceRequirements",
                                        requests={"storage": vol.size or "1Gi"}))
            source = ("ephemeral", _k8s(
                "V1EphemeralVolumeSource",
                volume_claim_template=_k8s("V1PersistentVolumeClaimTemplate", spec=claim)))
        volumes.append(_Call("k8s.V1Volume", (("name", vol.name), source)))
        mounts.append(_k8s("V1VolumeMount", name=vol.name, mount_path=m.mount_path,
                           read_only=m.read_only or None, sub_path=m.sub_path))
    return volumes, mounts


# Written into DAG files with pod steps, after the step runner (_RUNTIME).
POD_RUNTIME = r'''
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator  # noqa: E402
from airflow.providers.cncf.kubernetes.secret import Secret  # noqa: E402, F401
from kubernetes.client import models as k8s  # noqa: E402

_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
             "m": 1e-3, "": 1}


def _couler_quantity(text: str) -> float:
    """A Kubernetes quantity ("512Mi", "1G", "100m") as a number."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text.strip())
    if m is None or m.group(2) not in _QUANTITY:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(m.group(1)) * _QUANTITY[m.group(2)]


def _couler_pod_tries(op: Any, context: Any) -> list[tuple[str, int | None, str]]:
    """This task instance's pods (every try, kept when they failed), oldest first:
    (the base container's termination reason, exit code, pod name)."""
    try:
        labels = op._get_ti_pod_labels(context, include_try_number=False)
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = op.client.list_namespaced_pod(op.namespace or "default",
                                             label_selector=selector).items
    except Exception:  # noqa: BLE001 - no cluster access: nothing known of earlier tries
        return []
    tries = []
    for pod in sorted(pods, key=lambda p: int(p.metadata.labels.get("try_number", "0"))):
        for status in (pod.status.container_statuses or []) if pod.status else []:
            done = status.state.terminated if status.state else None
            if status.name == "base" and done is not None:
                tries.append((done.reason or "", done.exit_code, pod.metadata.name))
    return tries


def _couler_escalate(op: Any, context: Any, memory: dict[str, Any]) -> None:
    """Raise the memory request / limit by factor ** (OOM-killed earlier tries), capped."""
    ooms = sum(1 for reason, _, _ in _couler_pod_tries(op, context) if reason == "OOMKilled")
    res = op.container_resources
    if not ooms or res is None:
        return
    ceiling = _couler_quantity(memory["ceiling"]) if memory["ceiling"] else None
    for values in (res.requests, res.limits):
        if values and "memory" in values:
            raised = _couler_quantity(values["memory"]) * memory["factor"] ** ooms
            values["memory"] = str(int(min(raised, ceiling) if ceiling else raised))
    print(f"couler: {ooms} earlier tries were OOM-killed: memory {res.limits}", flush=True)


# awk: a file as one JSON string (escapes backslashes, quotes, tabs, returns, newlines;
# printf of fixed strings only, which every awk reads the same way)
_COULER_AWK = r"""BEGIN { printf "\"" }
{ if (NR > 1) printf "\\n"
  for (i = 1; i <= length($0); i++) {
    c = substr($0, i, 1)
    if (c == "\\") printf "\\\\"
    else if (c == "\"") printf "\\\""
    else if (c == "\t") printf "\\t"
    else if (c == "\r") printf "\\r"
    else printf "%s", c
  }
}
END { printf "\"" }"""


def _couler_wrapper(outputs: list[dict[str, Any]],
                    target: str = "/airflow/xcom/return.json") -> str:
    """A POSIX shell script running "$@" and writing the step's outputs as one JSON
    object to ``target``, the file the pod operator reads."""
    lines = ['out=$(mktemp)', '"$@" > "$out"', "rc=$?", 'cat "$out"',
             '[ "$rc" -eq 0 ] || exit "$rc"', f"mkdir -p {shlex.quote(os.path.dirname(target))}",
             "{", "printf '{'"]
    for i, out in enumerate(outputs):
        path = '"$out"' if out["source"] == "stdout" else shlex.quote(out["path"])
        key = ("," if i else "") + json.dumps(out["name"]) + ": "
        lines.append(f"printf '%s' {shlex.quote(key)}")
        lines.append(f"awk {shlex.quote(_COULER_AWK)} {path} || exit 1")
    lines += ["printf '}'", f"}} > {shlex.quote(target)}"]
    return "\n".join(lines)


ARTIFACT_CLAIM_VARIABLE = "couler_artifact_claim"  # a claim the workers mount too


def _couler_artifact_wrapper(step: str, spec: dict[str, Any], run: str) -> str:
    """A POSIX shell script copying the step's input artifacts from ``run`` (the claim's
    RUN_ID directory) to their paths, running "$@", then copying its output artifacts back
    -- the layout the workers' artifact store has (a file, or a directory tree)."""
    q = shlex.quote
    lines = []
    for art in spec.get("input_artifacts", []):
        src, dest = q(f"{run}/{art['from']['key']}"), q(art["path"])
        why = q(f"couler: step {step}: input artifact {art['name']} is missing at ")
        lines += [f"[ -e {src} ] || {{ echo {why}{src} >&2; exit 1; }}",
                  f'mkdir -p "$(dirname {dest})" && rm -rf {dest} && cp -R {src} {dest} || '
                  "exit 1"]
    lines += ['"$@"', "rc=$?", '[ "$rc" -eq 0 ] || exit "$rc"']
    for art in spec.get("output_artifacts", []):
        src, dest = q(art["path"]), q(f"{run}/{art['to']['key']}")
        why = q(f"couler: step {step}: output artifact {art['name']} was not written at ")
        lines += [f"[ -e {src} ] || {{ echo {why}{src} >&2; exit 1; }}",
                  f'mkdir -p "$(dirname {dest})" && rm -rf {dest} && cp -R {src} {dest} || '
                  "exit 1"]
    return "\n".join(lines)


def _couler_artifact_mount(step: str, spec: dict[str, Any]) -> tuple[str, str]:
    """(claim, path): where a pod step's artifacts are, from the Airflow Variables."""
    claim = Variable.get(ARTIFACT_CLAIM_VARIABLE, default=None)
    root = Variable.get(ARTIFACT_ROOT_VARIABLE, default=None) or ""
    if not claim or not root.startswith("file:///"):
        raise AirflowFailException(
            f"step {step}: a pod step's artifacts pass through a PersistentVolumeClaim the "
            f"workers mount too: set the Airflow Variables {ARTIFACT_CLAIM_VARIABLE} (the "
            f"claim's name) and {ARTIFACT_ROOT_VARIABLE} (file://PATH, where the workers "
            f"mount it; the pod mounts it at PATH); now {ARTIFACT_CLAIM_VARIABLE}="
            f"{claim!r}, {ARTIFACT_ROOT_VARIABLE}={root!r}")
    for art in spec.get("input_artifacts", []) + spec.get("output_artifacts", []):
        where = art.get("from") or art.get("to") or {}
        if "key" not in where:
            raise AirflowFailException(
                f"step {step}: artifact {art['name']!r} is not in the artifact store (it has "
                "its own location): a pod step reads and writes the claim only")
    return claim, root[len("file://"):].rstrip("/") or "/"


class _CoulerPod(KubernetesPodOperator):
    """A step run as a Kubernetes pod: the step runner's gates and placeholders first,
    then the pod; its outputs pushed one XCom each; a failure classified from the pod."""

    template_fields = ("couler_xcoms",)  # no Jinja in commands: placeholders are Couler's

    def __init__(self, *, couler_step: str, couler_xcoms: dict[str, Any],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.couler_step = couler_step
        self.couler_xcoms = couler_xcoms

    def execute(self, context: Any) -> Any:
        step, spec = self.couler_step, STEPS[self.couler_step]
        fill = _couler_gate(step, spec, self.couler_xcoms, None)
        self.cmds = [fill(word) for word in self.cmds]
        self.arguments = [fill(word) for word in self.arguments]
        if spec["outputs"]:
            self.cmds, self.arguments = (["sh", "-c", _couler_wrapper(spec["outputs"]),
                                          "couler", *self.cmds, *self.arguments], [])
        if spec.get("input_artifacts") or spec.get("output_artifacts"):
            claim, path = _couler_artifact_mount(step, spec)
            self.volumes = [*(self.volumes or []), k8s.V1Volume(
                name="couler-artifacts", persistent_volume_claim=(
                    k8s.V1PersistentVolumeClaimVolumeSource(claim_name=claim)))]
            self.volume_mounts = [*(self.volume_mounts or []), k8s.V1VolumeMount(
                name="couler-artifacts", mount_path=path)]
            run = f"{path.rstrip('/')}/{context['run_id']}"
            self.cmds, self.arguments = (["sh", "-c", _couler_artifact_wrapper(step, spec, run),
                                          "couler", *self.cmds, *self.arguments], [])
        for var in self.env_vars or []:
            if getattr(var, "value", None) is not None:
                var.value = fill(var.value)
        cache = _couler_cache(step, spec, fill, None)
        if cache is not None and cache.get("outputs") is not None:
            for name, value in cache["outputs"].items():
                context["ti"].xcom_push(key=name, value=value)
            return cache["outputs"]
        if spec.get("memory"):
            _couler_escalate(self, context, spec["memory"])
        try:
            result = super().execute(context)
        except AirflowTaskTimeout:
            _couler_failed(step, spec, None, "", timed_out=True)
            raise
        except (AirflowSkipException, AirflowFailException):
            raise
        except Exception as exc:
            tries = _couler_pod_tries(self, context)
            reason, code, name = tries[-1] if tries else ("", None, "")
            log = ""
            if name:
                try:
                    log = self.client.read_namespaced_pod_log(
                        name, self.namespace or "default", container="base", tail_lines=200)
                except Exception:  # noqa: BLE001 - the log is gone: classify without it
                    pass
            try:
                _couler_failed(step, spec, code, log or str(exc), reason=reason)
            except AirflowFailException:
                raise
            except RuntimeError as failed:
                raise failed from exc
        outputs: dict[str, Any] = {}
        for out in spec["outputs"]:
            value = str((result or {}).get(out["name"], "")).strip()
            if out["type"] == "list":
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            outputs[out["name"]] = value
            context["ti"].xcom_push(key=out["name"], value=value)
        _couler_cache_put(cache, outputs)
        return result
'''
