"""Compile a Couler IR workflow into the source of one Apache Airflow 3.x DAG file.

:func:`compile_workflow` is a pure function: it does not import Airflow, it
returns Python source text that imports ``airflow.sdk`` when Airflow loads it.
:data:`CAPABILITIES` and :data:`LIMITS` are Airflow's capability matrix and
limits table; the compiler checks the matrix
(:func:`couler.engines.base.check_capabilities`) before generating anything.

Shape of the generated file:

* A module-level ``STEPS`` table holds every step's static description
  (command, args, script source, inputs, outputs, conditions) as plain Python
  literals, and a small runner ``_couler_run`` executes one step. Every step is
  one TaskFlow task ``task(_couler_run, task_id=STEP, multiple_outputs=True)``
  called with the step's name and its upstream values as ``XComArg``\\ s; no
  Jinja templates are involved, so literal ``{{`` in commands is safe.
* **Execution.** Unless it needs Kubernetes (below), the runner starts the step as
  a subprocess *on the Airflow worker*: a container step runs ``command + args`` as
  an argv list (no shell, no quoting issues), a script step writes its source to a
  temporary file and runs it with the interpreter (the worker's own Python for
  ``python``). The step's **image is ignored** (a pod step runs it; a plain step
  keeps ``airflow dags test`` runnable anywhere, without a cluster). Untrusted code
  never runs inside the scheduler or the DAG processor: parsing the file only builds
  the graph.
* **Parameters.** Placeholders ``{{inputs.NAME}}``, ``{{item}}``,
  ``{{item.KEY}}``, ``{{workflow.name}}`` (the DAG id), ``{{workflow.uid}}``
  (the run id) and ``{{workflow.status}}`` (fixed in succeeded/failed exit
  hooks, otherwise derived from the run's task states) are substituted by the
  runner (also in script sources and env values). Outputs are returned from
  the task and pushed as one XCom per output name (``multiple_outputs``): a
  ``stdout`` output is the whole standard output, a ``path`` output the
  contents of the file after the command ends (missing file = step failure),
  both stripped of surrounding whitespace as the local engine does (so
  ``echo x > FILE`` gives ``x``, like Argo's ``result``). List-typed outputs are
  decoded from JSON so a map can expand over them. Consumers read them as
  ``t["STEP"]["OUTPUT"]``; reading a mapped step's output gives the JSON list
  of its per-item values (Airflow gathers the mapped XComs).
* **Dependencies** become ``>>``; the edge condition becomes the task's
  ``trigger_rule`` (one per task, so all edges of a step must share one
  condition): succeeded → ``none_failed`` (upstream succeeded or was skipped),
  failed / errored → ``all_failed``, skipped → ``all_skipped``, completed /
  any → ``all_done``, succeeded_only (``A.Succeeded``) → ``all_success``, any
  succeeded / all failed of a map → ``one_success`` / ``all_failed`` over its
  mapped instances. A trigger rule cannot tell a step skipped by its own
  ``when`` from one that was not run (Argo's Omitted), and ``all_failed``
  counts ``upstream_failed``: the runner checks such edges against the
  upstream's state and the when-skip XCom (``WHEN_SKIP_KEY``) before starting,
  and a step whose edge does not hold ends skipped without the mark, so its own
  dependents are not run either (semantics rule S2). A DAG run's state comes
  from its leaf tasks, so a failed step whose failure such an edge handles
  would leave the run succeeded; the ``couler-exit-status`` watcher task
  (below) keeps it failed, as on the other engines.
* **Depends expressions** (``and`` / ``or`` / ``not``, rule S5): the task's trigger
  rule is ``all_done``, so it starts once every step the expression names has finished;
  the runner then reads each named task's outcome (succeeded, failed, skipped by its
  ``when`` = the when-skip mark, omitted; a mapped task's instances for AnySucceeded /
  AllFailed) and evaluates the expression; false ends the task skipped without the
  mark (not run, S2). A dynamic map's ``--items`` helper evaluates it first.
* **when / else** are evaluated by the runner before the command starts; a
  false condition raises ``AirflowSkipException`` so the task ends *skipped*
  and ``none_failed`` dependents still run. Comparisons are numeric when both
  sides parse as numbers, textual otherwise.
* **Maps** use dynamic task mapping: static items ``.expand(item=[0, 1, ...])``
  (indices into ``STEPS``, so item text is never templated); an upstream list
  or a list workflow parameter through a helper task ``STEP--items`` that
  decodes the JSON list (Airflow maps only over a task's ``return_value``),
  ``.expand(item=t["STEP--items"])``; the parallelism bound is
  ``max_active_tis_per_dagrun``.
* **Loops** run inside one task: the runner repeats the command while the
  condition (over the step's own fresh outputs) holds, at most
  ``max_iterations`` times; the last iteration's outputs are the task's.
* **Inline sub-workflows** become a ``TaskGroup`` (task ids ``GROUP.STEP``);
  group outputs are forwarded from the inner step declaring them.
* **Exit hooks** are tasks downstream of every workflow task with trigger
  rule ``all_done``; a hook on succeeded / failed / error checks the run's
  status (rule S7, below) in the runner and ends skipped when it does not
  match ("exit hook X did not fire").
* **Run state** follows rule S7 (docs/semantics.md, Argo's DAG phase): a
  task that ran carries its outcome down its branch, one that did not run its
  parents', and the run fails when a leaf's branch failed -- so a failure a
  step handles does not fail the run. ``GRAPH`` lists each task's upstream
  tasks (groups flattened). When the workflow has exit hooks or an edge other
  than the default, a ``couler-exit-status`` task (Airflow's "watcher" idiom:
  ``all_done``, no retries) downstream of every workflow task computes the
  rule from the task states and fails the run when it says so. Without hooks
  or such edges Airflow's own rule (a failed or ``upstream_failed`` leaf fails
  the run) is the same.
* **Artifacts** go through Airflow's object storage (``ObjectStoragePath``): after the
  command the runner copies each output artifact (a file or a directory tree) to the
  artifact store -- the URL in the Airflow Variable ``couler_artifact_root`` (connection
  id in ``couler_artifact_conn_id``; default a local directory) -- under
  ``RUN_ID/STEP/NAME``, or to its own ``ArtifactLocation``; before the command it
  fetches each input artifact to the path the step reads it from.
* **Kubernetes pod steps**: a step with resources, GPUs, a node selector, tolerations
  or volumes (its own or the workflow's) is a ``_CoulerPod`` task, a
  ``KubernetesPodOperator`` subclass running the step's image
  (:mod:`couler.compilers.airflow.pods`); every other step stays a worker subprocess.
  Its artifacts pass through a claim the workers mount too (the Variables
  ``couler_artifact_claim`` and ``couler_artifact_root`` = ``file://PATH``).
* **Sub-workflow references** trigger the referenced workflow's own DAG and wait for
  it (``_CoulerTrigger``, a ``TriggerDagRunOperator``; :mod:`couler.compilers.airflow.refs`).
* **Cache policies**: the runner (and the pod operator) keeps a step's outputs in the
  artifact store under ``cache/NAME/KEY.json`` and reuses them while younger than the
  policy's max age.
* **Retry by failure class**: the runner classifies a failed attempt with a copy of
  :func:`couler.failures.classify` generated from its ``PATTERNS``
  (:mod:`couler.compilers.airflow.failures`) and raises ``AirflowFailException`` (no
  further tries) for a class the step's policy does not retry.
* **Policies**: retries → ``retries`` / ``retry_delay`` /
  ``retry_exponential_backoff`` (the factor) / ``max_retry_delay``; timeout →
  ``execution_timeout`` (workflow timeout → ``dagrun_timeout``); priority →
  ``priority_weight``; workflow parallelism → ``max_active_tasks``.
* **Secrets**: an env var from a secret is read at run time with
  ``Variable.get("SECRET/KEY")``: store the value as an Airflow Variable (or in
  a secrets backend such as Vault that serves Variables).
* **Workflow** parameters → ``params`` with ``Param`` defaults; a cron schedule
  → ``schedule`` (``CronTriggerTimetable`` when it has a time zone), suspend →
  ``is_paused_upon_creation``, concurrency ``forbid`` → ``max_active_runs=1``.

Workflow settings with no Airflow meaning are not emitted: tenant, service
account, image pull secrets, DNS, security context, annotations, TTL, and the
cron starting deadline / history limits. Labels become DAG ``tags``
(``key=value``).

Rejected while compiling (:class:`~couler.errors.UnsupportedFeatureError`):
mixed edge conditions on one step, dependencies between exit-hook steps,
group-level policies on an inline sub-workflow, static maps longer than
``max_map_length``, cron ``replace`` concurrency, depends terms naming a TaskGroup,
git artifact locations, a map step's artifacts with their own location or read by
another step, cached steps with output artifacts, pod steps with maps / loops /
artifacts with their own location, claim templates mounted by several pod steps, and
sub-workflow references that declare outputs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from couler import ir
from couler.compilers.airflow.failures import classifier_source
from couler.compilers.airflow.jobs import JOB_RUNTIME, job_spec
from couler.compilers.airflow.pods import POD_RUNTIME, needs_pod, pod_kwargs
from couler.compilers.airflow.refs import REF_RUNTIME, ref_kwargs
from couler.engines.base import (
    Capability,
    Feature,
    Limit,
    Support,
    check_capabilities,
    plain_edges,
)
from couler.errors import UnsupportedFeatureError
from couler.optimize.tune import expand_tune

__all__ = [
    "AIRFLOW_VERSION",
    "ARTIFACT_CONN_VARIABLE",
    "ARTIFACT_ROOT_VARIABLE",
    "CAPABILITIES",
    "ENGINE",
    "EXIT_STATUS_TASK",
    "ITEMS_SUFFIX",
    "LIMITS",
    "MAX_MAP_LENGTH",
    "TRIGGER_RULES",
    "WHEN_SKIP_KEY",
    "compile_workflow",
]

ENGINE = "airflow"
AIRFLOW_VERSION = "3.3.2"  # the version the generated files are tested against
MAX_MAP_LENGTH = 1024  # [core] max_map_length default
EXIT_STATUS_TASK = "couler-exit-status"
ITEMS_SUFFIX = "--items"  # helper task decoding the list a map expands over

_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(
        _R, "a TaskFlow task running command + args as a subprocess on the Airflow worker "
            "(argv, no shell); the image is ignored (KubernetesPodOperator would need a "
            "cluster; the worker subprocess keeps `airflow dags test` runnable)"),
    Feature.SCRIPT: Capability(
        _R, "the source is written to a temporary file and run by the interpreter in a "
            "subprocess on the worker (python = the worker's Python); never exec'd in the "
            "scheduler; the image is ignored"),
    Feature.JOB: Capability(
        _R, "the step runner creates / applies / replaces / patches / deletes the manifest "
            "through the Kubernetes dynamic client of the cncf-kubernetes provider "
            "(KubernetesHook: the kubernetes_default connection) and polls the resource "
            "until Argo-style success / failure conditions (PATH OP VALUE, in / notin, "
            "exists) hold; no owner reference (Airflow has no workflow object to own it); "
            "job outputs (JSON paths) are refused. Checked by DagBag import and the "
            "condition evaluator's tests; dag.test cannot reach a cluster here"),
    Feature.SUBWORKFLOW_INLINE: Capability(
        _N, "a TaskGroup (task ids GROUP.STEP); group outputs are forwarded from the inner "
            "step that declares them; group-level when/map/loop/policies are rejected"),
    Feature.SUBWORKFLOW_REF: Capability(
        _R, "the referenced workflow is its own DAG (deployed under its name); the step is "
            "a TriggerDagRunOperator task (_CoulerTrigger, wait_for_completion: succeeds or "
            "fails with the child run) passing the step's inputs as the child's conf, after "
            "the step runner's gates; the child's outputs cannot be read back, so a "
            "reference declaring outputs or artifacts is refused. Checked by DagBag import; "
            "dag.test cannot run the triggered DAG (it needs a scheduler)"),
    Feature.PARAMETERS: Capability(
        _N, "outputs are XComs (multiple_outputs, one per output name; stdout = whole output, "
            "path = file contents read after the command, both stripped like the local "
            "engine's); "
            "inputs are XComArgs substituted into {{inputs.NAME}} by the step runner"),
    Feature.WORKFLOW_PARAMETERS: Capability(
        _N, "DAG params (Param with default and JSON-schema type), read at run time"),
    Feature.ARTIFACTS: Capability(
        _R, "through Airflow object storage (ObjectStoragePath, providers-common-io): the "
            "step runner copies an output artifact (file or directory) after the command to "
            "the artifact store -- the Airflow Variable couler_artifact_root (e.g. "
            "s3://bucket/prefix, with the connection in couler_artifact_conn_id; default a "
            "local directory, enough for dag.test on one machine) under RUN_ID/STEP/NAME -- "
            "and fetches an input artifact to the path the step reads it from before the "
            "command; an ArtifactLocation (s3 / gcs / oss / hdfs bucket + key, http url, "
            "endpoint and credential secrets as Variables) is used as is; a map step's items "
            "store theirs under RUN_ID/STEP/NAME/item-MAP_INDEX; a pod step's pass through "
            "the PersistentVolumeClaim in the Variable couler_artifact_claim, mounted at the "
            "file:// path of couler_artifact_root (the workers mount it there too) and copied "
            "by a shell wrapper; git locations, a map step's artifacts with their own location, "
            "reading a map step's artifact and a pod step's artifacts with their own location "
            "are refused"),
    Feature.EDGE_CONDITIONS: Capability(
        _N, "the task's trigger_rule: failed/errored → all_failed, skipped → all_skipped, "
            "completed/any → all_done (succeeded → none_failed, succeeded_only → "
            "all_success), checked by the step runner against not-run upstreams (Omitted, "
            "which Airflow reports as skipped or upstream_failed); one rule per task, so all "
            "edges of a step must share one condition; a couler-exit-status task (one_failed) "
            "keeps the run failed when a handled step failed"),
    Feature.DEPENDS_EXPRESSION: Capability(
        _R, "trigger_rule all_done (the expression is read once every step it names has "
            "finished, rule S5), then the step runner evaluates and / or / not over the "
            "upstream outcomes read from the run's task states and when-skip marks "
            "(succeeded, failed, skipped by its when, omitted; a map's instances for "
            "AnySucceeded / AllFailed); false = not run (skipped without the mark); Errored "
            "is any failure (E4); terms naming a sub-workflow (TaskGroup) are refused"),
    Feature.WHEN: Capability(
        _R, "evaluated by the step runner on the upstream XComs before the command runs; "
            "false raises AirflowSkipException (task skipped, none_failed dependents run); "
            "numeric comparison when both sides parse as numbers"),
    Feature.ELSE: Capability(_R, "the same runner check, skipping when the condition holds"),
    Feature.MAP_STATIC: Capability(
        _N, "dynamic task mapping .expand(item=[indices]) over the static items; at most "
            "max_map_length (1024) items"),
    Feature.MAP_DYNAMIC: Capability(
        _N, "dynamic task mapping .expand(item=XComArg) over a helper task STEP--items that "
            "decodes the upstream list output (or list workflow parameter) from JSON"),
    Feature.MAP_PARALLELISM: Capability(_N, "max_active_tis_per_dagrun of the mapped task"),
    Feature.LOOP: Capability(
        _R, "Airflow DAGs are acyclic: the loop runs inside one task, the runner repeating "
            "the command while the condition over its fresh outputs holds (at most "
            "max_iterations); retries restart the whole loop"),
    Feature.EXIT_HOOKS: Capability(
        _R, "tasks downstream of every workflow task with trigger_rule none_failed "
            "(succeeded), one_failed (failed/error) or all_done (any), plus a "
            "couler-exit-status task that fails the run when a step failed; hook steps "
            "cannot depend on each other"),
    Feature.RETRY: Capability(_N, "task retries; without a back-off retry_delay is 0 (at "
                                  "once, as on the other engines)"),
    Feature.RETRY_BACKOFF: Capability(
        _N, "retry_delay = base, retry_exponential_backoff = factor, max_retry_delay = cap"),
    Feature.RETRY_FAILURE_CLASSES: Capability(
        _R, "the step runner classifies each failed attempt with couler.failures' patterns "
            "(generated into the DAG file from failures.PATTERNS: exit code, signal, stderr "
            "tail, traceback, execution_timeout) and raises AirflowFailException (no retry) "
            "for a class the policy does not retry; Airflow clears a task's XComs on each "
            "try, so the attempts before are unknown and the same-error-twice rule does not "
            "apply (an unknown exit stays transient, retried up to the limit)"),
    Feature.MEMORY_ESCALATION: Capability(
        _R, "on a pod step (one with memory resources): before each try the pod operator "
            "counts this task's earlier pods the kubelet OOMKilled (failed pods are kept and "
            "found by their labels) and multiplies the memory request and limit by "
            "memory_factor per OOM, capped at memory_ceiling; a worker-subprocess step has "
            "no memory limit to raise"),
    Feature.TIMEOUT: Capability(
        _N, "execution_timeout (the subprocess is killed); workflow timeout → dagrun_timeout"),
    Feature.RESOURCES: Capability(
        _R, "the step runs as a KubernetesPodOperator task (_CoulerPod, provider "
            "cncf-kubernetes) with container_resources; steps without resources or "
            "placement stay worker subprocesses. The pod runs the step's image, the step "
            "runner's gates and placeholders run before it, outputs come back through "
            "/airflow/xcom/return.json (a sh wrapper: the image needs sh and awk); a pod "
            "step cannot be mapped, looped or carry artifacts. Checked by DagBag import; "
            "dag.test cannot start pods without a cluster"),
    Feature.GPU: Capability(
        _R, "a KubernetesPodOperator task whose container_resources limit the GPU resource "
            "(nvidia.com/gpu by default); see resources"),
    Feature.CACHE: Capability(
        _R, "Airflow has no memoization: the step runner keeps a step's outputs as JSON in "
            "the artifact store (couler_artifact_root/cache/NAME/KEY.json, shared by every "
            "run) under the policy's key (placeholders filled) or the step's content digest "
            "(command, image, env, salt) with its input values and map item; an entry older "
            "than max_age is a miss; a hit returns the outputs without running the command "
            "(the task still ends success: Airflow has no cached state); steps with output "
            "artifacts are refused"),
    Feature.PRIORITY: Capability(_N, "task priority_weight"),
    Feature.NODE_SELECTOR: Capability(
        _R, "a KubernetesPodOperator task with node_selector (the workflow's merged with "
            "the step's; a workflow-level selector makes every step a pod); see resources"),
    Feature.TOLERATIONS: Capability(
        _R, "a KubernetesPodOperator task with tolerations (V1Toleration; workflow-level "
            "ones make every step a pod); see resources"),
    Feature.VOLUMES: Capability(
        _R, "a KubernetesPodOperator task mounting the volume: an existing claim, config "
            "map, secret or emptyDir as is; a claim template as the pod's generic ephemeral "
            "volume when one step mounts it (refused when several do: the pods would not "
            "share it)"),
    Feature.SECRETS: Capability(
        _R, "env value read at run time with Variable.get('SECRET/KEY'): store it as an "
            "Airflow Variable or serve it from a secrets backend; a pod step (resources / "
            "placement) gets the Kubernetes secret itself (Secret('env', VAR, NAME, KEY))"),
    Feature.DAEMON: Capability(
        _U, "an Airflow task cannot keep serving other tasks while they run"),
    Feature.CRON: Capability(
        _N, "DAG schedule (CronTriggerTimetable with a time zone), suspend → "
            "is_paused_upon_creation, forbid → max_active_runs=1; replace is rejected"),
    Feature.EVENT_TRIGGERS: Capability(
        _U, "Airflow triggers DAGs from asset events, not from message subjects with filters"),
    Feature.TUNE: Capability(
        _R, "rounds of an ask task (python -m couler_runtime.tune ask), a mapped trial task "
            "and a tell task, then a best task producing the outputs "
            "(couler.optimize.tune.expand_tune); the study's URL is the storage secret's "
            "Variable; pruning: a trial reports its intermediate values to the study itself "
            "(couler_runtime.tune.report, couler-runtime where the trial runs)"),
}

_AIRFLOW_DOCS = "https://airflow.apache.org/docs/apache-airflow/stable/"
LIMITS: tuple[Limit, ...] = (
    Limit("mapped task instances per task ([core] max_map_length default)", MAX_MAP_LENGTH,
          "items", _AIRFLOW_DOCS + "configurations-ref.html#max-map-length"),
    Limit("running task instances per DAG ([core] max_active_tasks_per_dag default)", 16,
          "tasks", _AIRFLOW_DOCS + "configurations-ref.html#max-active-tasks-per-dag"),
    Limit("active runs per DAG ([core] max_active_runs_per_dag default)", 16, "runs",
          _AIRFLOW_DOCS + "configurations-ref.html#max-active-runs-per-dag"),
    Limit("task id / dag id length (ID_LEN)", 250, "characters",
          "airflow/models/base.py ID_LEN"),
    Limit("XCom value size (MySQL backend, LONGBLOB; SQLite/Postgres are larger)", 4294967295,
          "bytes", _AIRFLOW_DOCS + "core-concepts/xcoms.html"),
)

_RULE_OF_EDGE: dict[ir.EdgeCondition, str] = {
    ir.EdgeCondition.SUCCEEDED: "none_failed",
    ir.EdgeCondition.FAILED: "all_failed",
    ir.EdgeCondition.ERRORED: "all_failed",
    ir.EdgeCondition.SKIPPED: "all_skipped",
    ir.EdgeCondition.COMPLETED: "all_done",
    ir.EdgeCondition.ANY: "all_done",
    ir.EdgeCondition.SUCCEEDED_ONLY: "all_success",
    ir.EdgeCondition.ANY_SUCCEEDED: "one_success",  # over a mapped task's instances
    ir.EdgeCondition.ALL_FAILED: "all_failed",
}
TRIGGER_RULES: Mapping[ir.EdgeCondition, str] = _RULE_OF_EDGE
_HOOK_STATUS: dict[ir.RunStatus, str] = {  # {{workflow.status}} inside an exit hook
    ir.RunStatus.SUCCEEDED: "Succeeded",
    ir.RunStatus.FAILED: "Failed",
    ir.RunStatus.ERROR: "Failed",
}
_PARAM_TYPE: dict[ir.ValueType, str] = {
    ir.ValueType.STRING: "string",
    ir.ValueType.INT: "integer",
    ir.ValueType.FLOAT: "number",
    ir.ValueType.BOOL: "boolean",
    ir.ValueType.LIST: "array",
}
_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
WHEN_SKIP_KEY = "couler_when_skipped"
ARTIFACT_ROOT_VARIABLE = "couler_artifact_root"  # e.g. s3://bucket/prefix
ARTIFACT_CONN_VARIABLE = "couler_artifact_conn_id"  # the object storage's connection
# ArtifactLocation storage kinds -> URL scheme (bucket + key); http / local use url / key
_SCHEMES = {ir.StorageKind.S3: "s3", ir.StorageKind.GCS: "gs", ir.StorageKind.OSS: "oss",
            ir.StorageKind.HDFS: "hdfs"}
# Edges whose trigger rule admits an upstream that was not run: none_failed and
# all_skipped take any skip, all_failed counts upstream_failed, all_done takes both.
_CHECKED_EDGES = frozenset({ir.EdgeCondition.SUCCEEDED, ir.EdgeCondition.SKIPPED,
                            ir.EdgeCondition.FAILED, ir.EdgeCondition.ERRORED,
                            ir.EdgeCondition.COMPLETED})


def _plain(step: ir.Step | None) -> bool:
    """A task (a mapped one or a sub-workflow reference included), not a group: its
    state is its task's states."""
    return step is not None and not _is_group(step)


