"""Compile a Couler IR workflow into a Kubeflow Pipelines v2 ``PipelineSpec`` with the KFP SDK.

:func:`compile_workflow` builds a ``@dsl.pipeline`` dynamically from an
:class:`couler.ir.Workflow` and compiles it with ``kfp.compiler.Compiler``; the
result is the compiled ``PipelineSpec`` (KFP IR YAML, ``schemaVersion 2.1.0``)
as plain data. The SDK is imported lazily inside the functions, so this module
(and :data:`CAPABILITIES` / :data:`LIMITS`) imports without ``kfp``; kfp pins
``protobuf < 7``, so it lives in its own environment ``.venv-kfp``
(``scripts/setup-engine-venv.sh kfp``).

Shape of the output (the faithful, container mode):

* Every step is a KFP container component named after the step (its task in
  ``root.dag.tasks`` carries the step name). A container step runs its image,
  command and args; a script step runs the interpreter on the source
  (``python -c SOURCE`` / ``bash -c`` / ``sh -c``, or the step's interpreter
  command followed by ``-c``).
* Inputs become component input parameters (names made into Python identifiers:
  ``para-a-0`` → ``para_a_0``); ``{{inputs.NAME}}`` (also inside script
  sources, like the Argo and Tekton compilers) becomes
  ``{{$.inputs.parameters['NAME']}}``. Literal inputs are passed as their text
  (command lines are text), workflow parameters keep their type, upstream
  outputs keep the upstream output's type.
* STDOUT / PATH outputs become ``dsl.OutputPath`` outputs. The command then
  runs under a ``/bin/sh -c`` wrapper (the image needs ``/bin/sh``) whose
  positional arguments are the output files followed by the command: stdout is
  captured, echoed back to the log and written with trailing newlines removed
  (Argo's ``outputs.result``); a file output's content is written the same way
  (trailing newlines removed, as the local engine does). The step fails when
  the command fails or an output file is missing. A
  ``working_dir`` also uses the wrapper (``cd DIR``), since the KFP container
  spec has no working directory.
* Dependencies become ``.after()``. KFP forbids dependencies into a ``dsl.If``
  from outside it, so a conditional step that others depend on sits in a
  sub-pipeline (below), which they follow whether it ran or was skipped (rule
  S1). A step reached only if a conditional step ran (a succeeded-only edge from
  it, and the plain dependents after such a step: rule S2) runs under that
  condition too, as a nested ``dsl.If`` in its own sub-pipeline. Reading the
  output of a conditional step is rejected (no ``dsl.OneOf`` mapping).
* ``when`` becomes ``dsl.If`` on the upstream output (``==``, ``!=``, ``<``,
  ``>``, ``<=``, ``>=``); the else branch is a ``dsl.If`` with the negated
  operator (equivalent to ``dsl.Else`` and independent of step order). A string
  output compared by an ordering operator with a number is declared a float
  output, so KFP compares numbers, not strings.
* A map becomes ``dsl.ParallelFor`` over static items (leaf values rendered as
  text) or over an upstream list output (declared ``list``), with
  ``parallelism``. A later step reads one output of a mapped step as a list in item
  order: ``dsl.Collected`` of it (the output of the sub-pipeline holding an upstream-driven
  map, below); a second output of the same mapped step is rejected.
* Tune steps: :func:`couler.optimize.tune.expand_tune` rewrites them into rounds of ask
  task, mapped trials and tell task (reading the collected objectives), then the best
  task; ``{{workflow.uid}}`` (the run, in the study's name) becomes
  ``{{$.pipeline_job_uuid}}`` (local mode: the run's log directory). No pruning (KFP
  sets environment variables to literals, so a trial cannot be told its trial number).
* A step whose map or condition an upstream task output drives, and a conditional or
  guarded step (above), sits in a sub-pipeline (task ``couler-STEP``): the values the
  step reads (and its conditions compare) become the sub-pipeline's inputs
  (``couler_in_0``, ...) and its ``ParallelFor`` / ``If`` iterates over / compares an
  input. kfp.local (2.17.3) resolves loop items and condition operands over a task
  output only when that output is named ``Output`` (a Python component's return
  value), so the flat form does not run there (the map fails, the condition is
  silently false); the sub-pipeline runs the same on kfp.local and on a KFP backend.
* Retries → ``set_retry`` (back-off base / factor / cap), resources →
  ``set_cpu_request`` / ``set_cpu_limit`` / ``set_memory_*`` /
  ``set_accelerator_*``, env literals → ``set_env_variable``. KFP caches every
  task by default; Couler does not, so a step without a cache policy gets
  ``set_caching_options(False)``.
* Retry by failure class: KFP retries every failure, so a policy naming classes runs
  the command under the POSIX-sh retry wrapper of :mod:`couler.compilers.entrypoint`
  (no ``set_retry`` then).
* Memory escalation on OOM: KFP fixes a task's memory for its retries, so the step
  becomes a ladder of tasks ("rungs"), one per memory level
  (:func:`couler.compilers.kube.memory_levels`: as written, then times the factor up to
  the ceiling, at most ``limit + 1``): task ``STEP`` and tasks ``STEP-memK`` (each its
  own component, ``set_memory_limit`` / ``set_memory_request`` of its level). A rung runs
  the command under the retry wrapper, stopping at an out-of-memory failure (the last
  rung retries it in place), with the attempts made before it as an input (counted
  against the limit, indexing the back-off), and writes the outputs ``couler_class`` and
  ``couler_attempts``; it exits 0 only when it hands over (its last attempt ended out of
  memory, attempts are left, a rung follows; its other outputs are empty then), else with
  the command's exit code, so a genuine failure fails the run. Rung k (2..N) sits in a
  nested sub-pipeline ``couler-STEP-memK`` taking rung k-1's class and attempts (and the
  values the step reads) as inputs, under ``dsl.If(couler_class == "oom")``, followed by
  rung k+1's sub-pipeline -- conditions over pipeline inputs, which kfp.local resolves.
  Dependents run after the outer sub-pipeline task. A step that is mapped, looped,
  conditional, an exit hook, on or before a failed / completed / any edge, or whose
  outputs or artifacts other steps read (dsl.OneOf is not mapped) is rejected. Each rung
  is a component of its own: kfp 2.17 renames a sub-pipeline's executor labels one after
  another when merging it, which would put same-named components of different memory on
  one executor.
* Exit hooks: one ``any``, ``failed`` or ``error`` hook step becomes the
  ``dsl.ExitHandler`` exit task, which KFP runs whatever the outcome. A
  ``failed`` / ``error`` one also receives ``dsl.PipelineTaskFinalStatus`` and
  runs the step's command only when the state is not ``SUCCEEDED`` (otherwise
  it succeeds at once with empty outputs); KFP does not tell infrastructure
  errors apart, so an ``error`` hook runs on every failure, like ``failed``. A
  second such hook step is rejected: ``dsl.ExitHandler`` takes one exit task
  and handlers do not nest. ``succeeded`` hook steps are tasks after every
  workflow step, inside the handler when there is one (KFP forbids
  dependencies into it): a run that fails never reaches them.
* Artifacts are KFP artifacts (``system.Artifact``): an output artifact is a
  ``dsl.Output[dsl.Artifact]`` the wrapper fills by copying the step's path into
  ``{{$.outputs.artifacts['X'].path}}`` after the command (a missing one fails the
  step); an input artifact from a step is a ``dsl.Input[dsl.Artifact]`` fed by that
  step's output and copied to the step's path before the command. In local mode
  the output is moved into the artifact (a container's files end with it).
* An inline sub-workflow is a nested ``@dsl.pipeline`` (a sub-DAG task named
  after the step) of its steps, built by a builder of its own; group-level
  settings on it are rejected (set them on its steps).
* A bounded loop is unrolled (at most :data:`MAX_UNROLL` iterations): the first
  iteration is the step's task; iteration k (2..N) sits in a nested pipeline
  ``couler-STEP-iterK`` taking iteration k-1's outputs, running the step under
  ``dsl.If`` (the loop condition) and then iteration k+1. Dependents run after the
  whole chain; reading a looped step's outputs is rejected.
* Edge conditions: a step on one ``failed`` / ``completed`` / ``any`` edge runs
  after its upstream whatever its outcome (``.ignore_upstream_failure()``); a
  ``failed`` / ``completed`` one also reads the upstream's
  ``PipelineTaskFinalStatus`` and runs the command only on ``FAILED`` (failed) or
  ``SUCCEEDED`` / ``FAILED`` (completed), like the gated exit hook above. The KFP
  backend runs such a task as an Argo exit hook of its upstream task, outside the
  DAG: it must have that one edge and no dependents, and its upstream must be a
  plain task (docs/semantics.md E3, E6, E7). Other outcomes and ``depends``
  expressions are rejected.
* Kubernetes settings go through the kfp-kubernetes extension (``kfp.kubernetes``;
  the ``PlatformSpec``, returned under ``platforms``): node selectors and
  tolerations (the step's replace the workflow's), secret env vars, volumes (an
  existing claim, a claim template made by a ``CreatePVC`` task and removed by a
  ``DeletePVC`` task after its users, empty dirs, config map and secret volumes),
  step timeouts (pod ``activeDeadlineSeconds``), pod labels, image pull policy and
  secrets, run-as user / group / non-root.
* A job step (KFP v2 has no resource step) is a container component of
  ``bitnami/kubectl`` running :mod:`couler.compilers.kube_job`'s script, the one
  Tekton's job step runs: it writes the manifest (owned by the step's pod, whose name
  and uid come from the downward API, ``kubernetes.use_field_path_as_env``), runs the
  action, polls the success / failure conditions and writes the outputs (JSONPath, jq
  ``.``) to the component's output parameters (the script's arguments). The pod runs
  under the run's service account, which needs RBAC on the resource; kfp-kubernetes
  sets no service account per task. Local mode refuses it (it needs a cluster).
* A cron schedule is not part of a PipelineSpec: :func:`recurring_schedule` gives
  the KFP recurring-run settings the KFP adapter creates the recurring run with.
* Workflow parameters become pipeline parameters; a workflow timeout and TTL go
  to ``dsl.PipelineConfig`` (``active_deadline_seconds``,
  ``ttl_seconds_after_finished``).

Local mode (``local=True`` in :func:`build_pipeline`, used by
:func:`run_locally`): ``kfp.local``'s ``SubprocessRunner`` runs only
lightweight Python components (container components need the DockerRunner and
a Docker engine). In local mode every step becomes a lightweight Python
component whose body runs the step's command on the host in a subprocess
(script steps: the current Python interpreter, or ``bash`` / ``sh``, with
``-c SOURCE``; container steps: the command and args as-is, so they must be
host commands such as ``echo`` or ``sh``), then writes the outputs like the
wrapper above. The image is not used. Graph, conditions, maps, exit hooks,
retries and parameters are the same as in container mode. Kubernetes settings
are not applied (kfp.local ignores them): secret values come from
:func:`run_locally`'s ``secrets``, and each volume mount path is rewritten to a
host directory shared by the run's steps (as the local engine does). An edge
handler also skips when its upstream never ran (kfp.local reports such a task
FAILED; the KFP backend never starts the handler).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

from couler import ir
from couler.engines.base import check_capabilities, plain_edges
from couler.errors import UserError
from couler.optimize.tune import expand_tune

from ._builder import _Builder
from ._capabilities import CAPABILITIES, ENGINE, LIMITS, MAX_UNROLL
from ._helpers import LOCAL_DIR_ENV, LOCAL_SECRETS_ENV, _import, recurring_schedule

__all__ = [
    "CAPABILITIES",
    "ENGINE",
    "LIMITS",
    "LOCAL_DIR_ENV",
    "LOCAL_SECRETS_ENV",
    "MAX_UNROLL",
    "LocalRunError",
    "build_pipeline",
    "compile_workflow",
    "recurring_schedule",
    "run_locally",
    "split_platform_spec",
]


# --------------------------------------------------------------------------- public API


def compile_workflow(wf: ir.Workflow, *, validate: bool = True) -> dict[str, Any]:
    """Compile ``wf`` into a KFP ``PipelineSpec`` (plain data) with the KFP SDK.

    When a step uses the kfp-kubernetes extension (node selectors, tolerations,
    volumes, secrets, timeouts...), kfp writes a second YAML document, the
    ``PlatformSpec`` (``{"platforms": {"kubernetes": ...}}``); it is returned
    under the top-level key ``platforms`` of the same dict. :func:`split_platform_spec`
    separates the two again (KFP's API takes them as ``pipeline_spec`` /
    ``platform_spec``, a package file as two YAML documents).

    Raises:
        couler.errors.UserError: kfp is not installed.
        couler.errors.ValidationError: the workflow is invalid.
        couler.errors.UnsupportedFeatureError: the workflow uses a feature KFP cannot
            express (the message names the step and feature).
    """
    _import("kfp")
    yaml = _import("yaml")
    compiler = _import("kfp.compiler")
    pipeline = build_pipeline(wf, validate=validate)
    with tempfile.TemporaryDirectory(prefix="couler-kfp-") as tmp:
        path = os.path.join(tmp, "pipeline.yaml")
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=path)
        with open(path, encoding="utf-8") as fh:
            docs = list(yaml.safe_load_all(fh))
    doc = docs[0] if docs else None
    if not isinstance(doc, dict):
        raise UserError(f"workflow {wf.name!r}: kfp produced no pipeline spec")
    for extra in docs[1:]:  # the PlatformSpec: {"platforms": {"kubernetes": ...}}
        if isinstance(extra, dict):
            doc.update(extra)
    return doc


def split_platform_spec(doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split :func:`compile_workflow`'s result into ``(pipeline_spec, platform_spec)``.

    ``platform_spec`` is ``{}`` when the pipeline sets no platform configuration,
    else ``{"platforms": {...}}`` (the second document of a kfp package file).
    """
    spec = {k: v for k, v in doc.items() if k != "platforms"}
    return spec, ({"platforms": doc["platforms"]} if "platforms" in doc else {})


