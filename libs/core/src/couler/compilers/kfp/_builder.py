"""The builder of a ``@dsl.pipeline`` from a Couler IR workflow (see the package docstring)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from couler import ir
from couler.compilers import entrypoint, kube_job
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError

from ._capabilities import ENGINE, MAX_UNROLL
from ._helpers import (
    _EDGE_REFUSED,
    _INTERPRETER,
    _NO_DEPENDS,
    _ORDERING,
    _PLACEHOLDER,
    _PY_TYPE,
    _SWAPPED,
    LOCAL_DIR_ENV,
    LOCAL_SECRETS_ENV,
    _annotation_src,
    _artifact_sources,
    _binary_quantity,
    _compare,
    _ident,
    _import,
    _is_channel,
    _item_text,
    _ladder_levels,
    _log_name,
    _mount_rewriter,
    _rung_script,
    _static_key,
    _wrapper,
    recurring_schedule,
)

# a job step's resource is owned by the step's pod: its name and uid come from the
# downward API (kfp-kubernetes use_field_path_as_env) and replace these marks at run time
_POD_ENV = (("@COULER_POD_NAME@", "COULER_POD_NAME"), ("@COULER_POD_UID@", "COULER_POD_UID"))
_POD_OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "@COULER_POD_NAME@",
              "uid": "@COULER_POD_UID@"}


class _StepPlan:
    """What the builder knows about one step: kfp names and types of inputs and outputs."""

    def __init__(self, step: ir.Step) -> None:
        self.step = step
        taken: set[str] = set()
        self.inputs: dict[str, str] = {}  # IR input name / "{{item...}}" key → identifier
        self.outputs: dict[str, str] = {o.name: _ident(o.name, taken) for o in step.outputs}
        for i in step.inputs:
            self.inputs[i.name] = _ident(i.name, taken)
        self.in_artifacts = {a.name: _ident(a.name, taken) for a in step.input_artifacts}
        self.out_artifacts = {a.name: _ident(a.name, taken) for a in step.output_artifacts}
        self.item_keys: dict[str, str] = {}  # item key ("" = whole item) → identifier
        self.taken = taken
        self.status: str | None = None
        self.rung: tuple[str, str, str] | None = None

    def rung_params(self) -> tuple[str, str, str]:
        """A memory-escalation rung's (attempts-before input, class output, attempts output)."""
        if self.rung is None:
            self.rung = (_ident("couler_attempts_before", self.taken),
                         _ident("couler_class", self.taken),
                         _ident("couler_attempts", self.taken))
        return self.rung

    def status_input(self) -> str:
        """The input receiving ``dsl.PipelineTaskFinalStatus`` (failed / error exit hooks)."""
        if self.status is None:
            self.status = _ident("couler_status", self.taken)
        return self.status

    def item_input(self, key: str) -> str:
        if key not in self.item_keys:
            self.item_keys[key] = _ident("couler_item" + (f"_{key}" if key else ""), self.taken)
        return self.item_keys[key]


_RUN_MARK = "couler:run"  # the mark of {{workflow.uid}} (no input is named so)
_LOCAL_RUN_ID = f"os.path.basename(os.environ.get({LOCAL_DIR_ENV!r}, ''))"