def _is_group(step: ir.Step) -> bool:
    """An inline sub-workflow (a TaskGroup); a reference (no steps) is one task."""
    return isinstance(step.body, ir.SubWorkflowSpec) and bool(step.body.steps)


# The runner, copied verbatim into every generated file. It runs on the worker.
_RUNTIME = '''
_PLACEHOLDER = re.compile(r"\\{\\{\\s*([^}]*?)\\s*\\}\\}")
_KINDS: dict[str, Any] = {}  # step kinds run by other code than a command (job)
_OPS = {"==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
        ">=": operator.ge, "<=": operator.le}


def _couler_text(value: Any) -> str:
    """A value as the text a command line sees (strings unquoted, the rest as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if not isinstance(value, (dict, int, float)) and hasattr(value, "__iter__"):
        value = list(value)  # e.g. the lazy sequence of a mapped task's outputs
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _couler_value(src: dict[str, Any], xcoms: dict[str, Any], item: Any,
                  own: dict[str, Any]) -> str:
    """Resolve one value source of the STEPS table."""
    if "literal" in src:
        return str(src["literal"])
    if "xcom" in src:
        return _couler_text(xcoms.get(src["xcom"]))
    if "own" in src:
        return _couler_text(own.get(src["own"]))
    if "param" in src:
        return _couler_text(get_current_context()["params"].get(src["param"]))
    key, value = src["item"], item
    if key:
        if isinstance(item, dict):
            value = item.get(key)
        elif isinstance(item, list) and key.isdigit() and int(key) < len(item):
            value = item[int(key)]
        else:
            value = None
    return _couler_text(value)


def _couler_holds(cond: dict[str, Any], xcoms: dict[str, Any], item: Any,
                  own: dict[str, Any]) -> bool:
    """Evaluate a condition; numeric when both sides parse as numbers."""
    left = _couler_value(cond["left"], xcoms, item, own)
    right = _couler_value(cond["right"], xcoms, item, own)
    try:
        return bool(_OPS[cond["op"]](float(left), float(right)))
    except ValueError:
        return bool(_OPS[cond["op"]](left, right))


def _couler_once(step: str, spec: dict[str, Any], fill: Any,
                 env: dict[str, str]) -> dict[str, Any]:
    """Run the step's command once as a subprocess and collect its outputs."""
    with tempfile.TemporaryDirectory(prefix="couler-") as tmp:
        if spec["kind"] == "script":
            path = os.path.join(tmp, "script")
            with open(path, "w", encoding="utf-8") as f:
                f.write(fill(spec["source"]))
            interpreter = list(spec["interpreter"])
            if interpreter[0] in ("python", "python3"):
                interpreter[0] = sys.executable
            argv = [*interpreter, path, *(fill(a) for a in spec["args"])]
        else:
            argv = [fill(w) for w in [*spec["command"], *spec["args"]]]
        print("couler: running", shlex.join(argv), flush=True)
        proc = subprocess.run(argv, cwd=spec["working_dir"] or None, env=env, text=True,
                              capture_output=True, check=False)
        print(proc.stdout, end="", flush=True)
        print(proc.stderr, end="", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            _couler_failed(step, spec, proc.returncode, proc.stderr)
        outputs: dict[str, Any] = {}
        for out in spec["outputs"]:
            # stripped like the local engine: `echo x > FILE` gives "x", as print("x") does
            if out["source"] == "stdout":
                value = proc.stdout.strip()
            else:
                with open(out["path"], encoding="utf-8", errors="replace") as f:
                    value = f.read().strip()
            if out["type"] == "list":
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            outputs[out["name"]] = value
        return outputs


def _couler_store(where: dict[str, Any]) -> Any:
    """The object-storage path of an artifact: the artifact store (the Airflow Variable
    ARTIFACT_ROOT_VARIABLE, default a local directory) under KEY, or its own location."""
    from airflow.sdk import ObjectStoragePath

    if "key" in where or "cache" in where:
        root = Variable.get(ARTIFACT_ROOT_VARIABLE, default=None) or (
            "file://" + os.path.join(tempfile.gettempdir(), "couler-artifacts"))
        conn_id = Variable.get(ARTIFACT_CONN_VARIABLE, default=None)
        if "cache" in where:  # shared by every run of every workflow
            return ObjectStoragePath(f"{root.rstrip('/')}/cache/{where['cache']}",
                                     conn_id=conn_id)
        context = get_current_context()
        key = where["key"]
        if where.get("per_item"):  # a map step's item keeps its own
            key = f"{key}/item-{context['ti'].map_index}"
        return ObjectStoragePath(f"{root.rstrip('/')}/{context['run_id']}/{key}",
                                 conn_id=conn_id)
    options: dict[str, Any] = {}
    if where.get("access_key"):
        options["key"] = Variable.get(where["access_key"])
    if where.get("secret_key"):
        options["secret"] = Variable.get(where["secret_key"])
    if where.get("endpoint"):
        options["client_kwargs"] = {"endpoint_url": where["endpoint"]}
    return ObjectStoragePath(where["url"], **options)


def _couler_put(local: str, remote: Any) -> None:
    """Copy a local file or directory tree to object storage."""
    if os.path.isdir(local):
        for name in sorted(os.listdir(local)):
            _couler_put(os.path.join(local, name), remote / name)
        return
    remote.parent.mkdir(parents=True, exist_ok=True)
    with open(local, "rb") as f:
        remote.write_bytes(f.read())


def _couler_get(remote: Any, local: str) -> None:
    """Copy a file or directory tree from object storage to a local path."""
    if remote.is_dir():
        os.makedirs(local, exist_ok=True)
        for child in remote.iterdir():
            _couler_get(child, os.path.join(local, child.name))
        return
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    with open(local, "wb") as f:
        f.write(remote.read_bytes())


def _couler_fetch_artifacts(step: str, spec: dict[str, Any]) -> None:
    """Place the step's input artifacts at the paths it reads them from."""
    for art in spec.get("input_artifacts", []):
        remote = _couler_store(art["from"])
        if not remote.exists():
            raise RuntimeError(f"step {step}: input artifact {art['name']!r} is missing "
                               f"at {remote}")
        _couler_get(remote, art["path"])
        print(f"couler: artifact {art['name']} fetched from {remote}", flush=True)


def _couler_store_artifacts(step: str, spec: dict[str, Any]) -> None:
    """Copy the step's output artifacts to the artifact store (or their locations)."""
    for art in spec.get("output_artifacts", []):
        if not os.path.exists(art["path"]):
            raise RuntimeError(f"step {step}: output artifact {art['name']!r} was not "
                               f"written at {art['path']}")
        remote = _couler_store(art["to"])
        _couler_put(art["path"], remote)
        print(f"couler: artifact {art['name']} stored at {remote}", flush=True)


def _couler_failed(step: str, spec: dict[str, Any], exit_code: int | None, log: str, *,
                   timed_out: bool = False, reason: str = "") -> None:
    """Fail the attempt, classified (couler.failures); without a retry when the step's
    policy does not retry its class."""
    failure, pattern, reason = _couler_classify(exit_code, reason=reason, log=log[-8192:],
                                                timed_out=timed_out)
    said = f"exited with code {exit_code}" if exit_code is not None else "failed"
    message = f"step {step} {said}: {failure} ({pattern}: {reason})"
    retry_on = spec.get("retry_on")
    if retry_on is not None and failure not in retry_on:
        raise AirflowFailException(f"{message}; not retried: its retry policy retries "
                                   f"{', '.join(retry_on)} failures only")
    raise RuntimeError(message)


def _couler_gate(step: str, spec: dict[str, Any], xcoms: dict[str, Any], item: Any) -> Any:
    """Check whether the step runs (exit-hook status, edges, depends, when; skips it
    otherwise) and return the function filling its placeholders."""
    inputs = {name: _couler_value(src, xcoms, item, {}) for name, src in spec["inputs"].items()}
    gate = spec.get("status")
    if gate and spec.get("hook") and _couler_status() not in (gate, "Running"):
        raise AirflowSkipException(f"exit hook {step} did not fire: the run is not {gate}")
    omitted = _couler_omitted(spec["edges"]) or _couler_depends(spec.get("depends"))
    if omitted:  # not run: no when-skip mark, so its own dependents do not run either
        raise AirflowSkipException(f"{step} not run: {omitted}")
    when = spec["when"]
    if when is not None and _couler_holds(when, xcoms, item, {}) != when["expect"]:
        get_current_context()["ti"].xcom_push(key=WHEN_SKIP_KEY, value=True)
        raise AirflowSkipException(f"when condition of {step} is {not when['expect']}")

    def fill(text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            ref = m.group(1)
            if ref.startswith("inputs.") and ref[7:] in inputs:
                return inputs[ref[7:]]
            if ref == "item" or ref.startswith("item."):
                return _couler_value({"item": ref[5:]}, xcoms, item, {})
            if ref == "workflow.name":
                return WORKFLOW_NAME
            if ref == "workflow.uid":
                return str(get_current_context()["run_id"])
            if ref == "workflow.status":
                return spec.get("status") or _couler_status()
            return m.group(0)
        return _PLACEHOLDER.sub(sub, text)
    return fill


def _couler_run(step: str, xcoms: dict[str, Any], item: Any = None) -> dict[str, Any]:
    """Run one step of STEPS on the worker; returns its outputs (one XCom each)."""
    spec = STEPS[step]
    if spec["items"] is not None:
        item = spec["items"][item]
    fill = _couler_gate(step, spec, xcoms, item)
    cache = _couler_cache(step, spec, fill, item)
    if cache is not None and cache.get("outputs") is not None:
        return cache["outputs"]
    _couler_fetch_artifacts(step, spec)
    env = dict(os.environ)
    for var in spec["env"]:
        env[var["name"]] = Variable.get(var["secret"]) if "secret" in var else fill(var["value"])
    loop = spec["loop"]
    outputs: dict[str, Any] = {}
    run = _KINDS.get(spec["kind"])  # a job step: not a command (see JOB_RUNTIME)
    try:
        if run is not None:
            outputs, loop = run(step, spec, fill), None
        for _ in range(loop["max_iterations"] if loop is not None else 1):
            if run is not None:
                break
            outputs = _couler_once(step, spec, fill, env)
            if loop is None or not _couler_holds(loop, xcoms, item, outputs):
                break
    except AirflowTaskTimeout:  # execution_timeout: transient, like the step's timeout
        _couler_failed(step, spec, None, "", timed_out=True)
    _couler_store_artifacts(step, spec)
    _couler_cache_put(cache, outputs)
    return outputs


def _couler_cache(step: str, spec: dict[str, Any], fill: Any, item: Any) -> dict[str, Any] | None:
    """The step's cache entry: {"path": ..., "outputs": ... (None on a miss)}; None when
    the step has no cache policy. The key is the user's (placeholders filled) or the
    step's content digest with its input values and map item; entries older than the
    policy's max age are misses."""
    policy = spec.get("cache")
    if policy is None:
        return None
    if policy["key"]:
        key = fill(policy["key"])
    else:
        values = {name: fill("{{inputs.%s}}" % name) for name in spec["inputs"]}
        key = policy["digest"] + json.dumps([values, item], sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    path = _couler_store({"cache": f"{policy['name']}/{digest}.json"})
    entry: dict[str, Any] = {"path": path, "outputs": None}
    try:
        found = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):  # an unreadable entry is a miss
        found = None
    if found is not None:
        age = time.time() - found["time"]
        if policy["max_age"] is None or age <= policy["max_age"]:
            print(f"couler: {step} reused its cached outputs ({int(age)} s old)", flush=True)
            entry["outputs"] = found["outputs"]
    return entry


def _couler_cache_put(entry: dict[str, Any] | None, outputs: dict[str, Any]) -> None:
    """Store a step's fresh outputs in its cache entry."""
    if entry is None:
        return
    entry["path"].parent.mkdir(parents=True, exist_ok=True)
    entry["path"].write_text(json.dumps({"outputs": outputs, "time": time.time()}))


_ACCEPTS = {"succeeded": ("succeeded", "skipped"), "skipped": ("skipped",),
            "failed": ("failed",), "errored": ("failed",), "completed": ("succeeded", "failed")}


def _couler_states(found: dict[str, Any]) -> dict[str, list[str]]:
    """Task states by task id; a mapped task's instances ("TASK_3") under its own id."""
    states: dict[str, list[str]] = {}
    for task_id, state in found.items():
        base, _, index = task_id.rpartition("_")
        key = base if index.isdigit() and base in STEPS else task_id
        states.setdefault(key, []).append(str(getattr(state, "value", state)).lower())
    return states


def _couler_outcomes_of(names: list[str]) -> dict[str, tuple[str, list[str]]] | None:
    """Each named upstream task's outcome (succeeded / failed / skipped by its when /
    omitted) with its instances' states (a mapped task has one per instance); None when
    the task SDK cannot tell the states.

    A trigger rule sees "skipped" for a step skipped by its own when and for one that was
    not run (Argo's Omitted), and counts upstream_failed as failed; the when-skip mark
    (an XCom) tells them apart.
    """
    ti = get_current_context()["ti"]
    try:
        found = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id])
    except Exception:  # noqa: BLE001 - older task SDKs: the trigger rules alone decide
        return None
    states = _couler_states(found.get(ti.run_id, {}) if isinstance(found, dict) else {})
    out: dict[str, tuple[str, list[str]]] = {}
    for upstream in names:
        mine = states.get(upstream, [])  # a mapped task: one state per instance
        if "failed" in mine:
            outcome = "failed"
        elif "success" in mine:
            outcome = "succeeded"
        elif mine and all(state == "skipped" for state in mine):
            marked = ti.xcom_pull(task_ids=upstream, key=WHEN_SKIP_KEY)  # any instance's
            outcome = "skipped" if marked else "omitted"
        else:  # upstream_failed, removed, or never scheduled: not run
            outcome = "omitted"
        out[upstream] = (outcome, mine)
    return out


def _couler_omitted(edges: list[list[str]]) -> str:
    """Why an upstream's outcome fails its edge although the trigger rule let this task
    start; "" when every edge holds."""
    if not edges:
        return ""
    outcomes = _couler_outcomes_of([upstream for upstream, _ in edges])
    if outcomes is None:
        return ""
    for upstream, condition in edges:
        outcome = outcomes[upstream][0]
        if outcome not in _ACCEPTS[condition]:
            return f"dependency {upstream!r} did not reach {condition} (it was {outcome})"
    return ""


_TERM = {"succeeded": ("succeeded", "skipped"), "succeeded_only": ("succeeded",),
         "failed": ("failed",), "errored": ("failed",), "skipped": ("skipped",),
         "omitted": ("omitted",), "completed": ("succeeded", "failed")}


def _couler_expr(expr: list[Any], outcomes: dict[str, tuple[str, list[str]]]) -> bool:
    """Evaluate a depends expression (rule S5) over the upstream outcomes."""
    kind = expr[0]
    if kind == "all":
        return all(_couler_expr(term, outcomes) for term in expr[1])
    if kind == "any":
        return any(_couler_expr(term, outcomes) for term in expr[1])
    if kind == "not":
        return not _couler_expr(expr[1], outcomes)
    outcome, instances = outcomes[expr[1]]
    condition = expr[2]
    if condition == "any":
        return True
    if condition == "any_succeeded":
        return "success" in instances
    if condition == "all_failed":
        return bool(instances) and all(state == "failed" for state in instances)
    return outcome in _TERM[condition]


def _couler_terms(expr: list[Any]) -> list[str]:
    if expr[0] == "term":
        return [expr[1]]
    if expr[0] == "not":
        return _couler_terms(expr[1])
    return [name for term in expr[1] for name in _couler_terms(term)]


def _couler_depends(expr: list[Any] | None) -> str:
    """Why a depends expression does not hold ("" when it does or there is none). The
    task's trigger rule is all_done, so every step the expression names has finished."""
    if expr is None:
        return ""
    outcomes = _couler_outcomes_of(sorted(set(_couler_terms(expr))))
    if outcomes is None:
        raise RuntimeError("the task SDK cannot report upstream states: the depends "
                           "expression cannot be evaluated")
    if _couler_expr(expr, outcomes):
        return ""
    seen = ", ".join(f"{name} {outcome}" for name, (outcome, _) in sorted(outcomes.items()))
    return f"its depends expression does not hold ({seen})"


def _couler_outcomes() -> dict[str, str] | None:
    """Each workflow task's outcome: succeeded / failed (it ran) or skipped (it did not:
    skipped by its when, or not run); a mapped task's from its instances. None when the
    task SDK cannot tell the states."""
    ti = get_current_context()["ti"]
    try:
        found = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id])
    except Exception:  # noqa: BLE001 - older task SDKs: the status is unknown
        return None
    states = _couler_states(found.get(ti.run_id, {}) if isinstance(found, dict) else {})
    out = {}
    for key in GRAPH:
        found_states = states.get(key, [])
        if "failed" in found_states:
            out[key] = "failed"
        elif "success" in found_states:
            out[key] = "succeeded"
        else:
            out[key] = "skipped"
    return out


def _couler_failed_leaves() -> list[str] | None:
    """The leaf tasks whose branch failed (Couler's rule S7, Argo's DAG phase): a task that
    ran carries its own outcome down its branch, one that did not run its parents'."""
    outcomes = _couler_outcomes()
    if outcomes is None:
        return None
    children: dict[str, list[str]] = {key: [] for key in GRAPH}
    waiting = {key: len(ups) for key, ups in GRAPH.items()}
    for key, ups in GRAPH.items():
        for up in ups:
            children[up].append(key)
    ready = [key for key, n in waiting.items() if n == 0]
    failed: dict[str, bool] = {}
    while ready:  # in topological order, so a task's parents are decided first
        key = ready.pop()
        outcome = outcomes.get(key, "skipped")
        failed[key] = outcome == "failed" if outcome != "skipped" else \
            any(failed[up] for up in GRAPH[key])
        for child in children[key]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return [key for key, kids in children.items() if not kids and failed.get(key, False)]


def _couler_status() -> str:
    """Succeeded / Failed: the run's status by rule S7 (a handled failure does not count)."""
    leaves = _couler_failed_leaves()
    if leaves is None:
        return "Running"
    return "Failed" if leaves else "Succeeded"


def _couler_items(value: Any = None, param: str = "", step: str = "") -> list[Any]:
    """The list a mapped step expands over: an upstream output or a workflow parameter."""
    omitted = _couler_depends(STEPS[step].get("depends")) if step else ""
    if omitted:  # the mapped task is skipped with its helper: not run
        raise AirflowSkipException(f"{step} not run: {omitted}")
    if param:
        value = get_current_context()["params"].get(param)
    if isinstance(value, str):
        value = json.loads(value)
    if value is None:
        return []  # the producer was skipped: map over nothing
    if not isinstance(value, list):
        raise TypeError(f"a map needs a JSON list, got {value!r}")
    return value


def _couler_exit_status() -> None:
    """Runs after every workflow task: fails the DAG run when a failure reached a leaf."""
    leaves = _couler_failed_leaves()
    if leaves is None or leaves:
        raise RuntimeError("steps failed; not handled on the branches of: "
                           + ", ".join(leaves or ["(unknown)"]))
    print("couler: every failed step was handled by a step that ran after it")
'''