def build_pipeline(wf: ir.Workflow, *, validate: bool = True, local: bool = False,
                   workdir: str | None = None) -> Any:
    """Build the ``@dsl.pipeline`` (a kfp ``GraphComponent``) for ``wf``.

    ``local=True`` builds the local mode (lightweight Python components running
    the steps on the host, see the module docstring); it writes the generated
    component source into ``workdir`` (a new temporary directory when None).
    """
    _import("kfp")
    if validate:
        ir.validate(wf)
    wf = plain_edges(wf)  # A.Succeeded from a step without a when is a plain edge
    # tune steps become ask / trials / tell rounds (no-op without); no pruning: KFP sets
    # env to literals only, so a trial cannot be told its study and trial number; the
    # parameters as text: a ParallelFor item's integer field would read 2.0
    wf = expand_tune(wf, prune=False, text=True)
    check_capabilities(ENGINE, CAPABILITIES, wf)
    return _Builder(wf, local=local, workdir=workdir).build()


def run_locally(wf: ir.Workflow, pipeline_root: str, *,
                secrets: Mapping[tuple[str, str], str] | None = None) -> dict[str, list[str]]:
    """Run ``wf`` with ``kfp.local`` (SubprocessRunner, no venv) in local mode.

    ``secrets`` gives the values of the secret references (``(secret, key)`` →
    value) that a cluster would take from Kubernetes secrets; a step reading one
    not given fails.

    Returns, per step that ran, the standard output of each of its executions
    (one per map item), sorted.

    Raises:
        LocalRunError: when a step fails (kfp.local stops there), with the
            steps that ran before and the steps that failed.
    """
    local = _import("kfp.local")
    os.makedirs(pipeline_root, exist_ok=True)
    logdir = tempfile.mkdtemp(prefix="couler-kfp-log-", dir=pipeline_root)
    pipeline = build_pipeline(wf, local=True, workdir=logdir)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root,
               raise_on_error=True)
    saved = {name: os.environ.get(name) for name in (LOCAL_DIR_ENV, LOCAL_SECRETS_ENV)}
    os.environ[LOCAL_DIR_ENV] = logdir
    os.environ[LOCAL_SECRETS_ENV] = json.dumps(
        {f"{name}/{key}": value for (name, key), value in (secrets or {}).items()})
    try:
        pipeline()
    except Exception as exc:
        runs, failed = _local_runs(logdir)
        # kfp names the task: the step, or a rung STEP-memK of its memory escalation
        named = [step for step in failed
                 if re.search(re.escape(repr(step)[:-1]) + r"(-mem\d+)?'", str(exc))]
        failed = named or failed
        raise LocalRunError(str(exc), {s: o for s, o in runs.items() if s not in failed},
                            failed) from exc
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return _local_runs(logdir)[0]


class LocalRunError(RuntimeError):
    """A ``kfp.local`` run that stopped at a failed step."""

    def __init__(self, message: str, runs: dict[str, list[str]], failed: list[str]) -> None:
        super().__init__(message)
        self.runs = runs  # per step that succeeded, its executions' stdout
        self.failed = failed  # the steps with a failed execution


def _local_runs(logdir: str) -> tuple[dict[str, list[str]], list[str]]:
    runs: dict[str, list[str]] = {}
    failed: set[str] = set()
    for name in sorted(os.listdir(logdir)):
        step, _, end = name.rsplit(".", 2) if name.count(".") >= 2 else (name, "", "")
        step = step.replace("~", "/")
        if end == "failed":
            failed.add(step)
        if end in ("failed", "out"):  # every execution, a retried attempt included
            with open(os.path.join(logdir, name), encoding="utf-8") as fh:
                runs.setdefault(step, []).append(fh.read())
    return {step: sorted(outs) for step, outs in runs.items()}, sorted(failed)