class _Builder:
    def __init__(self, wf: ir.Workflow, *, local: bool, workdir: str | None,
                 prefix: str = "") -> None:
        self.wf = wf
        self.local = local
        self.workdir = workdir
        self.prefix = prefix  # "GROUP/" for the steps of an inline sub-workflow
        self.dsl: Any = _import("kfp.dsl")
        self.hooks_exit: list[ir.Step] = []  # any / failed / error: the ExitHandler exit task
        # steps reading a PipelineTaskFinalStatus: name → (run when the state matches?,
        # states); a failed / error exit hook skips on SUCCEEDED, an edge handler runs on
        # its edge's states
        self.gated: dict[str, tuple[bool, tuple[str, ...]]] = {}
        self.handlers: dict[str, ir.Dependency] = {}  # edge handler → its one edge
        self.guards: dict[str, list[ir.When]] = {}  # step → conditions to be reached
        self.has_dependents: set[str] = set()
        self.hooks_ok: list[ir.Step] = []
        # values (and artifacts) bound to sub-pipeline inputs
        self.scope: dict[ir.ValueSource | ir.StepArtifactRef, Any] = {}
        # step → (sub-pipeline, what its inputs carry)
        self.subs: dict[str, tuple[Any, list[ir.ValueSource | ir.StepArtifactRef]]] = {}
        self.output_types: dict[tuple[str, str], ir.ValueType] = {}
        # mapped step → the one output later steps read, collected over its items (in item
        # order) with dsl.Collected: a list input of the reader
        self.collected: dict[str, str] = {}
        self.plans: dict[str, _StepPlan] = {}
        self.param_ids: dict[str, str] = {}
        # looped step → (its iteration 2 pipeline, the outputs / values that pipeline takes)
        self.loops: dict[str, tuple[Any, list[ir.StepOutputRef],
                                    list[ir.ValueSource | ir.StepArtifactRef]]] = {}
        # memory-escalating step → (the pipeline of its rungs 2..N, the values it takes)
        self.ladders: dict[str, tuple[Any, list[ir.ValueSource | ir.StepArtifactRef]]] = {}
        # memory-escalating step → the components of its rungs 2..N (task STEP-memK), each
        # named apart: kfp 2.17's merge of a sub-pipeline's executors renames labels one
        # after another (exec-X → exec-X-2, then exec-X-2 → exec-X-2-2 catches both), so
        # same-named components with different memory would end up on one executor
        self.rung_components: dict[str, list[Any]] = {}
        self.claims: dict[str, Any] = {}  # claim template → its CreatePVC task
        self.claim_users: dict[str, list[Any]] = {}  # claim template → tasks mounting it

    def _fail(self, step: str, feature: Feature | str, detail: str) -> UnsupportedFeatureError:
        name = feature.value if isinstance(feature, Feature) else feature
        return UnsupportedFeatureError(ENGINE, self.wf.name, step, name, detail)

    # ------------------------------------------------------------------ checks

    def _check(self) -> list[ir.Step]:
        wf = self.wf
        for attr, what in (("parallelism", "workflow parallelism"),
                           ("service_account", "service account"),
                           ("dns", "DNS config")):
            if getattr(wf, attr):
                raise self._fail("", what, "not expressible in a KFP PipelineSpec (neither "
                                           "core kfp nor the kfp-kubernetes extension sets it)")
        sc = wf.security_context
        if sc is not None and (sc.fs_group is not None or sc.se_linux_options is not None):
            raise self._fail("", "security context",
                             "kfp-kubernetes set_security_context sets run_as_user, "
                             "run_as_group and run_as_non_root only (no fsGroup / SELinux)")
        self._check_volumes()
        recurring_schedule(wf)  # refuses what a KFP recurring run cannot express
        for hook in wf.exit_hooks:
            if hook.on is ir.RunStatus.SUCCEEDED:
                self.hooks_ok.extend(hook.steps)
                continue
            self.hooks_exit.extend(hook.steps)
            if hook.on is not ir.RunStatus.ANY:
                self.gated.update((s.name, (False, ("SUCCEEDED",))) for s in hook.steps)
        if len(self.hooks_exit) > 1:
            raise self._fail(self.hooks_exit[1].name, Feature.EXIT_HOOKS,
                             "more than one any / failed / error hook step: dsl.ExitHandler "
                             "takes exactly one exit task and exit handlers do not nest")
        by_name = {s.name: s for s in wf.steps}
        self.guards = self._guards(self._order(wf.steps))
        self.has_dependents = {d.step for s in [*wf.steps, *self.hooks_ok]
                               for d in s.dependencies}
        if self.hooks_ok:
            self.has_dependents |= {s.name for s in wf.steps}
        self._check_handlers(by_name)
        for step in [*wf.steps, *self.hooks_exit, *self.hooks_ok]:
            self._check_mounts(step, outside=(self._nested(step) or step in self.hooks_exit
                                              or bool(self.prefix) or bool(self._levels(step))))
            for e in step.env:
                if e.secret is None and _PLACEHOLDER.search(e.value):
                    raise self._fail(step.name, "env from a run-time value",
                                     f"env {e.name!r}: KFP sets environment variables to "
                                     "literal values only (PipelineTask.set_env_variable); "
                                     "pass the value as an argument instead")
            self._check_artifacts(step, by_name)
            self._check_loop(step, by_name)
            self._check_ladder(step)
            if isinstance(step.body, ir.JobSpec) and self._by_class(step) is not None:
                raise self._fail(step.name, Feature.RETRY_FAILURE_CLASSES,
                                 "a job step's kubectl script is not run under the retry "
                                 "wrapper (its pod's exit says nothing of the job's cause)")
            if isinstance(step.body, ir.SubWorkflowSpec):
                self._check_group(step)
            upstream = {d.step for d in step.dependencies} | _artifact_sources(step)
            upstream |= {i.value.step for i in step.inputs if isinstance(i.value, ir.StepOutputRef)}
            for name in sorted(upstream):
                up = by_name.get(name)
                if up is None:
                    continue
                reads = name in _artifact_sources(step) or any(
                    isinstance(i.value, ir.StepOutputRef) and i.value.step == name
                    for i in step.inputs)
                if reads and (up.when is not None or self.guards.get(name)):
                    raise self._fail(step.name, "reading a conditional step's output",
                                     f"{name!r} runs under dsl.If (in a sub-pipeline); KFP "
                                     "passes no output out of it (dsl.OneOf is not mapped)")
            for i in step.inputs:
                if isinstance(i.value, ir.StepOutputRef):
                    up = by_name.get(i.value.step)
                    if up is not None and up.foreach is not None:
                        self._check_collected(step, up, i.value.output)
            if step in self.hooks_exit and any(isinstance(i.value, ir.StepOutputRef)
                                              for i in step.inputs):
                raise self._fail(step.name, Feature.EXIT_HOOKS,
                                 "the exit task is created before the tasks it would read")
        return self._order(wf.steps)

    def _check_collected(self, step: ir.Step, up: ir.Step, output: str) -> None:
        """``step`` reads ``output`` of the mapped step ``up``: dsl.Collected gathers it over
        the map's items (a list, in item order), one output per mapped step."""
        problem = ""
        if up.loop is not None or self._levels(up) or up in self.hooks_exit:
            problem = "the mapped step is looped, memory-escalating or an exit hook"
        elif self.collected.get(up.name, output) != output:
            problem = (f"{up.name!r}'s outputs {self.collected[up.name]!r} and {output!r}: "
                       "Couler collects one output per mapped step")
        if problem:
            raise self._fail(step.name, "reading a mapped step's output",
                             f"dsl.Collected is not used here: {problem}")
        self.collected[up.name] = output

    def _check_handlers(self, by_name: Mapping[str, ir.Step]) -> None:
        """Steps on a failed / completed / any edge: KFP's ``ignore_upstream_failure``.

        Such a task runs once its one upstream task has finished, whatever its outcome; a
        failed / completed one also reads the upstream's ``PipelineTaskFinalStatus`` and
        runs its command only on the edge's states. The KFP backend runs it as an Argo
        exit hook of the upstream task, outside the DAG, so it takes exactly one edge and
        nothing may depend on it.
        """
        runs_on = {ir.EdgeCondition.FAILED: ("FAILED",),
                   ir.EdgeCondition.COMPLETED: ("SUCCEEDED", "FAILED")}
        readers: dict[str, list[str]] = {}
        for step in [*self.wf.steps, *self.hooks_ok]:
            ups = {d.step for d in step.dependencies} | _artifact_sources(step)
            ups |= {i.value.step for i in step.inputs if isinstance(i.value, ir.StepOutputRef)}
            for name in ups:
                readers.setdefault(name, []).append(step.name)
        for step in self.wf.steps:
            if step.depends is not None:
                raise self._fail(step.name, Feature.DEPENDS_EXPRESSION, _NO_DEPENDS)
            odd = [d for d in step.dependencies
                   if d.condition is not ir.EdgeCondition.SUCCEEDED and not self._guarding(d)]
            if not odd:
                continue
            dep = odd[0]
            why = _EDGE_REFUSED.get(dep.condition)
            if why is not None:
                raise self._fail(step.name, Feature.EDGE_CONDITIONS,
                                 f"{dep.step}.{dep.condition.value}: {why}")
            up = by_name.get(dep.step)
            problem = ""
            if len(step.dependencies) > 1:
                problem = "it has more than one edge (KFP gives a task the final status of one " \
                          "upstream task only)"
            elif up is None or up.when is not None or up.foreach is not None or \
                    self._nested(up) or isinstance(up.body, ir.SubWorkflowSpec):
                problem = f"{dep.step!r} is conditional or mapped (a dsl.If / ParallelFor " \
                          "group, not one task)"
            elif step.when is not None or step.foreach is not None:
                problem = "the handler itself is conditional or mapped"
            elif any(isinstance(i.value, ir.StepOutputRef) for i in step.inputs) or \
                    _artifact_sources(step):
                problem = "it reads a step's output (a failed step has none)"
            elif readers.get(step.name) or self.hooks_ok:
                who = (repr(readers[step.name][0]) if readers.get(step.name)
                       else "a succeeded exit hook (it runs after every step)")
                problem = (f"{who} depends on it: the KFP backend runs it as an exit hook of "
                           "its upstream task, outside the DAG")
            if problem:
                raise self._fail(step.name, Feature.EDGE_CONDITIONS,
                                 f"{dep.step}.{dep.condition.value} becomes "
                                 f"ignore_upstream_failure(), which cannot hold here: {problem}")
            self.handlers[step.name] = dep
            if dep.condition in runs_on:
                self.gated[step.name] = (True, runs_on[dep.condition])

    def _guarding(self, dep: ir.Dependency) -> bool:
        """A succeeded-only edge from a step with a ``when``: a guard (see :meth:`_guards`)."""
        up = next((s for s in self.wf.steps if s.name == dep.step), None)
        return (dep.condition is ir.EdgeCondition.SUCCEEDED_ONLY and up is not None
                and up.when is not None)

    def _guards(self, steps: Sequence[ir.Step]) -> dict[str, list[ir.When]]:
        """Per step, the conditions under which it is reached (not "not run", rule S2).

        A plain edge passes the upstream's guards on (a skip by the upstream's own
        ``when`` lets its dependents run, S1); a succeeded-only edge from a step with a
        ``when`` adds that ``when`` (the upstream must have run, S3). A step runs iff its
        guards and its own ``when`` hold; it is compiled under nested ``dsl.If`` in a
        sub-pipeline, which its dependents can follow from outside.
        """
        by_name = {s.name: s for s in steps}
        out: dict[str, list[ir.When]] = {}
        for step in steps:
            acc: list[ir.When] = []
            for d in step.dependencies:
                up = by_name.get(d.step)
                if up is None:
                    continue
                more = list(out.get(up.name, ()))
                if d.condition is ir.EdgeCondition.SUCCEEDED_ONLY and up.when is not None:
                    more.append(up.when)
                acc += [w for w in more if w not in acc]
            out[step.name] = acc
        return out

    def _nested(self, step: ir.Step) -> bool:
        """Whether the step is built in its own sub-pipeline (task ``couler-STEP``)."""
        return (self._driven(step) or bool(self.guards.get(step.name))
                or (step.when is not None and step.name in self.has_dependents))

    def _check_loop(self, step: ir.Step, by_name: Mapping[str, ir.Step]) -> None:
        loop = step.loop
        if loop is None:
            return
        problem = ""
        if loop.max_iterations > MAX_UNROLL:
            problem = (f"KFP has no loops and Couler unrolls at most {MAX_UNROLL} iterations; "
                       f"this loop allows {loop.max_iterations}")
        elif loop.max_iterations < 2:
            problem = ""
        elif step.foreach is not None or step.when is not None or self._nested(step):
            problem = "a looped step that is also mapped, conditional or guarded"
        elif step.input_artifacts or step.output_artifacts:
            problem = "a looped step with artifacts"
        elif self.prefix or step in self.hooks_exit or step in self.hooks_ok:
            problem = "a looped step in a sub-workflow or an exit hook"
        if problem:
            raise self._fail(step.name, Feature.LOOP, problem)
        for other in [*self.wf.steps, *self.hooks_ok, *self.hooks_exit]:
            if any(isinstance(i.value, ir.StepOutputRef) and i.value.step == step.name
                   for i in other.inputs):
                raise self._fail(other.name, Feature.LOOP,
                                 f"reads an output of the looped step {step.name!r}: KFP "
                                 "cannot select the last executed iteration's outputs "
                                 "(dsl.OneOf is not mapped)")

    def _levels(self, step: ir.Step) -> list[dict[str, Any]]:
        """The compute resources of each rung of a memory-escalating step (see
        :meth:`_ladder`), or [] when it has one task: no memory factor or quantity, or a
        policy that does not retry out-of-memory failures (nothing to escalate then)."""
        if not isinstance(step.body, (ir.ContainerSpec, ir.ScriptSpec, ir.JobSpec)):
            return []  # an inline sub-workflow: _check_group refuses its retry
        return _ladder_levels(step.retry or self.wf.defaults.retry,
                              step.resources or self.wf.defaults.resources)

    def _check_ladder(self, step: ir.Step) -> None:
        """A memory-escalating step becomes a ladder of tasks: refuse what it cannot carry."""
        levels = self._levels(step)
        if not levels:
            return
        problem = ""
        if isinstance(step.body, ir.JobSpec):
            problem = ("a job step's pod runs kubectl: its memory is not the job's, and its "
                       "script is not run under the retry wrapper")
        elif step.foreach is not None or step.loop is not None or step.when is not None \
                or self.guards.get(step.name):
            problem = "the step is mapped, looped or conditional (its rungs would sit in " \
                      "one more dsl.ParallelFor / dsl.If each)"
        elif step in self.hooks_exit or step in self.hooks_ok:
            problem = "the step is an exit hook (the exit task is one task)"
        elif step.name in self.handlers or any(
                dep.step == step.name for dep in self.handlers.values()):
            problem = ("the step is on a failed / completed / any edge (an edge handler reads "
                       "the final status of one task, runs as one task's exit hook)")
        else:
            for other in [*self.wf.steps, *self.hooks_exit, *self.hooks_ok]:
                if any(isinstance(i.value, ir.StepOutputRef) and i.value.step == step.name
                       for i in other.inputs) or step.name in _artifact_sources(other):
                    problem = (f"{other.name!r} reads its outputs: the rung that ran last is "
                               "not known when the pipeline is compiled (dsl.OneOf is not "
                               "mapped)")
                    break
        names = {s.name for s in [*self.wf.steps, *self.hooks_exit, *self.hooks_ok]}
        taken = sorted(names & {f"{step.name}-mem{k}" for k in range(2, len(levels) + 1)})
        if not problem and taken:
            problem = f"its rung task name {taken[0]!r} is taken by another step"
        if problem:
            raise self._fail(step.name, Feature.MEMORY_ESCALATION,
                             "KFP fixes a task's memory for its retries, so the step becomes "
                             "one task per memory level, each under dsl.If(the one before "
                             f"ended out of memory); not here: {problem}")

    def _check_group(self, step: ir.Step) -> None:
        d = self.wf.defaults
        group_level = [name for name, used in (
            ("when", step.when is not None), ("map", step.foreach is not None),
            ("loop", step.loop is not None), ("retry", (step.retry or d.retry) is not None),
            ("timeout", step.timeout_seconds is not None), ("resources", step.resources),
            ("cache", step.cache), ("priority", step.priority is not None),
            ("node selector", step.node_selector), ("tolerations", step.tolerations),
            ("volume mounts", step.volume_mounts), ("env", step.env), ("labels", step.labels),
            ("inputs", step.inputs), ("outputs", step.outputs),
            ("artifacts", step.input_artifacts or step.output_artifacts),
            ("edge conditions", step.name in self.handlers or any(
                d.condition is not ir.EdgeCondition.SUCCEEDED for d in step.dependencies)),
        ) if used]
        if step in self.hooks_exit or step in self.hooks_ok:
            group_level.append("exit hook")
        if group_level:
            raise self._fail(step.name, Feature.SUBWORKFLOW_INLINE,
                             "a nested pipeline (a sub-DAG task) here carries no group-level "
                             + ", ".join(group_level) + "; set them on its steps")

    def _check_artifacts(self, step: ir.Step, by_name: Mapping[str, ir.Step]) -> None:
        for out in step.output_artifacts:
            if out.location is not None and out.location.storage is not ir.StorageKind.DEFAULT:
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"output artifact {out.name!r} at a chosen location: KFP "
                                 "stores output artifacts under the pipeline root")
            if out.global_name:
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"output artifact {out.name!r} as a workflow output: a KFP "
                                 "pipeline built by Couler declares no outputs")
        for a in step.input_artifacts:
            src = a.source
            if not isinstance(src, ir.StepArtifactRef):
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"input artifact {a.name!r} from a storage location: not "
                                 "mapped (dsl.importer could express s3:// / gs:// URIs)")
            up = by_name.get(src.step)
            if up is None or src.artifact not in {o.name for o in up.output_artifacts}:
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"input artifact {a.name!r} reads {src.step}.{src.artifact}, "
                                 "which is not an output artifact of a workflow step")
            if up.foreach is not None:
                raise self._fail(step.name, "reading a mapped step's output",
                                 "needs dsl.Collected, not mapped")
        if step in self.hooks_exit and step.input_artifacts:
            raise self._fail(step.name, Feature.EXIT_HOOKS,
                             "the exit task is created before the tasks it would read")

    def _check_volumes(self) -> None:
        for v in self.wf.volumes:
            if v.kind is ir.VolumeKind.CLAIM_TEMPLATE and not v.size:
                raise self._fail("", Feature.VOLUMES,
                                 f"claim template {v.name!r} has no size (CreatePVC needs one)")
            if v.kind in (ir.VolumeKind.PVC, ir.VolumeKind.CONFIG_MAP,
                          ir.VolumeKind.SECRET) and not v.claim_name:
                raise self._fail("", Feature.VOLUMES, f"volume {v.name!r} names no claim, "
                                                      "config map or secret")

    def _check_mounts(self, step: ir.Step, *, outside: bool) -> None:
        """Mounts kfp-kubernetes can express; ``outside``: the step is built outside the
        main DAG scope (an exit task, a sub-pipeline), where no claim template is made."""
        volumes = {v.name: v for v in self.wf.volumes}
        for m in step.volume_mounts:
            v = volumes.get(m.name)
            if v is None:
                raise self._fail(step.name, Feature.VOLUMES,
                                 f"mounts {m.name!r}, which is not a workflow volume")
            if m.read_only and v.kind in (ir.VolumeKind.PVC, ir.VolumeKind.CLAIM_TEMPLATE,
                                          ir.VolumeKind.EMPTY_DIR):
                raise self._fail(step.name, Feature.VOLUMES,
                                 f"read-only mount of {m.name!r}: kfp-kubernetes mount_pvc / "
                                 "empty_dir_mount have no readOnly")
            if m.sub_path and v.kind is not ir.VolumeKind.PVC \
                    and v.kind is not ir.VolumeKind.CLAIM_TEMPLATE:
                raise self._fail(step.name, Feature.VOLUMES,
                                 f"sub_path on {m.name!r}: kfp-kubernetes sets a sub path on "
                                 "PVC mounts only")
            if outside and v.kind is ir.VolumeKind.CLAIM_TEMPLATE:
                raise self._fail(step.name, Feature.VOLUMES,
                                 f"claim template {m.name!r} in an exit task or a sub-pipeline"
                                 ": the claim is made by a CreatePVC task in the main DAG, "
                                 "which that task cannot depend on")

    def _order(self, steps: Sequence[ir.Step]) -> list[ir.Step]:
        names = {s.name for s in steps}
        done: set[str] = set()
        out: list[ir.Step] = []
        pending = list(steps)
        while pending:
            progressed = False
            for step in list(pending):
                ups = {d.step for d in step.dependencies} | _artifact_sources(step)
                ups |= {i.value.step for i in step.inputs
                        if isinstance(i.value, ir.StepOutputRef)}
                if step.foreach is not None and isinstance(step.foreach.source,
                                                           ir.StepOutputRef):
                    ups.add(step.foreach.source.step)
                if (ups & names) <= done:
                    out.append(step)
                    done.add(step.name)
                    pending.remove(step)
                    progressed = True
            if not progressed:
                raise self._fail(pending[0].name, "dependency cycle", "")
        return out

    # ------------------------------------------------------------------ types

    def _collect_types(self, steps: Sequence[ir.Step]) -> None:
        for step in steps:
            for o in step.outputs:
                self.output_types[(step.name, o.name)] = o.type
        for step in steps:
            if step.foreach is not None and isinstance(step.foreach.source, ir.StepOutputRef):
                src = step.foreach.source
                self.output_types[(src.step, src.output)] = ir.ValueType.LIST
            conds = [w.condition for w in (step.when, step.loop) if w is not None]
            for cond in conds:
                if cond.op in _ORDERING:
                    for a, b in ((cond.left, cond.right), (cond.right, cond.left)):
                        key = (a.step, a.output) if isinstance(a, ir.StepOutputRef) else None
                        if (key is not None and isinstance(b, ir.Literal)
                                and b.type in (ir.ValueType.INT, ir.ValueType.FLOAT)
                                and self.output_types.get(key) in (ir.ValueType.STRING,
                                                                   ir.ValueType.JSON)):
                            self.output_types[key] = ir.ValueType.FLOAT

    def _input_type(self, v: ir.ValueSource) -> type:
        if isinstance(v, ir.WorkflowParamRef):
            p = self.wf.parameter(v.name)
            return _PY_TYPE[p.type] if p is not None else str
        if isinstance(v, ir.StepOutputRef):
            if self.collected.get(v.step) == v.output:
                return list  # dsl.Collected over the map's items
            return _PY_TYPE[self.output_types.get((v.step, v.output), ir.ValueType.STRING)]
        return str

    # ------------------------------------------------------------------ components

    def _by_class(self, step: ir.Step) -> ir.RetryPolicy | None:
        """The step's retry policy when it retries only some failure classes: then the
        :mod:`couler.compilers.entrypoint` wrapper retries inside the container (KFP's own
        retry would repeat every failure), else None."""
        retry = step.retry or self.wf.defaults.retry
        if retry is None or ir.FailureClass.ANY in retry.on:
            return None
        return retry

    @staticmethod
    def _wrapped(policy: ir.RetryPolicy | None, words: list[str]) -> list[str]:
        """``words`` run under the retry wrapper of ``policy`` (as they are without one);
        the wrapper's scratch directory is made per run (kfp.local runs steps side by side)."""
        if policy is None:
            return words
        return ["/bin/sh", "-c", entrypoint.script(policy, status_path="", work_dir=""),
                "couler-entrypoint", *words]

    def _argv(self, step: ir.Step, plan: _StepPlan) -> list[str]:
        """The step's command line with IR placeholders replaced by ``\\0NAME\\0`` marks."""
        body = step.body

        def mark(text: str) -> str:
            def repl(m: re.Match[str]) -> str:
                expr = m.group(1)
                if expr.startswith("inputs.") and expr[7:] in plan.inputs:
                    return f"\0{plan.inputs[expr[7:]]}\0"
                if expr == "item" or expr.startswith("item."):
                    if step.foreach is None:
                        raise self._fail(step.name, "item placeholder", "outside a map")
                    return f"\0{plan.item_input(expr[5:])}\0"
                if expr == "workflow.uid":  # the run's id (a tune step's study name)
                    return f"\0{_RUN_MARK}\0"
                return m.group(0)
            return _PLACEHOLDER.sub(repl, text)

        if isinstance(body, ir.ContainerSpec):
            return [mark(w) for w in (*body.command, *body.args)]
        if isinstance(body, ir.JobSpec):
            return ["/bin/sh", "-c", mark(self._job_script(step, body)), "couler-job"]
        assert isinstance(body, ir.ScriptSpec)
        interp = body.command or _INTERPRETER[body.language]
        return [*interp, "-c", mark(body.source), *(mark(a) for a in body.args)]

    def _signature(self, step: ir.Step, plan: _StepPlan) -> list[inspect.Parameter]:
        dsl = self.dsl
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter(plan.inputs[i.name], kind, annotation=self._input_type(i.value))
                  for i in step.inputs]
        params += [inspect.Parameter(ident, kind, annotation=str)
                   for ident in plan.item_keys.values()]
        params += [inspect.Parameter(
            plan.outputs[o.name], kind,
            annotation=dsl.OutputPath(_PY_TYPE[self.output_types[(step.name, o.name)]]))
            for o in step.outputs]
        params += [inspect.Parameter(plan.in_artifacts[a.name], kind,
                                     annotation=dsl.Input[dsl.Artifact])
                   for a in step.input_artifacts]
        params += [inspect.Parameter(plan.out_artifacts[a.name], kind,
                                     annotation=dsl.Output[dsl.Artifact])
                   for a in step.output_artifacts]
        if step.name in self.gated:
            params.append(inspect.Parameter(plan.status_input(), kind,
                                            annotation=dsl.PipelineTaskFinalStatus))
        if self._levels(step):
            before, cls, attempts = plan.rung_params()
            params += [inspect.Parameter(before, kind, annotation=int),
                       inspect.Parameter(cls, kind, annotation=dsl.OutputPath(str)),
                       inspect.Parameter(attempts, kind, annotation=dsl.OutputPath(int))]
        return params

    def _container_component(self, step: ir.Step, plan: _StepPlan, *, last: bool = False,
                             suffix: str = "") -> Any:
        """A container component running the step; for a memory-escalating step, one rung
        (the ``last`` one does not stop at an out-of-memory failure; ``suffix``: rung k's
        ``-memK``)."""
        dsl = self.dsl
        argv = self._argv(step, plan)
        params = self._signature(step, plan)
        body = step.body
        assert isinstance(body, (ir.ContainerSpec, ir.ScriptSpec))
        gate = self.gated.get(step.name)
        retry = step.retry or self.wf.defaults.retry
        rung = (retry, last) if retry is not None and self._levels(step) else None
        policy = self._by_class(step) if rung is None else None
        wrap = (bool(step.outputs) or bool(body.working_dir) or gate is not None
                or bool(step.input_artifacts) or bool(step.output_artifacts)
                or rung is not None)

        def fn(*args: Any) -> Any:
            # an artifact's channel gives its local path ({{$.inputs.artifacts['X'].path}})
            values = {p.name: str(getattr(a, "path", a)) for p, a in zip(params, args,
                                                                          strict=True)}

            def fill(word: str) -> str:
                parts = word.split("\0")
                return "".join((dsl.PIPELINE_JOB_ID_PLACEHOLDER if p == _RUN_MARK else values[p])
                               if k % 2 else p for k, p in enumerate(parts))

            words = self._wrapped(policy, [fill(w) for w in argv])
            if not wrap:
                return dsl.ContainerSpec(image=body.image, command=words)
            outs = [values[plan.outputs[o.name]] for o in step.outputs]
            outs += [values[plan.in_artifacts[a.name]] for a in step.input_artifacts]
            outs += [values[plan.out_artifacts[a.name]] for a in step.output_artifacts]
            if gate is not None:
                outs.insert(0, values[plan.status_input()])
            if rung is not None:
                outs += [values[p] for p in (plan.rung_params()[1], plan.rung_params()[2],
                                             plan.rung_params()[0])]
            script = _wrapper(step.outputs, body.working_dir, gate=gate,
                              inputs_art=[a.path for a in step.input_artifacts],
                              outputs_art=[a.path for a in step.output_artifacts],
                              rung=rung)
            return dsl.ContainerSpec(image=body.image,
                                     command=["/bin/sh", "-c", script, "couler-step"],
                                     args=[*outs, *words])

        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            params, return_annotation=dsl.ContainerSpec)
        fn.__name__ = step.name + suffix
        fn.__qualname__ = step.name + suffix
        fn.__doc__ = f"Couler step {step.name!r}."
        return dsl.container_component(fn)

    def _job_script(self, step: ir.Step, job: ir.JobSpec) -> str:
        """A job step's kubectl script (:mod:`couler.compilers.kube_job`): output k goes to
        the file ``$k`` (the component's output paths are the script's arguments); the
        resource is owned by the step's pod, whose name and uid the pod's environment
        gives (:data:`_POD_ENV`, set in :meth:`_kubernetes`)."""
        bad = [label for label, present in (
            ("a failed / completed edge or a failed / error exit hook (it reads the "
             "upstream's final status in Couler's wrapper)", step.name in self.gated),
            ("artifacts", bool(step.input_artifacts or step.output_artifacts))) if present]
        if bad:
            raise self._fail(step.name, Feature.JOB,
                             "a KFP job step is a kubectl container without Couler's script "
                             "wrapper; it cannot carry " + ", ".join(bad))
        outputs = []
        for o in step.outputs:
            whole = (o.source is ir.OutputSource.JQ
                     and o.selector.strip() == kube_job.WHOLE_OBJECT)
            if o.source is not ir.OutputSource.JSON_PATH and not whole:
                raise self._fail(step.name, Feature.JOB,
                                 f"output {o.name!r} of a job step must be a JSONPath (the "
                                 f"kubectl image has no jq), not {o.source.value} "
                                 f"{o.selector!r}")
            outputs.append((o.name, o.selector))
        numbers = {o.name: k for k, o in enumerate(step.outputs, start=1)}
        try:
            return kube_job.script(
                job, outputs, result_file=lambda name: f'"${numbers[name]}"',
                owner=_POD_OWNER, substitutions={mark: f"${var}" for mark, var in _POD_ENV})
        except ValueError as e:
            raise self._fail(step.name, Feature.JOB, str(e)) from e

    def _job_component(self, step: ir.Step, plan: _StepPlan) -> Any:
        """A job step: a container component of :data:`kube_job.JOB_IMAGE` running the
        step's kubectl script, whose outputs are the component's output parameters."""
        dsl = self.dsl
        command = self._argv(step, plan)
        params = self._signature(step, plan)

        def fn(*args: Any) -> Any:
            values = {p.name: str(a) for p, a in zip(params, args, strict=True)}

            def fill(word: str) -> str:
                parts = word.split("\0")
                return "".join((dsl.PIPELINE_JOB_ID_PLACEHOLDER if p == _RUN_MARK else values[p])
                               if k % 2 else p for k, p in enumerate(parts))

            return dsl.ContainerSpec(image=kube_job.JOB_IMAGE,
                                     command=[fill(w) for w in command],
                                     args=[values[plan.outputs[o.name]] for o in step.outputs])

        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            params, return_annotation=dsl.ContainerSpec)
        fn.__name__ = step.name
        fn.__qualname__ = step.name
        fn.__doc__ = f"Couler job step {step.name!r}."
        return dsl.container_component(fn)

    def _local_component(self, step: ir.Step, plan: _StepPlan, *, last: bool = False,
                         suffix: str = "") -> Any:
        if isinstance(step.body, ir.JobSpec):
            raise self._fail(step.name, Feature.JOB,
                             "kfp.local runs no job step: its kubectl script needs a "
                             "Kubernetes cluster (compile it for a KFP backend)")
        workdir = self.workdir or tempfile.mkdtemp(prefix="couler-kfp-")
        host = _mount_rewriter(step, os.path.join(workdir, "volumes"))
        argv = [host(w) for w in self._argv(step, plan)]
        body = step.body
        assert isinstance(body, (ir.ContainerSpec, ir.ScriptSpec))
        params = self._signature(step, plan)
        exprs = []
        for k, word in enumerate(argv):
            parts = word.split("\0")
            # the run's id: run_locally's log directory, one per run
            # a list / dict value (a collected output) as JSON, as KFP renders it
            pieces = [(_LOCAL_RUN_ID if p == _RUN_MARK else
                       f"(json.dumps({p}) if isinstance({p}, (list, dict)) else str({p}))")
                      if i % 2 else repr(p)
                      for i, p in enumerate(parts) if i % 2 or p]
            expr = " + ".join(pieces) or "''"
            if k == 0 and isinstance(body, ir.ScriptSpec) and word in ("python", "python3"):
                expr = "sys.executable"
            exprs.append(expr)
        retry = step.retry or self.wf.defaults.retry
        rung = plan.rung_params() if self._levels(step) else None
        if rung is not None and retry is not None:  # a rung: see _helpers._rung_script
            exprs[:0] = [repr(w) for w in ("/bin/sh", "-c", _rung_script(retry, last=last),
                                           "couler-rung")]
            exprs[4:4] = [f"str({rung[1]})", f"str({rung[2]})", f"str({rung[0]})"]
        else:
            exprs[:0] = [repr(w) for w in self._wrapped(self._by_class(step), [])]
        sig = ", ".join(
            f"{p.name}: {_annotation_src(p.annotation)}" for p in params)
        stdout_outs = [plan.outputs[o.name] for o in step.outputs
                       if o.source is ir.OutputSource.STDOUT]
        file_outs = [(plan.outputs[o.name], host(o.selector)) for o in step.outputs
                     if o.source is ir.OutputSource.PATH]
        env = {e.name: host(e.value) for e in step.env if e.secret is None}
        secrets = {e.name: f"{e.secret.name}/{e.secret.key}" for e in step.env
                   if e.secret is not None}
        dirs = sorted({host(m.mount_path) for m in step.volume_mounts})
        arts_in = "[" + "".join(f"({plan.in_artifacts[a.name]}, {host(a.path)!r}), "
                                for a in step.input_artifacts) + "]"
        arts_out = "[" + "".join(f"({host(a.path)!r}, {plan.out_artifacts[a.name]}), "
                                 for a in step.output_artifacts) + "]"
        fname = _ident(step.name + suffix, set())
        lines = [f"def {fname}({sig}):"]
        if step.name in self.gated:  # a gated hook / edge handler: nothing to do
            run_on, states = self.gated[step.name]
            test = "not in" if run_on else "in"
            skip = f"{plan.status_input()}.state {test} {states!r}"
            if step.name in self.handlers:
                # kfp.local reports an upstream that was not run as FAILED; the KFP backend
                # never starts the handler (an exit hook of a task that never ran): skip it
                up = _log_name(self.prefix + self.handlers[step.name].step) + "."
                skip += (f" or not any(n.startswith({up!r}) for n in "
                         f"__import__('os').listdir(__import__('os').environ[{LOCAL_DIR_ENV!r}]))")
            lines.append(f"    if {skip}:")
            lines += [f"        open({ident}, 'w').close()"
                      for ident in [*stdout_outs, *(i for i, _ in file_outs)]]
            lines.append("        return")
        lines += [
            "    import json, os, subprocess, sys, uuid",
            f"    argv = [{', '.join(exprs)}]",
            f"    env = dict(os.environ, **{env!r})",
            f"    known = json.loads(os.environ.get({LOCAL_SECRETS_ENV!r}) or '{{}}')",
            f"    for var, ref in {secrets!r}.items():",
            "        if ref not in known:",
            f"            raise RuntimeError({step.name!r} + ': secret ' + ref + ' is not given"
            " to run_locally')",
            "        env[var] = known[ref]",
            f"    for d in {dirs!r}:",
            "        os.makedirs(d, exist_ok=True)",
            "    import shutil",
            f"    for art, dest in {arts_in}:",
            "        os.makedirs(os.path.dirname(dest) or '.', exist_ok=True)",
            "        if os.path.isdir(art.path):",
            "            shutil.copytree(art.path, dest, dirs_exist_ok=True)",
            "        else:",
            "            shutil.copyfile(art.path, dest)",
            f"    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env, "
            f"cwd={host(body.working_dir) or None!r})",
            "    sys.stdout.write(proc.stdout)",
            f"    logdir = os.environ.get({LOCAL_DIR_ENV!r})",
            "    if logdir:",
            "        end = '.failed' if proc.returncode else '.out'",
            f"        name = os.path.join(logdir, {_log_name(self.prefix + step.name)!r} + '.' "
            "+ uuid.uuid4().hex + end)",
            "        with open(name, 'w') as fh:",
            "            fh.write(proc.stdout)",
            "    if proc.returncode:",
            f"        raise RuntimeError({step.name!r} + ' exited with ' + str(proc.returncode))",
        ]
        if rung is not None:  # handed over to the next rung: empty outputs
            lines += [f"    with open({rung[1]}) as fh:",
                      "        handover = fh.read() == 'oom'",
                      "    if handover:"]
            lines += [f"        open({ident}, 'w').close()"
                      for ident in [*stdout_outs, *(i for i, _ in file_outs)]]
            lines += [f"        os.makedirs({plan.out_artifacts[a.name]}.path, exist_ok=True)"
                      for a in step.output_artifacts]
            lines.append("        return")
        # moved, not copied: a container's files end with it, so the reader must get the
        # artifact through KFP (as it would on a cluster)
        lines += [f"    for src, art in {arts_out}:",
                  "        if not os.path.exists(src):",
                  f"            raise RuntimeError({step.name!r} + ': output artifact ' + src"
                  " + ' is missing')",
                  "        os.makedirs(os.path.dirname(art.path), exist_ok=True)",
                  "        shutil.move(src, art.path)"]
        for ident in stdout_outs:
            lines += [f"    with open({ident}, 'w') as fh:",
                      "        fh.write(proc.stdout.rstrip('\\n'))"]
        for ident, selector in file_outs:
            lines += [f"    with open({selector!r}) as src, open({ident}, 'w') as fh:",
                      "        fh.write(src.read().rstrip('\\n'))"]
        source = "from kfp import dsl\n\n\n" + "\n".join(lines) + "\n"
        module_name = f"couler_kfp_step_{_ident(self.prefix, set())}_{fname}"
        path = os.path.join(workdir, f"{module_name}.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        func = getattr(module, fname)
        image = body.image if "python" in body.image else "python:3.11"
        return self.dsl.component(func, base_image=image)

    # ------------------------------------------------------------------ pipeline

    def build(self) -> Any:
        dsl = self.dsl
        wf = self.wf
        steps = self._check()
        self._collect_types([*steps, *self.hooks_exit, *self.hooks_ok])
        components: dict[str, Any] = {}
        for step in [*steps, *self.hooks_exit, *self.hooks_ok]:
            plan = _StepPlan(step)
            self.plans[step.name] = plan
            if isinstance(step.body, ir.SubWorkflowSpec):
                components[step.name] = self._group(step, step.body)
                continue
            self._argv(step, plan)  # registers item placeholders
            make = (self._local_component if self.local else
                    self._job_component if isinstance(step.body, ir.JobSpec) else
                    self._container_component)
            components[step.name] = make(step, plan)
            components[step.name].name = step.name
            levels = self._levels(step)
            if levels:  # rungs 2..N; the last does not stop at an OOM failure
                rung = self._local_component if self.local else self._container_component
                self.rung_components[step.name] = []
                for k in range(1, len(levels)):
                    comp = rung(step, plan, last=k == len(levels) - 1, suffix=f"-mem{k + 1}")
                    comp.name = f"{step.name}-mem{k + 1}"
                    self.rung_components[step.name].append(comp)

        taken: set[str] = set()
        pparams = []
        for p in wf.parameters:
            ident = _ident(p.name, taken)
            self.param_ids[p.name] = ident
            default: Any = inspect.Parameter.empty
            if p.default is not None:
                default = p.default.value if p.type is not ir.ValueType.JSON else p.default.text
            pparams.append(inspect.Parameter(ident, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                             annotation=_PY_TYPE[p.type], default=default))
        pparams.sort(key=lambda q: q.default is not inspect.Parameter.empty)

        def body(*args: Any) -> None:
            channels = {q.name: a for q, a in zip(pparams, args, strict=True)}
            tasks: dict[str, Any] = {}
            exit_task = None
            if self.hooks_exit:
                exit_task = self._task(self.hooks_exit[0], components, tasks, channels)
            if exit_task is not None:
                # succeeded hooks inside too: kfp forbids dependencies into an ExitHandler
                with dsl.ExitHandler(exit_task, name="couler-exit-handler"):
                    self._add_main(steps, components, tasks, channels)
            else:
                self._add_main(steps, components, tasks, channels)

        body.__signature__ = inspect.Signature(pparams)  # type: ignore[attr-defined]
        body.__name__ = _ident(wf.name, set())
        config = None
        if wf.timeout_seconds is not None or wf.ttl_seconds is not None:
            config = dsl.PipelineConfig(ttl_seconds_after_finished=wf.ttl_seconds,
                                        active_deadline_seconds=wf.timeout_seconds)
        try:
            # built before the pipeline: kfp allows one pipeline context at a time
            self.subs = {s.name: self._sub_pipeline(s, components) for s in steps
                         if self._nested(s)}
            self.loops = {s.name: self._loop(s, components) for s in steps
                          if s.loop is not None and s.loop.max_iterations > 1}
            self.ladders = {s.name: self._ladder(s, components) for s in steps
                            if self._levels(s)}
            return dsl.pipeline(name=wf.name, pipeline_config=config)(body)
        except UnsupportedFeatureError:
            raise
        except Exception as exc:  # kfp's own checks (topology, types)
            raise self._fail("", "this graph", f"kfp rejected it: {exc}") from exc

    def _group(self, step: ir.Step, body: ir.SubWorkflowSpec) -> Any:
        """An inline sub-workflow: a nested pipeline (a graph component) of its steps.

        Built by a builder of its own, before the enclosing pipeline (kfp allows one
        pipeline context at a time); its steps see only each other, and the enclosing
        workflow's volumes, placement and step defaults.
        """
        wf = self.wf
        inner = ir.Workflow(name=step.name, steps=body.steps,  # the task's name
                            volumes=wf.volumes, node_selector=wf.node_selector,
                            tolerations=wf.tolerations,
                            image_pull_secrets=wf.image_pull_secrets,
                            security_context=wf.security_context, defaults=wf.defaults)
        child = _Builder(inner, local=self.local, workdir=self.workdir,
                         prefix=f"{self.prefix}{step.name}/")
        return child.build()

    def _loop(self, step: ir.Step, components: Mapping[str, Any]
              ) -> tuple[Any, list[ir.StepOutputRef], list[ir.ValueSource | ir.StepArtifactRef]]:
        """A bounded loop, unrolled: iteration k (2..N) in pipeline ``couler-STEP-iterK``.

        Iteration k's pipeline takes the outputs of iteration k-1 the loop condition
        reads, and the values the step reads; under ``dsl.If(condition)`` it runs the
        step, then iteration k+1's pipeline. Built innermost first (a pipeline must be
        defined before another calls it), before the enclosing pipeline.
        """
        assert step.loop is not None
        cond = step.loop.condition
        prev: list[ir.StepOutputRef] = []
        for v in (cond.left, cond.right):
            if isinstance(v, ir.StepOutputRef) and v.step == step.name and v not in prev:
                prev.append(v)
        values: list[ir.ValueSource | ir.StepArtifactRef] = []
        for v in [*(i.value for i in step.inputs), cond.left, cond.right]:
            if isinstance(v, (ir.StepOutputRef, ir.WorkflowParamRef)) and v not in prev \
                    and v not in values:
                values.append(v)
        plan = self.plans[step.name]
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter(f"couler_prev_{j}", kind, annotation=self._input_type(v))
                  for j, v in enumerate(prev)]
        params += [inspect.Parameter(f"couler_in_{j}", kind, annotation=self._input_type(v))
                   for j, v in enumerate(values) if not isinstance(v, ir.StepArtifactRef)]
        inner: Any = None
        for k in range(step.loop.max_iterations, 1, -1):
            def body(*args: Any, k: int = k, then: Any = inner) -> None:
                self.scope = dict(zip([*prev, *values], args, strict=True))
                try:
                    expr = self._condition(step, ir.When(cond), {}, {}, None)
                    with self.dsl.If(expr, name=f"{step.name}-iter{k}"):
                        task = self._task(step, components, {}, {})
                        if then is not None:
                            nxt = then(**{f"couler_prev_{j}": task.outputs[plan.outputs[v.output]]
                                          for j, v in enumerate(prev)},
                                       **{f"couler_in_{j}": self.scope[v]
                                          for j, v in enumerate(values)})
                            nxt.set_caching_options(enable_caching=False)
                finally:
                    self.scope = {}

            body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
            body.__name__ = _ident(f"couler_{step.name}_iter{k}", set())
            inner = self.dsl.pipeline(name=f"couler-{step.name}-iter{k}")(body)
        return inner, prev, values

    def _ladder(self, step: ir.Step, components: Mapping[str, Any]
                ) -> tuple[Any, list[ir.ValueSource | ir.StepArtifactRef]]:
        """Memory escalation on OOM: rung k (2..N) in pipeline ``couler-STEP-memK``.

        KFP fixes a task's memory for its retries, so the step becomes one task per memory
        level (:func:`couler.compilers.kube.memory_levels`). Each rung runs the command
        under the retry wrapper, stopping at an out-of-memory failure, and writes its
        outputs ``couler_class`` and ``couler_attempts``; it exits 0 only when it hands
        over (its last attempt ended out of memory, attempts are left, a rung follows),
        else with the command's exit code. Rung k's pipeline takes rung k-1's class and
        attempts (and the values the step reads) as inputs -- kfp.local resolves a
        condition over a pipeline input, not over a task output not named ``Output`` --
        and runs, under ``dsl.If(class == "oom")``, rung k with its memory, then rung
        k+1's pipeline. Built innermost first (one pipeline context at a time), before
        the enclosing pipeline.
        """
        levels = self._levels(step)
        values: list[ir.ValueSource | ir.StepArtifactRef] = []
        for v in (i.value for i in step.inputs):
            if isinstance(v, (ir.StepOutputRef, ir.WorkflowParamRef)) and v not in values:
                values.append(v)
        values += [a.source for a in step.input_artifacts
                   if isinstance(a.source, ir.StepArtifactRef) and a.source not in values]
        _, cls, attempts = self.plans[step.name].rung_params()
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("couler_class", kind, annotation=str),
                  inspect.Parameter("couler_attempts", kind, annotation=int)]
        params += [inspect.Parameter(
            f"couler_in_{j}", kind,
            annotation=(self.dsl.Input[self.dsl.Artifact] if isinstance(v, ir.StepArtifactRef)
                        else self._input_type(v)))
            for j, v in enumerate(values)]
        inner: Any = None
        for k in range(len(levels) - 1, 0, -1):
            def body(couler_class: Any, couler_attempts: Any, *args: Any, k: int = k,
                     then: Any = inner) -> None:
                self.scope = dict(zip(values, args, strict=True))
                try:
                    with self.dsl.If(couler_class == "oom", name=f"{step.name}-mem{k + 1}"):
                        task = self._task(step, components, {}, {}, before=couler_attempts,
                                          rung=k)
                        if then is not None:
                            nxt = then(couler_class=task.outputs[cls],
                                       couler_attempts=task.outputs[attempts],
                                       **{f"couler_in_{j}": self.scope[v]
                                          for j, v in enumerate(values)})
                            nxt.set_caching_options(enable_caching=False)
                            nxt.set_display_name(f"couler-{step.name}-mem{k + 2}")
                finally:
                    self.scope = {}

            body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
            body.__name__ = _ident(f"couler_{step.name}_mem{k + 1}", set())
            inner = self.dsl.pipeline(name=f"couler-{step.name}-mem{k + 1}")(body)
        return inner, values

    def _add_main(self, steps: Sequence[ir.Step], components: Mapping[str, Any],
                  tasks: dict[str, Any], channels: Mapping[str, Any]) -> None:
        """The workflow's steps, then its ``succeeded`` hook steps after all of them."""
        claims = [] if self.local else self._claim_templates()
        k8s: Any = _import("kfp.kubernetes") if claims else None
        for v in claims:
            # a claim per run, like an Argo volumeClaimTemplate (access modes default RWO)
            kw = {"storage_class_name": v.storage_class} if v.storage_class else {}
            self.claims[v.name] = k8s.CreatePVC(
                pvc_name_suffix=f"-{v.name}", size=v.size,
                access_modes=list(v.access_modes or ("ReadWriteOnce",)), **kw)
            self.claims[v.name].set_display_name(f"couler-create-{v.name}")
            self.claims[v.name].set_caching_options(enable_caching=False)
        for step in steps:
            self._add(step, components, tasks, channels)
        main = [tasks[s.name] for s in steps]
        for step in self.hooks_ok:
            task = self._task(step, components, tasks, channels)
            for t in main:
                task.after(t)
        for name, claim in self.claims.items():
            delete = k8s.DeletePVC(pvc_name=claim.outputs["name"])
            delete.set_display_name(f"couler-delete-{name}")
            delete.set_caching_options(enable_caching=False)
            for user in self.claim_users.get(name, []):
                delete.after(user)

    def _claim_templates(self) -> list[ir.Volume]:
        """The workflow's claim templates some step mounts."""
        mounted = {m.name for s in [*self.wf.steps, *self.hooks_ok] for m in s.volume_mounts}
        return [v for v in self.wf.volumes
                if v.kind is ir.VolumeKind.CLAIM_TEMPLATE and v.name in mounted]

    @staticmethod
    def _driven(step: ir.Step) -> bool:
        """Whether an upstream task output drives the step's map or condition."""
        if step.foreach is not None and isinstance(step.foreach.source, ir.StepOutputRef):
            return True
        if step.when is not None:
            cond = step.when.condition
            return any(isinstance(v, ir.StepOutputRef) for v in (cond.left, cond.right))
        return False

    def _sub_pipeline(self, step: ir.Step, components: Mapping[str, Any]) -> Any:
        """A sub-pipeline holding a step whose map / condition an upstream output drives.

        Every task output and workflow parameter the step reads (map items, condition
        operands, inputs) becomes an input of the sub-pipeline, and the ParallelFor /
        If inside it iterates over / compares that input. Valid KFP either way, but
        kfp.local (2.17.3) resolves a ParallelFor's items and a condition's operands
        over a task output only when the output is named ``Output`` (a Python
        component's return value); over a pipeline input it resolves them always.
        """
        values: list[ir.ValueSource | ir.StepArtifactRef] = []
        sources = [i.value for i in step.inputs]
        if step.foreach is not None and step.foreach.source is not None:
            sources.append(step.foreach.source)
        for when in [*self.guards.get(step.name, ()), *([step.when] if step.when else [])]:
            sources += [when.condition.left, when.condition.right]
        for v in sources:
            if isinstance(v, (ir.StepOutputRef, ir.WorkflowParamRef)) and v not in values:
                values.append(v)
        values += [a.source for a in step.input_artifacts
                   if isinstance(a.source, ir.StepArtifactRef)]
        params = [inspect.Parameter(
            f"couler_in_{k}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=(self.dsl.Input[self.dsl.Artifact] if isinstance(v, ir.StepArtifactRef)
                        else self._input_type(v)))
            for k, v in enumerate(values)]

        collected = self.collected.get(step.name)

        def sub(*args: Any) -> Any:
            self.scope = dict(zip(values, args, strict=True))
            inner: dict[str, Any] = {}
            try:
                with contextlib.ExitStack() as stack:
                    for k, when in enumerate(self.guards.get(step.name, ())):
                        expr = self._condition(step, when, {}, {}, None)
                        stack.enter_context(self.dsl.If(expr, name=f"{step.name}-guard-{k}"))
                    self._add(step, components, inner, {}, nested=True)
            finally:
                self.scope = {}
            if collected is None:
                return None
            # the sub-pipeline's one output: the read output over the map's items
            output = inner[step.name].outputs[self.plans[step.name].outputs[collected]]
            return self.dsl.Collected(output)

        returns: Any = inspect.Signature.empty
        if collected is not None:
            item_type = _PY_TYPE[self.output_types.get((step.name, collected),
                                                        ir.ValueType.STRING)]
            returns = list[item_type]  # type: ignore[valid-type]
        sub.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            params, return_annotation=returns)
        sub.__name__ = _ident(f"couler_{step.name}", set())
        return self.dsl.pipeline(name=f"couler-{step.name}")(sub), values

    def _add(self, step: ir.Step, components: Mapping[str, Any], tasks: dict[str, Any],
             channels: Mapping[str, Any], *, nested: bool = False) -> None:
        dsl = self.dsl
        if not nested and step.name in self.subs:
            sub, values = self.subs[step.name]
            task = sub(**{f"couler_in_{k}": (
                self._artifact(step, ir.InputArtifact("", "", v), tasks)
                if isinstance(v, ir.StepArtifactRef)
                else self._value(step, v, tasks, channels, None))
                for k, v in enumerate(values)})
            cache = step.cache or self.wf.defaults.cache  # kfp caches tasks unless told
            task.set_caching_options(enable_caching=cache is not None and cache.enabled)
            for dep in step.dependencies:
                if dep.step in tasks:
                    task.after(tasks[dep.step])
            tasks[step.name] = task
            return
        if step.name in self.ladders:
            first = self._task(step, components, tasks, channels, before=0)
            then, values = self.ladders[step.name]
            _, cls, attempts = self.plans[step.name].rung_params()
            rest = then(couler_class=first.outputs[cls], couler_attempts=first.outputs[attempts],
                        **{f"couler_in_{j}": (
                            self._artifact(step, ir.InputArtifact("", "", v), tasks)
                            if isinstance(v, ir.StepArtifactRef)
                            else self._value(step, v, tasks, channels, None))
                            for j, v in enumerate(values)})
            rest.set_caching_options(enable_caching=False)
            rest.set_display_name(f"couler-{step.name}-mem2")
            tasks[step.name] = rest  # dependents run after the whole ladder
            return
        if step.name in self.loops:
            first = self._task(step, components, tasks, channels)
            then, prev, values = self.loops[step.name]
            args = {f"couler_prev_{j}": first.outputs[self.plans[step.name].outputs[v.output]]
                    for j, v in enumerate(prev)}
            args |= {f"couler_in_{j}": self._value(step, v, tasks, channels, None)
                     for j, v in enumerate(values) if not isinstance(v, ir.StepArtifactRef)}
            rest = then(**args)
            rest.set_caching_options(enable_caching=False)
            tasks[step.name] = rest  # dependents run after the last iteration
            return
        item: Any = None
        if step.foreach is not None:
            fe = step.foreach
            items: Any
            if fe.source is None:
                items = [_item_text(lit.value) for lit in fe.items]
            else:
                items = self._value(step, fe.source, tasks, channels, None)
            kwargs: dict[str, Any] = {}
            if fe.parallelism is not None:
                kwargs["parallelism"] = fe.parallelism
            with dsl.ParallelFor(items, **kwargs) as item:
                self._add_when(step, components, tasks, channels, item)
        else:
            self._add_when(step, components, tasks, channels, item)

    def _add_when(self, step: ir.Step, components: Mapping[str, Any], tasks: dict[str, Any],
                  channels: Mapping[str, Any], item: Any) -> None:
        if step.when is None:
            self._task(step, components, tasks, channels, item)
            return
        expr = self._condition(step, step.when, tasks, channels, item)
        with self.dsl.If(expr, name=f"{step.name}-when"):
            self._task(step, components, tasks, channels, item)

    def _condition(self, step: ir.Step, when: ir.When, tasks: Mapping[str, Any],
                   channels: Mapping[str, Any], item: Any) -> Any:
        """The ``dsl.If`` expression of ``when`` (its operands bound in this scope)."""
        cond = when.condition
        op = cond.op if when.expect else cond.op.negated()
        left = self._operand(step, cond.left, tasks, channels, item)
        right = self._operand(step, cond.right, tasks, channels, item)
        if not _is_channel(left):
            if not _is_channel(right):
                raise self._fail(step.name, Feature.WHEN, "a condition between two constants")
            left, right = right, left
            op = _SWAPPED[op]
        return _compare(left, op, right)

    def _operand(self, step: ir.Step, v: ir.ValueSource, tasks: Mapping[str, Any],
                 channels: Mapping[str, Any], item: Any) -> Any:
        if isinstance(v, ir.Literal):
            value = v.value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return value
            return v.text
        return self._value(step, v, tasks, channels, item)

    def _value(self, step: ir.Step, v: ir.ValueSource, tasks: Mapping[str, Any],
               channels: Mapping[str, Any], item: Any) -> Any:
        if isinstance(v, ir.Literal):
            return v.text
        if v in self.scope:
            return self.scope[v]
        if isinstance(v, ir.WorkflowParamRef):
            return channels[self.param_ids[v.name]]
        if isinstance(v, ir.StepOutputRef):
            up = tasks.get(v.step)
            if up is None:
                raise self._fail(step.name, Feature.PARAMETERS,
                                 f"reads {v.step}.{v.output}, which is not a task here")
            if self.collected.get(v.step) == v.output:
                if v.step in self.subs:  # its sub-pipeline returns the collected list
                    return up.output
                return self.dsl.Collected(up.outputs[self.plans[v.step].outputs[v.output]])
            return up.outputs[self.plans[v.step].outputs[v.output]]
        if item is None:
            raise self._fail(step.name, "item reference", "outside a map")
        if not v.key:
            return item
        static = step.foreach is not None and step.foreach.source is None
        return getattr(item, _static_key(v.key) if static else v.key)

    def _task(self, step: ir.Step, components: Mapping[str, Any], tasks: dict[str, Any],
              channels: Mapping[str, Any], item: Any = None, *, before: Any = None,
              rung: int = 0) -> Any:
        """The step's task; for a memory-escalating step, rung ``rung`` (0-based: its
        memory is level ``rung``) given the attempts made ``before`` it."""
        plan = self.plans[step.name]
        kwargs = {plan.inputs[i.name]: self._value(step, i.value, tasks, channels, item)
                  for i in step.inputs}
        levels = self._levels(step)
        if levels:
            kwargs[plan.rung_params()[0]] = before
        for key, ident in plan.item_keys.items():
            kwargs[ident] = self._value(step, ir.ItemRef(key), tasks, channels, item)
        for a in step.input_artifacts:
            kwargs[plan.in_artifacts[a.name]] = self._artifact(step, a, tasks)
        task = (self.rung_components[step.name][rung - 1] if rung
                else components[step.name])(**kwargs)
        task.set_display_name(step.name if not rung else f"{step.name}-mem{rung + 1}")
        for dep in step.dependencies:
            if dep.step in tasks:
                task.after(tasks[dep.step])
        if step.name in self.handlers:
            task.ignore_upstream_failure()
        if isinstance(step.body, ir.SubWorkflowSpec):
            task.set_caching_options(enable_caching=False)  # its tasks decide for themselves
        else:
            self._policies(step, task)
        if rung:  # a later rung: the memory of its level
            level = levels[rung]
            if "memory" in level.get("requests", {}):
                task.set_memory_request(_binary_quantity(level["requests"]["memory"]))
            if "memory" in level.get("limits", {}):
                task.set_memory_limit(_binary_quantity(level["limits"]["memory"]))
        tasks[step.name] = task
        return task

    def _artifact(self, step: ir.Step, a: ir.InputArtifact, tasks: Mapping[str, Any]) -> Any:
        src = a.source
        assert isinstance(src, ir.StepArtifactRef)  # _check refuses storage locations
        if src in self.scope:
            return self.scope[src]
        up = tasks.get(src.step)
        if up is None:
            raise self._fail(step.name, Feature.ARTIFACTS,
                             f"reads {src.step}.{src.artifact}, which is not a task here")
        return up.outputs[self.plans[src.step].out_artifacts[src.artifact]]

    def _policies(self, step: ir.Step, task: Any) -> None:
        d = self.wf.defaults
        retry = step.retry or d.retry
        # else the wrapper retries (by class, or in the rungs of memory escalation)
        if retry is not None and self._by_class(step) is None and not self._levels(step):
            kw: dict[str, Any] = {"num_retries": retry.limit}
            if retry.backoff is not None:
                kw["backoff_duration"] = f"{int(retry.backoff.base_seconds)}s"
                kw["backoff_factor"] = retry.backoff.factor
                if retry.backoff.cap_seconds is not None:
                    kw["backoff_max_duration"] = f"{int(retry.backoff.cap_seconds)}s"
            task.set_retry(**kw)
        res = step.resources or d.resources
        if res is not None:
            for value, setter in ((res.cpu_request, task.set_cpu_request),
                                  (res.cpu_limit, task.set_cpu_limit),
                                  (res.memory_request, task.set_memory_request),
                                  (res.memory_limit, task.set_memory_limit)):
                if value:
                    setter(value)
            if res.gpu:
                task.set_accelerator_type(res.gpu_resource)
                task.set_accelerator_limit(res.gpu)
        cache = step.cache or d.cache
        task.set_caching_options(enable_caching=cache is not None and cache.enabled)
        for e in step.env:
            if e.secret is None:
                task.set_env_variable(e.name, e.value)
        if not self.local:  # kfp.local ignores platform config (local mode: see the docstring)
            self._kubernetes(step, task)

    def _kubernetes(self, step: ir.Step, task: Any) -> None:
        """Pod settings through the kfp-kubernetes extension (``platforms.kubernetes``)."""
        wf, d = self.wf, self.wf.defaults
        k8s = _import("kfp.kubernetes")
        timeout = step.timeout_seconds if step.timeout_seconds is not None else d.timeout_seconds
        if timeout is not None:
            k8s.set_timeout(task, timeout)
        # like Argo: the step's own node selector / tolerations replace the workflow's
        for key, value in step.node_selector or wf.node_selector:
            k8s.add_node_selector(task, key, value)
        for t in step.tolerations or wf.tolerations:
            k8s.add_toleration(task, key=t.key or None, operator=t.operator or None,
                               value=t.value or None, effect=t.effect or None,
                               toleration_seconds=t.toleration_seconds)
        secrets: dict[str, dict[str, str]] = {}
        for e in step.env:
            if e.secret is not None:
                secrets.setdefault(e.secret.name, {})[e.secret.key] = e.name
        for name, keys in secrets.items():
            k8s.use_secret_as_env(task, secret_name=name, secret_key_to_env=keys)
        volumes = {v.name: v for v in wf.volumes}
        for m in step.volume_mounts:
            v = volumes[m.name]
            if v.kind is ir.VolumeKind.PVC:
                k8s.mount_pvc(task, pvc_name=v.claim_name, mount_path=m.mount_path,
                              sub_path=m.sub_path)
            elif v.kind is ir.VolumeKind.CLAIM_TEMPLATE:
                claim = self.claims[v.name]
                k8s.mount_pvc(task, pvc_name=claim.outputs["name"], mount_path=m.mount_path,
                              sub_path=m.sub_path)
                task.after(claim)
                self.claim_users.setdefault(v.name, []).append(task)
            elif v.kind is ir.VolumeKind.EMPTY_DIR:
                k8s.empty_dir_mount(task, volume_name=v.name, mount_path=m.mount_path)
            elif v.kind is ir.VolumeKind.CONFIG_MAP:
                k8s.use_config_map_as_volume(task, config_map_name=v.claim_name,
                                             mount_path=m.mount_path)
            else:
                k8s.use_secret_as_volume(task, secret_name=v.claim_name,
                                         mount_path=m.mount_path)
        for key, value in step.labels:
            k8s.add_pod_label(task, key, value)
        body = step.body
        if isinstance(body, ir.JobSpec) and body.set_owner_reference and body.action in (
                ir.JobAction.CREATE, ir.JobAction.APPLY):  # the resource's owner: the pod
            for var, field in (("COULER_POD_NAME", "metadata.name"),
                               ("COULER_POD_UID", "metadata.uid")):
                k8s.use_field_path_as_env(task, env_name=var, field_path=field)
        if isinstance(body, (ir.ContainerSpec, ir.ScriptSpec)) and body.image_pull_policy:
            k8s.set_image_pull_policy(task, body.image_pull_policy)
        if wf.image_pull_secrets:
            k8s.set_image_pull_secrets(task, list(wf.image_pull_secrets))
        sc = wf.security_context
        if sc is not None and (sc.run_as_user is not None or sc.run_as_group is not None
                               or sc.run_as_non_root is not None):
            k8s.set_security_context(task, run_as_user=sc.run_as_user,
                                     run_as_group=sc.run_as_group,
                                     run_as_non_root=sc.run_as_non_root)