# --------------------------------------------------------------------------- public API


def compile_workflow(wf: ir.Workflow, *, validate: bool = True) -> str:
    """Compile ``wf`` into the source text of one Airflow 3.x DAG file.

    Args:
        wf: the workflow.
        validate: run :func:`couler.ir.validate` first (the compiler assumes a
            valid workflow).

    Returns:
        Python source defining the DAG ``wf.name``; deterministic for a given IR.

    Raises:
        couler.errors.ValidationError: the workflow is invalid.
        couler.errors.UnsupportedFeatureError: the workflow uses a feature
            Airflow cannot express (the message names the step and feature).
    """
    if validate:
        ir.validate(wf)
    wf = expand_tune(wf)  # tune steps become ask / trials / tell rounds (no-op without)
    wf = plain_edges(wf)  # A.Succeeded from a step without a when is a plain edge
    check_capabilities(ENGINE, CAPABILITIES, wf)
    return _Compiler(wf).compile()


# --------------------------------------------------------------------------- compiler


def _json_text(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _py(value: object, indent: int = 0) -> str:
    """A Python literal for ``value``: one dict key per line, short values inline."""
    flat = repr(value)
    pad = "    " * indent
    if isinstance(value, str) and len(flat) + len(pad) > 88:  # adjacent literals
        parts = [repr(value[i:i + 60]) for i in range(0, len(value), 60)]
        return "(\n" + "".join(f"{pad}    {p}\n" for p in parts) + f"{pad})"
    if len(flat) + len(pad) <= 88 or not isinstance(value, (dict, list)) or not value:
        return flat
    if isinstance(value, dict):
        items = [f"{pad}    {k!r}: {_py(v, indent + 1)}," for k, v in sorted(value.items())]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    items = [f"{pad}    {_py(v, indent + 1)}," for v in value]
    return "[\n" + "\n".join(items) + f"\n{pad}]"


def _toposort(steps: Sequence[ir.Step]) -> list[ir.Step]:
    """Steps ordered so every step comes after the siblings it depends on (stable)."""
    names = {s.name for s in steps}

    def upstream(step: ir.Step) -> set[str]:
        ups = {d.step for d in step.dependencies}
        for i in step.inputs:
            if isinstance(i.value, ir.StepOutputRef):
                ups.add(i.value.step)
        if step.foreach is not None and isinstance(step.foreach.source, ir.StepOutputRef):
            ups.add(step.foreach.source.step)
        if step.when is not None:
            for v in (step.when.condition.left, step.when.condition.right):
                if isinstance(v, ir.StepOutputRef):
                    ups.add(v.step)
        return (ups & names) - {step.name}

    done: set[str] = set()
    out: list[ir.Step] = []
    pending = list(steps)
    while pending:
        for step in pending:
            if upstream(step) <= done:
                break
        else:  # a cycle: validation rejects it; keep the given order
            step = pending[0]
        pending.remove(step)
        done.add(step.name)
        out.append(step)
    return out


class _Scope:
    """The task keys of one level of steps (top level or one inline sub-workflow)."""

    def __init__(self, prefix: str, steps: Sequence[ir.Step]) -> None:
        self.prefix = prefix
        self.steps = {s.name: s for s in steps}

    def key(self, name: str) -> str:
        return self.prefix + name


class _Compiler:
    def __init__(self, wf: ir.Workflow) -> None:
        self.wf = wf
        self.specs: dict[str, dict[str, Any]] = {}
        self.lines: list[str] = []
        self.edges: list[str] = []
        self.pods = False  # a step runs as a KubernetesPodOperator (see .pods)
        self.refs = False  # a step triggers another workflow's DAG (see .refs)
        self.jobs = False  # a step creates a Kubernetes resource (see .jobs)
        self.claim_users: dict[str, int] = {}  # steps mounting each workflow volume
        for s in ir.all_steps([*wf.steps, *(h for hook in wf.exit_hooks for h in hook.steps)]):
            for m in s.volume_mounts:
                self.claim_users[m.name] = self.claim_users.get(m.name, 0) + 1

    def _fail(self, step: str, feature: Feature | str, detail: str) -> UnsupportedFeatureError:
        name = feature.value if isinstance(feature, Feature) else feature
        return UnsupportedFeatureError(ENGINE, self.wf.name, step, name, detail)

    # ------------------------------------------------------------------ top level

    def compile(self) -> str:
        wf = self.wf
        top = _Scope("", wf.steps)
        self._emit_steps(top, wf.steps, indent=1, group_rule=None)
        main_keys = [top.key(s.name) for s in wf.steps]
        inner_keys = [k for k in self.specs if k not in main_keys]  # tasks inside groups
        # Airflow's "watcher" idiom: a run's state comes from its leaf tasks, so a failed
        # step whose failure an edge or exit hook handles would leave the run succeeded.
        watch = bool(wf.exit_hooks) or self._absorbs_failures()
        hook_lines: list[str] = []
        if watch:
            hook_lines.append("")
            hook_lines.append(f"    main = [{', '.join(f't[{k!r}]' for k in main_keys)}]")
        if wf.exit_hooks:
            hook_lines.append("    # exit hooks: run after every workflow task, by trigger rule")
            for hook in wf.exit_hooks:
                for step in hook.steps:
                    if step.dependencies or step.depends is not None:
                        raise self._fail(step.name, Feature.EXIT_HOOKS,
                                         "exit-hook steps cannot depend on each other on "
                                         "Airflow (each hook task hangs off every workflow "
                                         "task by its trigger rule)")
                    if step.name in top.steps or step.name in self.specs:
                        raise self._fail(step.name, Feature.EXIT_HOOKS,
                                         "an exit-hook step reuses a workflow step's name")
                    scope = _Scope("", [step])
                    self._emit_task(scope, step, hook_lines, 1, rule="all_done",
                                    extra_scope=top)
                    status = _HOOK_STATUS.get(hook.on)
                    self.specs[step.name]["hook"] = True
                    if status is not None:  # the runner checks the run's status (rule S7)
                        self.specs[step.name]["status"] = status
                    hook_lines.append(f"    main >> t[{step.name!r}]")
        if watch:
            hook_lines.append("    # the run fails when a failure reached a leaf step (rule S7)")
            hook_lines.append(f"    t[{EXIT_STATUS_TASK!r}] = task(")
            hook_lines.append(f"        _couler_exit_status, task_id={EXIT_STATUS_TASK!r}, "
                              "trigger_rule='all_done', retries=0,")
            hook_lines.append("    )()")
            hook_lines.append(f"    main >> t[{EXIT_STATUS_TASK!r}]")
            if inner_keys:  # a group's edge to a task starts at the group's last tasks only
                hook_lines.append(f"    [{', '.join(f't[{k!r}]' for k in inner_keys)}] "
                                  f">> t[{EXIT_STATUS_TASK!r}]")
        return self._render(hook_lines)

    def _graph(self) -> dict[str, list[str]]:
        """Each workflow task's upstream tasks; a group stands for its inner tasks (an edge
        to it reaches its roots, an edge from it leaves its leaves)."""
        graph: dict[str, list[str]] = {}

        def exits(scope: _Scope, name: str) -> list[str]:
            step = scope.steps[name]
            body = step.body
            if isinstance(body, ir.SubWorkflowSpec) and body.steps:
                inner = _Scope(scope.key(name) + ".", body.steps)
                used = {d.step for s in body.steps for d in s.dependencies}
                return [k for s in body.steps if s.name not in used
                        for k in exits(inner, s.name)]
            return [scope.key(name)]

        def walk(scope: _Scope, steps: Sequence[ir.Step], entry: list[str]) -> None:
            for step in steps:
                ups = [k for d in step.dependencies if d.step in scope.steps
                       for k in exits(scope, d.step)] or list(entry)
                body = step.body
                if isinstance(body, ir.SubWorkflowSpec) and body.steps:
                    walk(_Scope(scope.key(step.name) + ".", body.steps), body.steps, ups)
                else:
                    graph[scope.key(step.name)] = ups

        walk(_Scope("", self.wf.steps), self.wf.steps, [])
        return graph

    def _absorbs_failures(self) -> bool:
        """Whether a step can run after a failed upstream (a failed / skipped / any edge)."""
        return any(s.depends is not None or any(
            d.condition is not ir.EdgeCondition.SUCCEEDED for d in s.dependencies)
            for s in ir.all_steps(self.wf.steps))

    def _render(self, hook_lines: list[str]) -> str:
        wf = self.wf
        imports = ["DAG", "Variable", "get_current_context", "task"]
        if wf.parameters:
            imports.append("Param")
        if any(isinstance(s.body, ir.SubWorkflowSpec) for s in ir.all_steps(wf.steps)):
            imports.append("TaskGroup")
        if wf.schedule is not None and wf.schedule.timezone:
            imports.append("CronTriggerTimetable")
        if not any("task(" in line for line in [*self.lines, *hook_lines]):
            imports.remove("task")  # every step is a pod
        head = [
            f'"""Airflow DAG of the Couler workflow {wf.name!r}.',
            "",
            "Generated by couler.compilers.airflow; do not edit. Each step runs as a subprocess",
            "on the Airflow worker (the step's container image is not used).",
            '"""',
            "",
            "from __future__ import annotations",
            "",
            "import datetime",
            "import hashlib",
            "import json",
            "import operator",
            "import os",
            "import re",
            "import shlex",
            "import subprocess",
            "import sys",
            "import tempfile",
            "import time",
            "from typing import Any",
            "",
            f"from airflow.sdk import {', '.join(sorted(imports))}",
            "from airflow.sdk.exceptions import (",
            "    AirflowFailException,",
            "    AirflowSkipException,",
            "    AirflowTaskTimeout,",
            ")",
            "",
            f"WORKFLOW_NAME = {wf.name!r}",
            f"WHEN_SKIP_KEY = {WHEN_SKIP_KEY!r}  # XCom of a task skipped by its own when",
            "# Airflow Variables: the artifact store's base URL (default: a local directory)",
            "# and the connection id its object storage uses",
            f"ARTIFACT_ROOT_VARIABLE = {ARTIFACT_ROOT_VARIABLE!r}",
            f"ARTIFACT_CONN_VARIABLE = {ARTIFACT_CONN_VARIABLE!r}",
            "# Each workflow task's upstream tasks (groups flattened), for the run's status.",
            f"GRAPH: dict[str, list[str]] = {_py(self._graph())}",
            "# Static description of every step, read by _couler_run on the worker.",
            "STEPS: dict[str, dict[str, Any]] = {}",
            *(f"STEPS[{key!r}] = {_py(dict(sorted(spec.items())))}"
              for key, spec in self.specs.items()),
        ]
        dag_args = self._dag_args()
        body = [
            "",
            "",
            "with DAG(",
            *(f"    {k}={v}," for k, v in dag_args),
            ") as dag:",
            "    t: dict[str, Any] = {}",
            *self.lines,
        ]
        if self.edges:
            body += ["", "    # dependencies", *self.edges]
        body += hook_lines
        pods = ((POD_RUNTIME if self.pods else "") + (REF_RUNTIME if self.refs else "")
                + (JOB_RUNTIME if self.jobs else ""))
        return ("\n".join(head) + "\n" + _RUNTIME + "\n\n" + classifier_source() + pods
                + "\n\n" + "\n".join(body) + "\n")

    def _dag_args(self) -> list[tuple[str, str]]:
        wf = self.wf
        args: list[tuple[str, str]] = [("dag_id", repr(wf.name))]
        sched = wf.schedule
        if sched is None:
            args.append(("schedule", "None"))
        else:
            if sched.timezone:
                args.append(("schedule", f"CronTriggerTimetable({sched.schedule!r}, "
                                         f"timezone={sched.timezone!r})"))
            else:
                args.append(("schedule", repr(sched.schedule)))
            if sched.concurrency_policy is ir.ConcurrencyPolicy.REPLACE:
                raise self._fail("", Feature.CRON, "Airflow cannot cancel a running DAG run "
                                                   "when the next one starts (replace)")
            if sched.concurrency_policy is ir.ConcurrencyPolicy.FORBID:
                args.append(("max_active_runs", "1"))
            if sched.suspend:
                args.append(("is_paused_upon_creation", "True"))
        args.append(("start_date", "datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)"))
        args.append(("catchup", "False"))
        if wf.labels:
            args.append(("tags", repr([f"{k}={v}" for k, v in wf.labels])))
        if wf.parallelism is not None:
            args.append(("max_active_tasks", str(wf.parallelism)))
        if wf.timeout_seconds is not None:
            args.append(("dagrun_timeout", f"datetime.timedelta(seconds={wf.timeout_seconds})"))
        if wf.parameters:
            params = [f"{p.name!r}: {self._param(p)}" for p in wf.parameters]
            text = "{" + ", ".join(params) + "}"
            if len(text) > 80:
                text = "{\n" + "".join(f"        {p},\n" for p in params) + "    }"
            args.append(("params", text))
        return args

    @staticmethod
    def _param(p: ir.Parameter) -> str:
        parts = [repr(p.default.value) if p.default is not None else "None"]
        vtype = _PARAM_TYPE.get(p.type)
        if vtype is not None:
            parts.append(f"type={vtype!r}" if p.default is not None
                         else f"type=[{vtype!r}, 'null']")
        if p.description:
            parts.append(f"description={p.description!r}")
        if p.enum:
            parts.append(f"enum={[e.value for e in p.enum]!r}")
        return f"Param({', '.join(parts)})"

    # ------------------------------------------------------------------ steps

    def _emit_steps(self, scope: _Scope, steps: Sequence[ir.Step], indent: int,
                    group_rule: str | None) -> None:
        for step in _toposort(steps):
            rule = self._trigger_rule(step)
            if rule is None and group_rule is not None:
                rule = group_rule  # a root of a group inherits the group's edges
            if _is_group(step):
                self._emit_group(scope, step, indent, rule)
            else:
                self._emit_task(scope, step, self.lines, indent, rule=rule)
            for dep in step.dependencies:
                if dep.step in scope.steps:
                    self.edges.append(f"    t[{scope.key(dep.step)!r}] >> "
                                      f"t[{scope.key(step.name)!r}]")

    def _trigger_rule(self, step: ir.Step) -> str | None:
        if step.depends is not None:  # the runner evaluates it once every upstream finished
            return "all_done"
        conditions = {d.condition for d in step.dependencies}
        if not conditions:
            return None
        if len(conditions) > 1:
            raise self._fail(step.name, Feature.EDGE_CONDITIONS,
                             "Airflow has one trigger_rule per task: all edges of a step must "
                             "share one condition, got " + ", ".join(sorted(conditions)))
        condition = conditions.pop()
        if condition not in _RULE_OF_EDGE:
            raise self._fail(step.name, Feature.EDGE_CONDITIONS,
                             f"Airflow has no trigger rule for {condition.value!r}: it does not "
                             "tell a task that was not run from one skipped by its when")
        return _RULE_OF_EDGE[condition]

    def _location(self, step: ir.Step, loc: ir.ArtifactLocation, key: str) -> dict[str, Any]:
        """Where an artifact lives: ``{"key": ...}`` in the artifact store, or a URL with
        credentials (Variable names) for an explicit ArtifactLocation."""
        if loc.storage is ir.StorageKind.DEFAULT:
            return {"key": loc.key or key}
        if loc.storage in _SCHEMES:
            if not loc.bucket:
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"a {loc.storage.value} artifact location needs a bucket")
            url = f"{_SCHEMES[loc.storage]}://{loc.bucket}/{(loc.key or key).lstrip('/')}"
        elif loc.storage is ir.StorageKind.HTTP and loc.url:
            url = loc.url
        elif loc.storage is ir.StorageKind.LOCAL and loc.key:
            url = "file://" + loc.key
        else:
            raise self._fail(step.name, Feature.ARTIFACTS,
                             f"object storage cannot read a {loc.storage.value} location "
                             "(git repositories need a clone step)")
        where: dict[str, Any] = {"url": url}
        if loc.endpoint:
            scheme = "http" if loc.insecure else "https"
            where["endpoint"] = (loc.endpoint if "://" in loc.endpoint
                                 else f"{scheme}://{loc.endpoint}")
        for field_name in ("access_key", "secret_key"):
            ref = getattr(loc, field_name)
            if ref is not None:
                where[field_name] = f"{ref.name}/{ref.key}"
        return where

    def _artifacts(self, scope: _Scope, step: ir.Step) -> dict[str, Any]:
        """Input artifacts (fetched before the command) and output artifacts (stored after
        it) of one step, keyed RUN_ID/STEP/NAME in the artifact store (a map step's items
        RUN_ID/STEP/NAME/item-INDEX; no step reads those back)."""
        key = scope.key(step.name)
        outputs = []
        for out in step.output_artifacts:
            to = self._location(step, out.location or ir.ArtifactLocation(),
                                f"{key}/{out.name}")
            if step.foreach is not None:
                if "key" not in to:
                    raise self._fail(step.name, Feature.ARTIFACTS,
                                     f"output artifact {out.name!r} has its own location: a "
                                     "map step's items would overwrite one another's")
                to["per_item"] = True  # RUN_ID/STEP/NAME/item-MAP_INDEX
            outputs.append({"name": out.name, "path": out.path, "to": to})
        inputs = []
        for a in step.input_artifacts:
            src = a.source
            if isinstance(src, ir.StepArtifactRef):
                producer = scope.steps.get(src.step)
                art = None if producer is None else next(
                    (o for o in producer.output_artifacts if o.name == src.artifact), None)
                if producer is None or art is None or not _plain(producer):
                    raise self._fail(step.name, Feature.ARTIFACTS,
                                     f"artifact {src.step}.{src.artifact} is not an output "
                                     "of a step in this step's scope")
                if producer.foreach is not None:
                    raise self._fail(step.name, Feature.ARTIFACTS,
                                     f"artifact {src.step}.{src.artifact} is a map step's: "
                                     "each item keeps its own, none is the step's")
                where = self._location(producer, art.location or ir.ArtifactLocation(),
                                       f"{scope.key(src.step)}/{src.artifact}")
            else:
                where = self._location(step, src, f"{key}/{a.name}")
            inputs.append({"name": a.name, "path": a.path, "from": where})
        return {"input_artifacts": inputs, "output_artifacts": outputs}

    def _depends(self, scope: _Scope, step: ir.Step, expr: ir.DependsExpr) -> list[Any]:
        """A depends expression as nested lists the runner evaluates (``_couler_expr``)."""
        if isinstance(expr, ir.DependsTerm):
            if not _plain(scope.steps.get(expr.step)):
                raise self._fail(step.name, Feature.DEPENDS_EXPRESSION,
                                 f"the expression names the sub-workflow {expr.step!r}: a "
                                 "TaskGroup has no single outcome the runner can read")
            return ["term", scope.key(expr.step), expr.condition.value]
        if isinstance(expr, ir.DependsNot):
            return ["not", self._depends(scope, step, expr.term)]
        kind = "all" if isinstance(expr, ir.DependsAll) else "any"
        return [kind, [self._depends(scope, step, t) for t in expr.terms]]

    def _emit_group(self, scope: _Scope, step: ir.Step, indent: int, rule: str | None) -> None:
        body = step.body
        assert isinstance(body, ir.SubWorkflowSpec)
        policies = [("when", step.when), ("map", step.foreach), ("loop", step.loop),
                    ("retry", step.retry), ("timeout", step.timeout_seconds),
                    ("priority", step.priority), ("parallelism", step.parallelism)]
        for what, value in policies:
            if value is not None:
                raise self._fail(step.name, Feature.SUBWORKFLOW_INLINE,
                                 f"a TaskGroup cannot carry a group-level {what}; set it on "
                                 "the inner steps")
        key = scope.key(step.name)
        pad = "    " * indent
        self.lines.append("")
        self.lines.append(f"{pad}with TaskGroup(group_id={step.name!r}) as t[{key!r}]:")
        inner = _Scope(key + ".", body.steps)
        self._emit_steps(inner, body.steps, indent + 1, rule)

    def _value(self, scope: _Scope, step: ir.Step, v: ir.ValueSource,
               xcoms: dict[str, str], *, own: bool = False) -> dict[str, Any]:
        if isinstance(v, ir.Literal):
            return {"literal": v.text}
        if isinstance(v, ir.WorkflowParamRef):
            return {"param": v.name}
        if isinstance(v, ir.ItemRef):
            return {"item": v.key}
        if own and v.step == step.name:
            return {"own": v.output}
        ref = self._output_ref(scope, step, v)
        slot = next((k for k, r in xcoms.items() if r == ref), None)
        if slot is None:
            slot = f"x{len(xcoms)}"
            xcoms[slot] = ref
        return {"xcom": slot}

    def _output_ref(self, scope: _Scope, step: ir.Step, v: ir.StepOutputRef) -> str:
        """The generated expression reading output ``v`` (an XComArg)."""
        target = scope.steps.get(v.step)
        key = scope.key(v.step)
        while target is not None and isinstance(target.body, ir.SubWorkflowSpec):
            inner = next((s for s in target.body.steps if s.output(v.output) is not None), None)
            if inner is None:
                break
            key, target = f"{key}.{inner.name}", inner
        if target is None:
            raise self._fail(step.name, Feature.PARAMETERS,
                             f"output {v.step}.{v.output} is not in this step's scope")
        return f"t[{key!r}][{v.output!r}]"

    def _condition(self, scope: _Scope, step: ir.Step, cond: ir.Condition,
                   xcoms: dict[str, str], *, own: bool = False) -> dict[str, Any]:
        return {"left": self._value(scope, step, cond.left, xcoms, own=own),
                "op": cond.op.value,
                "right": self._value(scope, step, cond.right, xcoms, own=own)}

    def _spec(self, scope: _Scope, step: ir.Step, xcoms: dict[str, str]) -> dict[str, Any]:
        body = step.body
        spec: dict[str, Any] = {}
        if isinstance(body, ir.ContainerSpec):
            spec.update(kind="container", command=list(body.command), args=list(body.args),
                        working_dir=body.working_dir)
        elif isinstance(body, ir.ScriptSpec):
            interpreter = list(body.command) or [body.language.value]
            spec.update(kind="script", source=body.source, interpreter=interpreter,
                        args=list(body.args), working_dir=body.working_dir)
        elif isinstance(body, ir.SubWorkflowSpec):
            spec.update(kind="ref", workflow=body.name)
        elif isinstance(body, ir.JobSpec):
            spec.update(job_spec(self.wf, step, self._fail))
            self.jobs = True
        else:  # pragma: no cover - rejected by check_capabilities
            raise self._fail(step.name, Feature.JOB, "not a container or script step")
        spec["inputs"] = {i.name: self._value(scope, step, i.value, xcoms) for i in step.inputs}
        spec["outputs"] = [{"name": o.name, "source": o.source.value, "path": o.selector,
                            "type": o.type.value} for o in step.outputs]
        env: list[dict[str, str]] = []
        for var in step.env:
            if var.secret is not None:
                env.append({"name": var.name, "secret": f"{var.secret.name}/{var.secret.key}"})
            else:
                env.append({"name": var.name, "value": var.value})
        spec["env"] = env
        if step.input_artifacts or step.output_artifacts:
            spec.update(self._artifacts(scope, step))
        cache = step.cache if step.cache is not None else self.wf.defaults.cache
        if cache is not None and cache.enabled:
            if step.output_artifacts:
                raise self._fail(step.name, Feature.CACHE, "the cache keeps a step's "
                                 "parameters, not its output artifacts")
            static = {k: spec.get(k) for k in ("kind", "command", "args", "source",
                                               "interpreter", "working_dir", "outputs")}
            static["image"] = getattr(body, "image", "")
            static["env"] = [v for v in env if "secret" not in v]
            content = _json_text(static) + cache.salt
            spec["cache"] = {"name": cache.name or scope.key(step.name),
                             "key": cache.key,
                             "digest": hashlib.sha256(content.encode()).hexdigest()[:16],
                             "max_age": cache.max_age_seconds}
        # edges whose trigger rule also admits an upstream that was not run (see _RUNTIME)
        retry = step.retry if step.retry is not None else self.wf.defaults.retry
        if retry is not None and ir.FailureClass.ANY not in retry.on:
            spec["retry_on"] = [c.value for c in retry.on]
        spec["edges"] = [[scope.key(d.step), d.condition.value] for d in step.dependencies
                         if d.condition in _CHECKED_EDGES and _plain(scope.steps.get(d.step))
                         and step.depends is None]
        if step.depends is not None:
            spec["depends"] = self._depends(scope, step, step.depends)
        spec["when"] = None
        if step.when is not None:
            spec["when"] = {**self._condition(scope, step, step.when.condition, xcoms),
                            "expect": step.when.expect}
        spec["loop"] = None
        if step.loop is not None:
            spec["loop"] = {**self._condition(scope, step, step.loop.condition, xcoms, own=True),
                            "max_iterations": step.loop.max_iterations}
        spec["items"] = None
        if step.foreach is not None and step.foreach.source is None:
            if len(step.foreach.items) > MAX_MAP_LENGTH:
                raise self._fail(step.name, Feature.MAP_STATIC,
                                 f"{len(step.foreach.items)} items exceed Airflow's "
                                 f"max_map_length ({MAX_MAP_LENGTH})")
            spec["items"] = [item.value for item in step.foreach.items]
        return spec

    def _task_kwargs(self, step: ir.Step, key: str, rule: str | None) -> list[str]:
        d = self.wf.defaults
        kwargs = [f"task_id={step.name!r}", "multiple_outputs=True"]
        if rule is not None:
            kwargs.append(f"trigger_rule={rule!r}")
        retry = step.retry if step.retry is not None else d.retry
        if retry is not None:
            kwargs.append(f"retries={retry.limit}")
            if retry.backoff is not None:
                b = retry.backoff
                kwargs.append(f"retry_delay=datetime.timedelta(seconds={b.base_seconds!r})")
                kwargs.append(f"retry_exponential_backoff={float(b.factor)!r}")
                if b.cap_seconds is not None:
                    kwargs.append(
                        f"max_retry_delay=datetime.timedelta(seconds={b.cap_seconds!r})")
            else:  # no back-off: retry at once, as on the other engines (not Airflow's 300 s)
                kwargs.append("retry_delay=datetime.timedelta(seconds=0)")
        timeout = step.timeout_seconds if step.timeout_seconds is not None else d.timeout_seconds
        if timeout is not None:
            kwargs.append(f"execution_timeout=datetime.timedelta(seconds={timeout})")
        priority = step.priority if step.priority is not None else d.priority
        if priority is not None:
            kwargs.append(f"priority_weight={priority}")
        if step.foreach is not None and step.foreach.parallelism is not None:
            kwargs.append(f"max_active_tis_per_dagrun={step.foreach.parallelism}")
        return kwargs

    def _emit_task(self, scope: _Scope, step: ir.Step, out: list[str], indent: int, *,
                   rule: str | None, extra_scope: _Scope | None = None) -> None:
        key = scope.key(step.name)
        xcoms: dict[str, str] = {}
        lookup = scope
        if extra_scope is not None:  # exit hooks read the workflow's outputs
            lookup = _Scope("", [*extra_scope.steps.values(), step])
        spec = self._spec(lookup, step, xcoms)
        pad = "    " * indent
        if step.foreach is not None and step.foreach.source is not None:
            # Airflow maps only over a task's return_value: a helper task decodes the list.
            src = step.foreach.source
            helper = f"{key}{ITEMS_SUFFIX}"
            if isinstance(src, ir.StepOutputRef):
                arg = f"value={self._output_ref(lookup, step, src)}"
            else:
                arg = f"param={src.name!r}"
            rule_arg = f", trigger_rule={rule!r}" if rule is not None else ""
            if step.depends is not None:  # the helper runs first: it evaluates the expression
                arg += f", step={key!r}"
            out.append(f"{pad}t[{helper!r}] = task(")
            out.append(f"{pad}    _couler_items, task_id={step.name + ITEMS_SUFFIX!r}{rule_arg},")
            out.append(f"{pad})({arg})")
            expand = f"t[{helper!r}]"
        elif step.foreach is not None:
            expand = repr(list(range(len(step.foreach.items))))
        else:
            expand = ""
        self.specs[key] = spec
        kwargs = self._task_kwargs(step, key, rule)
        xcom_arg = "{" + ", ".join(f"{k!r}: {v}" for k, v in xcoms.items()) + "}"
        if isinstance(step.body, ir.SubWorkflowSpec):  # a reference: trigger its DAG
            self.refs = True
            kwargs = [k for k in kwargs if k != "multiple_outputs=True"]
            out.append(f"{pad}t[{key!r}] = _CoulerTrigger(")
            out += [f"{pad}    {arg}," for arg in
                    [*kwargs, f"couler_step={key!r}", f"couler_xcoms={xcom_arg}",
                     *ref_kwargs(step, self._fail)]]
            out.append(f"{pad})")
            return
        if needs_pod(self.wf, step):
            self.pods = True
            pod, extra = pod_kwargs(self.wf, step, self.claim_users, self._fail, pad + "    ")
            spec.update(extra)
            kwargs = [k for k in kwargs if k != "multiple_outputs=True"]
            out.append(f"{pad}t[{key!r}] = _CoulerPod(")
            out += [f"{pad}    {arg}," for arg in
                    [*kwargs, f"couler_step={key!r}", f"couler_xcoms={xcom_arg}", *pod]]
            out.append(f"{pad}).output")
            return
        call = f"task(_couler_run, {', '.join(kwargs)})"
        if expand:
            tail = f".partial(step={key!r}, xcoms={xcom_arg}).expand(item={expand})"
        else:
            tail = f"(step={key!r}, xcoms={xcom_arg})"
        line = f"{pad}t[{key!r}] = {call}{tail}"
        if len(line) <= 99:
            out.append(line)
            return
        out.append(f"{pad}t[{key!r}] = task(")  # one keyword per line when long
        out += [f"{pad}    {arg}," for arg in ["_couler_run", *kwargs]]
        out.append(f"{pad}){tail}")
