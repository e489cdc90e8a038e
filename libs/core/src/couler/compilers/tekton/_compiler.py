"""The IR -> Tekton compiler (see :mod:`couler.compilers.tekton` for the output's shape)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from couler import ir
from couler.compilers import emit, entrypoint
from couler.compilers.kube import (
    DIGEST_ANNOTATION,
    dns_settings,
    memory_levels,
    resource_requirements,
    se_linux_options,
)
from couler.compilers.tekton import _cache, _job, _ladder, _schedule, _script, _status
from couler.compilers.tekton.capabilities import (
    API_VERSION,
    ARTIFACTS_SIZE,
    ARTIFACTS_WORKSPACE,
    ATTEMPTS_RESULT,
    CAPABILITIES,
    ENGINE,
    EXIT_RESULT,
    FAILURE_RESULT,
    ITEM_PARAM,
    MAX_MATRIX_COMBINATIONS,
    MAX_UNROLL,
    TTL_ANNOTATION,
)
from couler.engines.base import Feature, check_capabilities, plain_edges
from couler.errors import UnsupportedFeatureError
from couler.optimize.tune import expand_tune

__all__ = ["compile_workflow", "to_yaml"]

Doc = dict[str, Any]

_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
_NOT_PARAM_CHAR = re.compile(r"[^-a-zA-Z0-9_.]+")
_INTERPRETER = {
    ir.ScriptLanguage.PYTHON: ("python",),
    ir.ScriptLanguage.BASH: ("bash",),
    ir.ScriptLanguage.SH: ("sh",),
}
_EXIT_STATUS: dict[ir.RunStatus, list[str]] = {
    ir.RunStatus.SUCCEEDED: ["Succeeded", "Completed"],
    ir.RunStatus.FAILED: ["Failed"],
    ir.RunStatus.ERROR: ["Failed"],
}


# --------------------------------------------------------------------------- public API


def compile_workflow(wf: ir.Workflow, *, validate: bool = True) -> list[dict[str, Any]]:
    """Compile ``wf`` into ``[Pipeline, PipelineRun]`` (``tekton.dev/v1``), followed by
    ``[ConfigMap, CronJob]`` when it has a schedule and ``[TriggerBinding, TriggerTemplate,
    EventListener]`` when it has event triggers (:mod:`couler.compilers.tekton._schedule`).

    Args:
        wf: the workflow.
        validate: run :func:`couler.ir.validate` first (the compiler assumes a
            valid workflow).

    Returns:
        The documents as plain data.

    Raises:
        couler.errors.ValidationError: the workflow is invalid.
        couler.errors.UnsupportedFeatureError: the workflow uses a feature
            Tekton cannot express (the message names the step and feature).
    """
    if validate:
        ir.validate(wf)
    wf = plain_edges(wf)  # A.Succeeded from a step without a when is a plain edge
    # tune steps become rounds of ask / one task per trial / tell (no-op without): a matrix
    # over the ask task's array result could not select a parameter of a trial's set
    wf = expand_tune(wf, slots=True)
    check_capabilities(ENGINE, CAPABILITIES, wf)
    return _Compiler(wf).compile()


def to_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Render documents as one multi-document YAML text (documents joined by ``---``)."""
    return "---\n".join(emit.to_yaml(doc) for doc in docs)


# --------------------------------------------------------------------------- helpers


def _duration(seconds: int) -> str:
    return f"{int(seconds)}s"


_GUARD_SUFFIX = "-when"
_GUARD_RESULT = "holds"
_AWK_OPS = {ir.CompareOp.GT: ">", ir.CompareOp.GE: ">=", ir.CompareOp.LT: "<",
            ir.CompareOp.LE: "<="}


def guard_script(op: ir.CompareOp, result_path: str, step: str) -> str:
    """The guard task's ``/bin/sh`` script: compare ``$1`` and ``$2`` as numbers with
    ``op`` and write ``true`` or ``false`` to ``result_path``; exit 2 naming the values
    when one is not a number."""
    number = r"^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$"
    sym = _AWK_OPS[op]
    return "\n".join([
        "#!/bin/sh",
        "set -u",
        f"awk -v l=\"$1\" -v r=\"$2\" 'BEGIN {{ n = \"{number}\"; "
        f"if (l !~ n || r !~ n) {{ printf \"couler: step {step}: its when compares %s {sym} "
        f"%s, which are not both numbers\\n\", l, r > \"/dev/stderr\"; exit 2 }} "
        f"exit !((l + 0) {sym} (r + 0)) }}'",
        "rc=$?",
        f'if [ "$rc" -eq 0 ]; then printf true > "{result_path}"; '
        f'elif [ "$rc" -eq 1 ]; then printf false > "{result_path}"; else exit "$rc"; fi',
        ""])


def _task_ref(step: str, output: str, array: bool = False) -> str:
    return f"$(tasks.{step}.results.{output}{'[*]' if array else ''})"


def _item_param(key: str) -> str:
    return ITEM_PARAM if not key else f"{ITEM_PARAM}-{_NOT_PARAM_CHAR.sub('-', key)}"


def _toleration(t: ir.Toleration) -> Doc:
    doc: Doc = {}
    if t.key:
        doc["key"] = t.key
    if t.operator:
        doc["operator"] = t.operator
    if t.value:
        doc["value"] = t.value
    if t.effect:
        doc["effect"] = t.effect
    if t.toleration_seconds is not None:
        doc["tolerationSeconds"] = t.toleration_seconds
    return doc


def _item_text(item: object, key: str) -> str:
    value = item
    if key:
        if isinstance(item, dict):
            value = item.get(key)
        elif isinstance(item, list) and key.isdigit() and int(key) < len(item):
            value = item[int(key)]
        else:
            value = None
    return ir.Literal.of(value).text


def _retry_feature(policy: ir.RetryPolicy | None) -> Feature:
    if policy is not None and set(policy.on) != {ir.FailureClass.ANY}:
        return Feature.RETRY_FAILURE_CLASSES
    return Feature.RETRY_BACKOFF


def _heredoc_marker(source: str) -> str:
    marker, n = "COULER_SCRIPT_EOF", 0
    lines = set(source.splitlines())
    while marker in lines:
        n += 1
        marker = f"COULER_SCRIPT_EOF_{n}"
    return marker


@dataclasses.dataclass(frozen=True, slots=True)
class _StatusPlan:
    """Status mode for one task (see :mod:`._status`): its upstreams, edge test, when test."""

    ups: tuple[_status.Upstream, ...]
    gate: str
    when: str  # "" = no when


_WHEN_PARAMS = ("couler-when-l", "couler-when-r")

# The run's own values a step may read, as task params set from Tekton's variables (a
# param is substituted everywhere in an embedded task spec): ``{{workflow.status}}`` only in
# a finally task, where it reads Succeeded, Failed, Completed (succeeded, some tasks
# skipped) or None.
_RUN_VARS = {"workflow.name": ("couler-run-name", "$(context.pipelineRun.name)"),
             "workflow.uid": ("couler-run-uid", "$(context.pipelineRun.uid)"),
             "workflow.status": ("couler-run-status", "$(tasks.status)")}


@dataclasses.dataclass(slots=True)
class _Info:
    """How the pipeline sees one step after rewrites."""

    task: str  # the task whose results are read ("" = outputs cannot be read)
    after: list[str]  # the tasks a dependent must run after
    reason: tuple[Feature, str] | None = None  # why outputs cannot be read


class _Compiler:
    def __init__(self, wf: ir.Workflow) -> None:
        self.wf = wf
        self.infos: dict[str, _Info] = {}
        self.array_outputs: set[tuple[str, str]] = set()
        self.task_pods: list[Doc] = []
        self.group_outputs: dict[str, dict[str, str]] = {}
        self.status = False  # status mode: edge conditions / depends expressions
        self.artifacts = False  # the shared artifacts workspace is used
        self.caches: dict[str, str] = {}  # cache workspace -> its claim
        self.by_name: dict[str, ir.Step] = {}
        self.edges: dict[str, tuple[ir.Dependency, ...]] = {}
        self.run_vars: set[str] = set()  # the run's values the task being built reads
        self.guards: dict[str, Doc] = {}  # step -> the task testing its ordered when

    # ------------------------------------------------------------------ errors

    def _fail(self, step: str, feature: Feature | str, detail: str) -> UnsupportedFeatureError:
        name = feature.value if isinstance(feature, Feature) else feature
        return UnsupportedFeatureError(ENGINE, self.wf.name, step, name, detail)

    # ------------------------------------------------------------------ top level

    def compile(self) -> list[Doc]:
        wf = self.wf
        if wf.parallelism is not None:
            raise self._fail("", "workflow parallelism",
                             "Tekton has no bound on the tasks of a PipelineRun running at once")
        flat = self._flatten(wf.steps, prefix="", outer_deps=())
        # status mode reads edges step by step, before they point at a map's batches
        self.edges = {s.name: s.dependencies for s in flat}
        steps = self._resolve(flat)
        for step in steps:
            if step.foreach is not None and step.foreach.source is not None:
                src = step.foreach.source
                if isinstance(src, ir.StepOutputRef):
                    self.array_outputs.add((src.step, src.output))
        self.by_name = {s.name: s for s in steps}
        self.status = _status.needed(steps)
        if self.status:
            self._check_status_mode(steps)
        tasks: list[Doc] = []
        for step in steps:
            tasks.extend(self._step_tasks(step))
        if self.status:
            tasks.append(self._run_status_task(steps))
        finally_tasks: list[Doc] = []
        for hook in wf.exit_hooks:
            for step in hook.steps:
                finally_tasks.append(self._hook_task(hook, step))
        pipeline_spec: Doc = {}
        if wf.parameters:
            pipeline_spec["params"] = [self._pipeline_param(p) for p in wf.parameters]
        workspaces = [{"name": v.name} for v in wf.volumes]
        if self.artifacts:
            if any(v.name == ARTIFACTS_WORKSPACE for v in wf.volumes):
                raise self._fail("", Feature.ARTIFACTS,
                                 f"the volume name {ARTIFACTS_WORKSPACE!r} is reserved for the "
                                 "workspace artifacts are passed through")
            workspaces.append({"name": ARTIFACTS_WORKSPACE})
        clash = {v.name for v in wf.volumes} & set(self.caches)
        if clash:
            raise self._fail("", Feature.CACHE, f"the volume name {min(clash)!r} is reserved "
                                                "for a cache workspace")
        workspaces += [{"name": ws} for ws in self.caches]
        if workspaces:
            pipeline_spec["workspaces"] = workspaces
        pipeline_spec["tasks"] = tasks
        if finally_tasks:
            pipeline_spec["finally"] = finally_tasks
        meta = self._metadata()
        pipeline: Doc = {"apiVersion": API_VERSION, "kind": "Pipeline",
                         "metadata": {"name": wf.name, **meta}, "spec": pipeline_spec}
        run = self._pipeline_run(meta)
        docs = [pipeline, run]
        if wf.schedule is not None:
            docs += _schedule.cron_documents(wf, run, meta)
        if wf.triggers:
            docs += _schedule.trigger_documents(wf, run, meta)
        return docs

    def _check_status_mode(self, steps: Sequence[ir.Step]) -> None:
        edged = next(s for s in steps if s.depends is not None or any(
            d.condition is not ir.EdgeCondition.SUCCEEDED for d in s.dependencies))
        feature = (Feature.DEPENDS_EXPRESSION if edged.depends is not None
                   else Feature.EDGE_CONDITIONS)
        for top in self.wf.steps:
            if isinstance(top.body, ir.SubWorkflowSpec) or top.loop is not None:
                raise self._fail(edged.name, feature,
                                 "edge conditions are compiled by the step-status rewrite, "
                                 f"which does not cover the inline sub-workflow or loop "
                                 f"{top.name!r} of this workflow")
        if _status.RUN_STATUS_TASK in self.by_name:
            raise self._fail(_status.RUN_STATUS_TASK, feature,
                             f"the step name {_status.RUN_STATUS_TASK!r} is reserved for the "
                             "run-status task of the step-status rewrite")

    def _run_status_task(self, steps: Sequence[ir.Step]) -> Doc:
        """``couler-run-status``: after the leaves, fails when a failure reached one (S7)."""
        has_child = {d.step for s in steps for d in self.edges[s.name]}
        leaves = [s for s in steps if s.name not in has_child]
        ups = [self._upstream(s.name, i) for i, s in enumerate(leaves)]
        spec: Doc = {
            "params": _status.spec_params(ups, ("branch",)),
            "steps": [{"name": "main", "image": _status.STATUS_IMAGE,
                       "script": _status.run_status_script([(u.step, u) for u in ups]),
                       "args": _status.args(ups, ("branch",))}]}
        return {"name": _status.RUN_STATUS_TASK,
                "runAfter": [t for u in ups for t in u.task_names],
                "params": _status.task_params(ups, ("branch",)), "taskSpec": spec}

    def _upstream(self, name: str, index: int) -> _status.Upstream:
        step = self.by_name[name]
        return _status.Upstream(name, index, step.foreach is not None,
                                tuple(self.infos[name].after))

    def _status_plan(self, step: ir.Step) -> tuple[_StatusPlan, list[Doc]]:
        """The status-mode plan of ``step`` and the task params it needs."""
        step = dataclasses.replace(step, dependencies=self.edges[step.name])
        names = list(dict.fromkeys(d.step for d in step.dependencies))
        ups = tuple(self._upstream(n, i) for i, n in enumerate(names))
        feature = Feature.DEPENDS_EXPRESSION if step.depends is not None else \
            Feature.EDGE_CONDITIONS
        try:
            gate = _status.gate_test(step, {u.step: u for u in ups})
        except ValueError as e:
            raise self._fail(step.name, feature, str(e)) from e
        params: list[Doc] = list(_status.task_params(ups))
        when = ""
        if step.when is not None:
            w = step.when
            wfeature = Feature.WHEN if w.expect else Feature.ELSE
            op = w.condition.op if w.expect else w.condition.op.negated()
            try:
                when = _status.when_test(op)
            except ValueError as e:
                raise self._fail(step.name, wfeature, str(e)) from e
            for name, v in zip(_WHEN_PARAMS, (w.condition.left, w.condition.right),
                               strict=True):
                params.append({"name": name,
                               "value": self._value(step.name, v, feature=wfeature)})
        return _StatusPlan(ups, gate, when), params

    def _metadata(self) -> Doc:
        wf = self.wf
        meta: Doc = {}
        if wf.tenant:
            meta["namespace"] = wf.tenant
        if wf.labels:
            meta["labels"] = dict(wf.labels)
        annotations = dict(wf.annotations)
        if wf.ttl_seconds is not None:
            annotations[TTL_ANNOTATION] = str(wf.ttl_seconds)
        if annotations:
            meta["annotations"] = annotations
        return meta

    def _pipeline_param(self, p: ir.Parameter) -> Doc:
        doc: Doc = {"name": p.name, "type": "array" if p.type is ir.ValueType.LIST else "string"}
        if p.description:
            doc["description"] = p.description
        if p.default is not None:
            doc["default"] = self._param_value(p.type, p.default)
        return doc

    @staticmethod
    def _param_value(vtype: ir.ValueType, lit: ir.Literal) -> Any:
        value = lit.value
        if vtype is ir.ValueType.LIST and isinstance(value, list):
            return [ir.Literal.of(v).text for v in value]
        return lit.text

    def _pipeline_run(self, meta: Doc) -> Doc:
        wf = self.wf
        spec: Doc = {"pipelineRef": {"name": wf.name}}
        params = [{"name": p.name, "value": self._param_value(p.type, p.default)}
                  for p in wf.parameters if p.default is not None]
        if params:
            spec["params"] = params
        bindings = [self._workspace_binding(v) for v in wf.volumes]
        if self.artifacts:
            bindings.append({"name": ARTIFACTS_WORKSPACE, "volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": ARTIFACTS_SIZE}}}}})
        bindings += [{"name": ws, "persistentVolumeClaim": {"claimName": claim}}
                     for ws, claim in self.caches.items()]
        if bindings:
            spec["workspaces"] = bindings
        template: Doc = {}
        if wf.service_account:
            template["serviceAccountName"] = wf.service_account
        pod = self._pod_template(wf.node_selector, wf.tolerations)
        if wf.image_pull_secrets:
            pod["imagePullSecrets"] = [{"name": s} for s in wf.image_pull_secrets]
        if wf.dns is not None:
            pod.update(dns_settings(wf.dns))
        if wf.security_context is not None:
            sc = wf.security_context
            ctx: dict[str, Any] = {k: v for k, v in (("runAsUser", sc.run_as_user),
                                     ("runAsGroup", sc.run_as_group),
                                     ("fsGroup", sc.fs_group),
                                     ("runAsNonRoot", sc.run_as_non_root)) if v is not None}
            if sc.se_linux_options is not None:
                ctx["seLinuxOptions"] = se_linux_options(sc.se_linux_options)
            if ctx:
                pod["securityContext"] = ctx
        if pod:
            template["podTemplate"] = pod
        if template:
            spec["taskRunTemplate"] = template
        if self.task_pods:
            spec["taskRunSpecs"] = self.task_pods
        if wf.timeout_seconds is not None:
            spec["timeouts"] = {"pipeline": _duration(wf.timeout_seconds)}
        run_meta: Doc = {"generateName": wf.name + "-", **meta}
        return {"apiVersion": API_VERSION, "kind": "PipelineRun", "metadata": run_meta,
                "spec": spec}

    @staticmethod
    def _pod_template(node_selector: ir.Pairs, tolerations: Iterable[ir.Toleration]) -> Doc:
        pod: Doc = {}
        if node_selector:
            pod["nodeSelector"] = dict(node_selector)
        tols = [_toleration(t) for t in tolerations]
        if tols:
            pod["tolerations"] = tols
        return pod

    @staticmethod
    def _workspace_binding(v: ir.Volume) -> Doc:
        doc: Doc = {"name": v.name}
        if v.kind is ir.VolumeKind.PVC:
            doc["persistentVolumeClaim"] = {"claimName": v.claim_name}
        elif v.kind is ir.VolumeKind.CLAIM_TEMPLATE:
            claim: Doc = {"accessModes": list(v.access_modes) or ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": v.size or "1Gi"}}}
            if v.storage_class:
                claim["storageClassName"] = v.storage_class
            doc["volumeClaimTemplate"] = {"spec": claim}
        elif v.kind is ir.VolumeKind.EMPTY_DIR:
            doc["emptyDir"] = {}
        elif v.kind is ir.VolumeKind.CONFIG_MAP:
            doc["configMap"] = {"name": v.claim_name}
        else:
            doc["secret"] = {"secretName": v.claim_name}
        return doc

    # ------------------------------------------------------------------ flattening

    def _flatten(self, steps: Sequence[ir.Step], prefix: str,
                 outer_deps: Sequence[ir.Dependency]) -> list[ir.Step]:
        """Inline sub-workflows: prefix inner step names, give inner roots the group's deps."""
        renames = {s.name: prefix + s.name for s in steps}
        out: list[ir.Step] = []
        for step in steps:
            deps = tuple(ir.Dependency(renames.get(d.step, d.step), d.condition)
                         for d in step.dependencies)
            if prefix and not deps:
                deps = tuple(outer_deps)
            name = renames[step.name]
            body = step.body
            if isinstance(body, ir.SubWorkflowSpec) and body.steps:
                self._check_group(step)
                inner = self._flatten(body.steps, name + "-", deps)
                out.extend(inner)
                self.infos[name] = _Info(task="", after=list(dict.fromkeys(
                    a for s in inner for a in self.infos[s.name].after)))
                self.group_outputs[name] = {
                    o.name: name + "-" + s.name
                    for o in step.outputs for s in body.steps if s.output(o.name) is not None}
                continue
            new = self._rename(step, renames, name)
            out.append(dataclasses.replace(new, dependencies=deps))
            self.infos[name] = self._info_of(new)
        return out

    def _resolve(self, steps: Sequence[ir.Step]) -> list[ir.Step]:
        """Point dependencies at real tasks and group outputs at the inner step producing them."""
        out = []
        for step in steps:
            deps: list[ir.Dependency] = []
            for d in step.dependencies:
                info = self.infos.get(d.step)
                targets = info.after if info is not None else [d.step]
                deps.extend(ir.Dependency(t, d.condition) for t in targets)
            resolved = self._rename(step, {}, step.name, resolve=True)
            out.append(dataclasses.replace(resolved, dependencies=tuple(deps)))
        return out

    def _rename(self, step: ir.Step, renames: Mapping[str, str], name: str,
                resolve: bool = False) -> ir.Step:
        def value(v: ir.ValueSource, extra: Mapping[str, str] = renames) -> ir.ValueSource:
            if not isinstance(v, ir.StepOutputRef):
                return v
            target = extra.get(v.step, v.step)
            while resolve and target in self.group_outputs:
                inner = self.group_outputs[target].get(v.output)
                if inner is None:
                    break
                target = inner
            return ir.StepOutputRef(target, v.output)

        def cond(c: ir.Condition, extra: Mapping[str, str] = renames) -> ir.Condition:
            return ir.Condition(value(c.left, extra), c.op, value(c.right, extra))

        fe = step.foreach
        if fe is not None and isinstance(fe.source, ir.StepOutputRef):
            src = value(fe.source)
            assert isinstance(src, ir.StepOutputRef)
            fe = dataclasses.replace(fe, source=src)
        loop = step.loop
        if loop is not None:
            loop = dataclasses.replace(loop, condition=cond(loop.condition,
                                                            {**renames, step.name: name}))
        when = step.when
        if when is not None:
            when = ir.When(cond(when.condition), when.expect)
        def artifact(a: ir.InputArtifact) -> ir.InputArtifact:
            src = a.source
            if not isinstance(src, ir.StepArtifactRef) or src.step not in renames:
                return a
            return dataclasses.replace(a, source=ir.StepArtifactRef(renames[src.step],
                                                                    src.artifact))

        return dataclasses.replace(
            step, name=name, foreach=fe, loop=loop, when=when,
            inputs=tuple(dataclasses.replace(i, value=value(i.value)) for i in step.inputs),
            input_artifacts=tuple(artifact(a) for a in step.input_artifacts))

    def _check_group(self, step: ir.Step) -> None:
        bad = [label for label, present in (
            ("when", step.when is not None), ("map", step.foreach is not None),
            ("loop", step.loop is not None), ("retry", step.retry is not None),
            ("timeout", step.timeout_seconds is not None),
            ("parallelism", step.parallelism is not None),
            ("inputs", bool(step.inputs))) if present]
        if bad:
            raise self._fail(step.name, Feature.SUBWORKFLOW_INLINE,
                             "Tekton has no task groups; a flattened sub-workflow cannot carry "
                             "group-level " + ", ".join(bad))

    def _info_of(self, step: ir.Step) -> _Info:
        if step.loop is not None:
            if step.foreach is not None:
                raise self._fail(step.name, Feature.LOOP,
                                 "a looped map cannot be unrolled on Tekton")
            n = step.loop.max_iterations
            if n > MAX_UNROLL:
                raise self._fail(step.name, Feature.LOOP,
                                 f"Tekton has no dynamic loops and Couler unrolls at most "
                                 f"{MAX_UNROLL} iterations; this loop allows {n}")
            names = [step.name] + [f"{step.name}-iter{k}" for k in range(2, n + 1)]
            return _Info(task="", after=names,
                         reason=(Feature.LOOP, "Tekton cannot select the results of the last "
                                               "executed iteration of an unrolled loop"))
        rungs = self._rung_names(step)
        if len(rungs) > 1:
            return _Info(task=rungs[-1], after=[rungs[-1]])
        if step.foreach is not None:
            feature = Feature.MAP_STATIC if step.foreach.items else Feature.MAP_DYNAMIC
            return _Info(task="", after=self._batch_names(step),
                         reason=(feature, "reading the outputs of a mapped step is not "
                                          "supported on Tekton"))
        return _Info(task=step.name, after=[step.name])

    # ------------------------------------------------------------------ values

    def _value(self, step: str, v: ir.ValueSource, *, feature: Feature = Feature.PARAMETERS
               ) -> str:
        if isinstance(v, ir.Literal):
            return v.text
        if isinstance(v, ir.WorkflowParamRef):
            return f"$(params.{v.name})"
        if isinstance(v, ir.StepOutputRef):
            info = self.infos.get(v.step)
            if info is None:  # a step of the main graph read by an exit hook
                return _task_ref(v.step, v.output)
            if info.reason is not None:
                raise self._fail(step, info.reason[0],
                                 f"reads output {v.output!r} of {v.step!r}: {info.reason[1]}")
            if (info.task, v.output) in self.array_outputs:
                raise self._fail(step, Feature.MAP_DYNAMIC,
                                 f"output {v.output!r} of {v.step!r} is an array result (it "
                                 "feeds a map) and cannot also be read as a string")
            return _task_ref(info.task, v.output)
        raise self._fail(step, feature, "the map item cannot be used here on Tekton")

    def _translate(self, text: str, items: set[str]) -> str:
        def sub(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith("inputs."):
                return f"$(params.{expr[len('inputs.'):]})"
            if expr == "item" or expr.startswith("item."):
                key = expr[len("item."):] if expr.startswith("item.") else ""
                items.add(key)
                return f"$(params.{_item_param(key)})"
            if expr in _RUN_VARS:
                self.run_vars.add(expr)
                return f"$(params.{_RUN_VARS[expr][0]})"
            return m.group(0)

        return _PLACEHOLDER.sub(sub, text)

    def _when_expr(self, step: str, cond: ir.Condition, expect: bool,
                   feature: Feature) -> Doc:
        op = cond.op if expect else cond.op.negated()
        if op not in (ir.CompareOp.EQ, ir.CompareOp.NE):
            raise self._fail(step, feature,
                             f"Tekton when expressions test set membership only (in / notin); "
                             f"the comparison {op.value!r} cannot be expressed")
        return {"input": self._value(step, cond.left, feature=feature),
                "operator": "in" if op is ir.CompareOp.EQ else "notin",
                "values": [self._value(step, cond.right, feature=feature)]}

    # ------------------------------------------------------------------ tasks

    def _batch_names(self, step: ir.Step) -> list[str]:
        """The tasks of a map: one, or one per batch of ``parallelism`` items."""
        fe = step.foreach
        if fe is None or fe.parallelism is None:
            return [step.name]
        if not fe.items:
            raise self._fail(step.name, Feature.MAP_PARALLELISM,
                             "a Tekton matrix has no concurrency bound, and the items of an "
                             "upstream list cannot be split into batches at compile time")
        n = -(-len(fe.items) // fe.parallelism)
        names = [step.name] + [f"{step.name}-batch{k}" for k in range(2, n + 1)]
        for name in names[1:]:
            if name in self.by_name or name in self.infos:
                raise self._fail(step.name, Feature.MAP_PARALLELISM,
                                 f"batch task name {name!r} is taken by another step")
        return names

    def _batches(self, step: ir.Step, task: Doc) -> list[Doc]:
        """A bounded static map as batches of ``parallelism`` items, each after the one
        before: at most ``parallelism`` items run at once (rule S10)."""
        fe = step.foreach
        names = self._batch_names(step)
        if fe is None or len(names) == 1:
            return [task]
        assert fe.parallelism is not None
        include = task["matrix"]["include"]
        out = []
        for k, name in enumerate(names):
            part = dict(task)
            part["name"] = name
            part["matrix"] = {"include": include[k * fe.parallelism:(k + 1) * fe.parallelism]}
            if k:
                part["runAfter"] = [*task.get("runAfter", []), names[k - 1]]
                self._add_task_pod(step, name)
            out.append(part)
        return out

    def _memory_levels(self, step: ir.Step) -> list[Doc]:
        """The compute resources of each attempt task of a memory-escalating step, or []."""
        retry = step.retry or self.wf.defaults.retry
        res = step.resources or self.wf.defaults.resources
        levels = memory_levels(retry, res)
        if levels and (step.foreach is not None or step.loop is not None):
            raise self._fail(step.name, Feature.MEMORY_ESCALATION,
                             "attempt tasks with more memory are not built for a mapped or "
                             "looped step on Tekton")
        return levels

    def _rung_names(self, step: ir.Step) -> list[str]:
        return _ladder.rung_names(step.name, len(self._memory_levels(step)))

    def _rungs(self, step: ir.Step, task: Doc) -> list[Doc]:
        names = self._rung_names(step)
        for name in names[1:]:
            if name in self.by_name or name in self.infos:
                raise self._fail(step.name, Feature.MEMORY_ESCALATION,
                                 f"attempt task name {name!r} is taken by another step")
            self._add_task_pod(step, name)
        retry = step.retry or self.wf.defaults.retry
        assert retry is not None
        return _ladder.rungs(task, self._memory_levels(step), names, retry)

    def _step_tasks(self, step: ir.Step) -> list[Doc]:
        tasks = self._step_tasks_of(step)
        guard = self.guards.pop(step.name, None)
        return [guard, *tasks] if guard is not None else tasks

    def _step_tasks_of(self, step: ir.Step) -> list[Doc]:
        task = self._task(step)
        if len(self._rung_names(step)) > 1:
            return self._rungs(step, task)
        if step.loop is None:
            return self._batches(step, task)
        loop = step.loop
        tasks = [task]
        prev = step.name
        for k in range(2, loop.max_iterations + 1):
            name = f"{step.name}-iter{k}"
            if name in self.infos:
                raise self._fail(step.name, Feature.LOOP,
                                 f"unrolled iteration name {name!r} is taken by another step")
            c = loop.condition
            cond = ir.Condition(self._loop_ref(c.left, step.name, prev), c.op,
                                self._loop_ref(c.right, step.name, prev))
            self.infos[prev] = _Info(task=prev, after=[prev])
            it = dict(task)
            it["name"] = name
            it["runAfter"] = [prev]
            it["when"] = [self._when_expr(step.name, cond, True, Feature.LOOP)]
            tasks.append(it)
            self._add_task_pod(step, name)
            prev = name
        self.infos[step.name] = self._info_of(step)
        return tasks

    @staticmethod
    def _loop_ref(v: ir.ValueSource, me: str, prev: str) -> ir.ValueSource:
        if isinstance(v, ir.StepOutputRef) and v.step == me:
            return ir.StepOutputRef(prev, v.output)
        return v

    def _hook_task(self, hook: ir.ExitHook, step: ir.Step) -> Doc:
        if step.dependencies or step.depends is not None:
            raise self._fail(step.name, Feature.EXIT_HOOKS,
                             "Tekton finally tasks run in parallel and cannot use runAfter")
        if isinstance(step.body, ir.SubWorkflowSpec) or step.loop is not None:
            raise self._fail(step.name, Feature.EXIT_HOOKS,
                             "an exit hook must be a single container or script step on Tekton")
        task = self._task(step, hook=True)
        status = _EXIT_STATUS.get(hook.on)
        if status is not None:
            guard = {"input": "$(tasks.status)", "operator": "in", "values": status}
            task["when"] = [guard, *task.get("when", [])]
        return task

    def _artifact_moves(self, step: ir.Step) -> tuple[list[str], list[str]]:
        """sh lines that copy input artifacts from the artifacts workspace before the
        command, and output artifacts into it (under STEP/ARTIFACT) after it."""
        if not (step.input_artifacts or step.output_artifacts):
            return [], []
        if step.loop is not None:
            raise self._fail(step.name, Feature.ARTIFACTS,
                             "artifacts of a looped step would share one place in the "
                             "artifacts workspace on Tekton")
        self.artifacts = True
        root = f"$(workspaces.{ARTIFACTS_WORKSPACE}.path)"
        fetch = []
        for a in step.input_artifacts:
            src = a.source
            if not isinstance(src, ir.StepArtifactRef):
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"input artifact {a.name!r} reads {src.storage.value} storage; "
                                 "Tekton passes only artifacts written by other steps (through "
                                 "a workspace)")
            up = self.by_name.get(src.step)
            if up is None or up.foreach is not None or up.loop is not None:
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"input artifact {a.name!r} comes from {src.step!r}, which is "
                                 "not a single container or script step")
            dest = shlex.quote(a.path)
            fetch.append(f'mkdir -p "$(dirname {dest})" && rm -rf {dest} && '
                         f'cp -R "{root}/{src.step}/{src.artifact}" {dest} || '
                         f"couler_missing {shlex.quote(a.name)}")
        store = []
        for o in step.output_artifacts:
            if o.location is not None and o.location.storage not in (ir.StorageKind.DEFAULT,
                                                                     ir.StorageKind.LOCAL):
                raise self._fail(step.name, Feature.ARTIFACTS,
                                 f"output artifact {o.name!r} goes to {o.location.storage.value} "
                                 "storage; Tekton keeps artifacts in a workspace only")
            # a map's items each keep theirs, under their TaskRun's name (no step reads
            # them back: consuming a mapped step's artifact is refused, as on Argo)
            where = f"{step.name}/$(context.taskRun.name)" if step.foreach else step.name
            dest = f'"{root}/{where}/{o.name}"'
            store.append(f'mkdir -p "{root}/{where}" && rm -rf {dest} && '
                         f"cp -R {shlex.quote(o.path)} {dest}")
        return fetch, store

    def _arrays(self, step: ir.Step) -> set[str]:
        return {o.name for o in step.outputs if (step.name, o.name) in self.array_outputs}

    @staticmethod
    def _status_parts(plan: _StatusPlan | None
                      ) -> tuple[Sequence[_status.Upstream], str, str] | None:
        return None if plan is None else (plan.ups, plan.gate, plan.when)

    def _reference_job(self, step: ir.Step, body: ir.SubWorkflowSpec) -> ir.JobSpec:
        """A reference to another workflow: a job step creating a PipelineRun of the
        Pipeline deployed under its name, the step's inputs as its params, and waiting for
        its Succeeded condition (Tekton runs no pipeline inside a pipeline, TEP-0056)."""
        if step.outputs or step.output_artifacts or step.input_artifacts:
            raise self._fail(step.name, Feature.SUBWORKFLOW_REF,
                             "the referenced pipeline's results cannot be read back from its "
                             "PipelineRun's task results by name; a reference declaring "
                             "outputs or artifacts is refused on Tekton")
        metadata: Doc = {"generateName": f"{body.name}-"}
        if body.digest:
            metadata["annotations"] = {DIGEST_ANNOTATION: body.digest}
        spec: Doc = {"pipelineRef": {"name": body.name}}
        if step.inputs:
            spec["params"] = [{"name": i.name, "value": f"{{{{inputs.{i.name}}}}}"}
                              for i in step.inputs]
        # a PipelineRun has one condition, Succeeded: True, False, or Unknown while it runs
        return ir.JobSpec.of({"apiVersion": API_VERSION, "kind": "PipelineRun",
                              "metadata": metadata, "spec": spec},
                             success_condition="status.conditions[0].status == True",
                             failure_condition="status.conditions[0].status == False")

    def _job_spec(self, step: ir.Step, job: ir.JobSpec, items: set[str],
                  plan: _StatusPlan | None) -> Doc:
        """A job step: one kubectl step that acts on the manifest and waits (:mod:`._job`)."""
        retry = step.retry or self.wf.defaults.retry
        cache = step.cache or self.wf.defaults.cache
        bad = [label for label, present in (
            ("edge conditions in the workflow", plan is not None),
            ("retries by class or with back-off", entrypoint.needs_wrapper(retry)),
            ("a cache policy", cache is not None and cache.enabled),
            ("artifacts", bool(step.input_artifacts or step.output_artifacts)),
            ("a map or loop", step.foreach is not None or step.loop is not None)) if present]
        if bad:
            raise self._fail(step.name, Feature.JOB,
                             "a Tekton job step is a kubectl step without Couler's script "
                             "wrapper; it cannot carry " + ", ".join(bad))
        outputs = []
        for o in step.outputs:
            whole = o.source is ir.OutputSource.JQ and o.selector.strip() == _job.WHOLE_OBJECT
            if o.source is not ir.OutputSource.JSON_PATH and not whole:
                raise self._fail(step.name, Feature.JOB,
                                 f"output {o.name!r} of a job step must be a JSONPath on "
                                 f"Tekton (the kubectl image has no jq), not "
                                 f"{o.source.value} {o.selector!r}")
            outputs.append((o.name, o.selector))
        try:
            text = _job.script(job, outputs)
        except ValueError as e:
            raise self._fail(step.name, Feature.JOB, str(e)) from e
        spec: Doc = {}
        if step.inputs:
            spec["params"] = [{"name": i.name, "type": "string"} for i in step.inputs]
        if outputs:
            spec["results"] = [{"name": n, "type": "string"} for n, _ in outputs]
        spec["steps"] = [{"name": "main", "image": _job.JOB_IMAGE,
                          "script": self._translate(text, items)}]
        return spec

    def _cache_plan(self, step: ir.Step, items: set[str], ladder: bool
                    ) -> _cache.CachePlan | None:
        cache = step.cache or self.wf.defaults.cache
        if cache is None or not cache.enabled:
            return None
        if step.output_artifacts or ladder:
            raise self._fail(step.name, Feature.CACHE,
                             "the Tekton cache keeps results only: not output artifacts, nor "
                             "the attempt tasks of memory escalation")
        inputs = [i.name for i in step.inputs] + sorted(_item_param(k) for k in items)
        plan = _cache.plan_for(step, self.wf.name, cache, self._translate(cache.key, items),
                               list(dict.fromkeys(inputs)))
        self.caches[plan.workspace] = plan.claim
        return plan

    def _add_task_pod(self, step: ir.Step, task_name: str) -> None:
        pod = self._pod_template(step.node_selector, step.tolerations)
        if pod:
            self.task_pods.append({"pipelineTaskName": task_name, "podTemplate": pod})

    def _task(self, step: ir.Step, *, hook: bool = False) -> Doc:
        d = self.wf.defaults
        items: set[str] = set()
        task: Doc = {"name": step.name}
        params: list[Doc] = []
        item_inputs: dict[str, str] = {}  # input name -> item key
        for inp in step.inputs:
            if isinstance(inp.value, ir.ItemRef):
                item_inputs[inp.name] = inp.value.key
            else:
                params.append({"name": inp.name, "value": self._value(step.name, inp.value)})
        plan: _StatusPlan | None = None
        if self.status and not hook:  # a finally task has no edges to test
            plan, status_params = self._status_plan(step)
            params += status_params
        self.run_vars = set()
        spec = self._task_spec(step, items, plan)
        if "workflow.status" in self.run_vars and not hook:
            raise self._fail(step.name, Feature.PARAMETERS,
                             "{{workflow.status}} is known on Tekton only in an exit hook "
                             "(a finally task reads $(tasks.status))")
        if self.run_vars:
            declared = list(spec.pop("params", []))
            for var in sorted(self.run_vars):
                name, value = _RUN_VARS[var]
                params.append({"name": name, "value": value})
                declared.append({"name": name, "type": "string"})
            spec = {"params": declared, **spec}
        matrix = self._matrix(step, item_inputs, items)
        run_after = list(dict.fromkeys(d.step for d in step.dependencies))
        if run_after:
            task["runAfter"] = run_after
        if params:
            task["params"] = params
        if matrix:
            task["matrix"] = matrix
        if step.when is not None and plan is None:  # status mode: the script tests it
            feature = Feature.WHEN if step.when.expect else Feature.ELSE
            cond, expect = step.when.condition, step.when.expect
            op = cond.op if expect else cond.op.negated()
            if op in (ir.CompareOp.EQ, ir.CompareOp.NE):
                task["when"] = [self._when_expr(step.name, cond, expect, feature)]
            else:
                guard = self._guard_task(step, cond, op, feature)
                self.guards[step.name] = guard
                task["when"] = [{"input": _task_ref(guard["name"], _GUARD_RESULT),
                                 "operator": "in", "values": ["true"]}]
        retry = step.retry or d.retry
        if retry is not None and not entrypoint.needs_wrapper(retry) and plan is None \
                and not self._memory_levels(step):
            task["retries"] = retry.limit  # else the wrapper retries inside the step
        timeout = step.timeout_seconds if step.timeout_seconds is not None else d.timeout_seconds
        if timeout is not None:
            task["timeout"] = _duration(timeout)
        workspaces = []
        for m in step.volume_mounts:
            binding: Doc = {"name": m.name, "workspace": m.name}
            if m.sub_path:
                binding["subPath"] = m.sub_path
            workspaces.append(binding)
        if step.input_artifacts or step.output_artifacts:
            workspaces.append({"name": ARTIFACTS_WORKSPACE, "workspace": ARTIFACTS_WORKSPACE})
        cache_ws = spec.get("workspaces", [])
        workspaces += [{"name": w["name"], "workspace": w["name"]} for w in cache_ws
                       if w["name"] in self.caches]
        if workspaces:
            task["workspaces"] = workspaces
        task["taskSpec"] = spec
        self._add_task_pod(step, step.name)
        return task

    def _guard_task(self, step: ir.Step, cond: ir.Condition, op: ir.CompareOp,
                    feature: Feature) -> Doc:
        """The task that tests an ordered comparison for ``step``'s when: Tekton's when
        expressions test set membership only, so ``STEP-when`` compares the two values as
        numbers and writes ``true`` or ``false``, which the step's when tests. A value
        that is not a number fails the guard task, naming both."""
        name = f"{step.name}{_GUARD_SUFFIX}"
        if name in self.by_name:
            raise self._fail(step.name, feature, f"the when's guard task name {name!r} is "
                             "taken by another step")
        params = [{"name": "left", "value": self._value(step.name, cond.left, feature=feature)},
                  {"name": "right", "value": self._value(step.name, cond.right,
                                                         feature=feature)}]
        script = guard_script(op, f"$(results.{_GUARD_RESULT}.path)", step.name)
        return {"name": name, "params": params, "taskSpec": {
            "params": [{"name": "left", "type": "string"}, {"name": "right", "type": "string"}],
            "results": [{"name": _GUARD_RESULT, "type": "string",
                         "description": f"whether {step.name}'s when holds"}],
            "steps": [{"name": "compare", "image": _status.STATUS_IMAGE,
                       "args": ["$(params.left)", "$(params.right)"], "script": script}]}}

    def _matrix(self, step: ir.Step, item_inputs: Mapping[str, str], items: set[str]) -> Doc:
        fe = step.foreach
        if fe is None:
            if item_inputs or items:
                raise self._fail(step.name, Feature.PARAMETERS, "map item used outside a map")
            return {}
        names = {**item_inputs, **{_item_param(k): k for k in items}}
        if fe.items:
            if len(fe.items) > MAX_MATRIX_COMBINATIONS:
                raise self._fail(step.name, Feature.MAP_STATIC,
                                 f"{len(fe.items)} items exceed Tekton's matrix limit of "
                                 f"{MAX_MATRIX_COMBINATIONS} combinations "
                                 "(default-max-matrix-combinations-count)")
            include = []
            for i, lit in enumerate(fe.items):
                value = lit.value
                entry: Doc = {"name": f"item-{i}"}
                if names:
                    entry["params"] = [{"name": n, "value": _item_text(value, k)}
                                       for n, k in names.items()]
                include.append(entry)
            return {"include": include}
        if any(k for k in names.values()):
            raise self._fail(step.name, Feature.MAP_DYNAMIC,
                             "items of an upstream list must be strings on Tekton (array "
                             "results); item.KEY cannot be selected")
        src = fe.source
        if isinstance(src, ir.StepOutputRef):
            info = self.infos.get(src.step)
            if info is None or info.reason is not None or not info.task:
                raise self._fail(step.name, Feature.MAP_DYNAMIC,
                                 f"cannot map over the output of {src.step!r} on Tekton")
            ref = _task_ref(info.task, src.output, array=True)
        else:
            assert src is not None
            ref = f"$(params.{src.name}[*])"
        if not names:
            names = {ITEM_PARAM: ""}
        if len(names) > 1:
            raise self._fail(step.name, Feature.MAP_DYNAMIC,
                             "a Tekton matrix crosses its params; the item can feed one "
                             "parameter only")
        (name,) = names
        return {"params": [{"name": name, "value": ref}]}

    def _task_spec(self, step: ir.Step, items: set[str], plan: _StatusPlan | None = None
                   ) -> Doc:
        d = self.wf.defaults
        body = step.body
        if isinstance(body, ir.JobSpec):
            return self._job_spec(step, body, items, plan)
        if isinstance(body, ir.SubWorkflowSpec) and not body.steps:
            return self._job_spec(step, self._reference_job(step, body), items, plan)
        if not isinstance(body, (ir.ContainerSpec, ir.ScriptSpec)):
            raise self._fail(step.name, Feature.SUBWORKFLOW_INLINE, "not expressible on Tekton")
        tstep: Doc = {"name": "main", "image": body.image}
        if body.image_pull_policy:
            tstep["imagePullPolicy"] = body.image_pull_policy
        if body.working_dir:
            tstep["workingDir"] = self._translate(body.working_dir, items)
        retry = step.retry or d.retry
        # in status mode the step always exits 0 to Tekton (onError: continue), so Tekton's
        # retries never fire: every policy goes through the wrapper
        ladder = bool(self._memory_levels(step))
        if ladder and plan is not None:
            raise self._fail(step.name, Feature.MEMORY_ESCALATION,
                             "attempt tasks with more memory are not combined with the "
                             "step-status rewrite (edge conditions) on Tekton")
        policy = retry if entrypoint.needs_wrapper(retry) or plan is not None or ladder \
            else None
        moves = self._artifact_moves(step)
        cache = self._cache_plan(step, items, ladder)
        wrapped = bool(step.outputs) or policy is not None or plan is not None or moves != ([],
                                                                                         []) \
            or cache is not None
        lead = _status.args(plan.ups) if plan is not None else []
        file_outputs = [o for o in step.outputs if o.source is ir.OutputSource.PATH]
        stdout = [o for o in step.outputs if o.source is ir.OutputSource.STDOUT]
        other = [o for o in step.outputs if o.source not in (ir.OutputSource.PATH,
                                                             ir.OutputSource.STDOUT)]
        if other:
            raise self._fail(step.name, Feature.PARAMETERS,
                             f"output {other[0].name!r} reads a job resource ({other[0].source}); "
                             "Tekton has no job steps")
        if isinstance(body, ir.ContainerSpec):
            command = [self._translate(c, items) for c in body.command]
            args = [self._translate(a, items) for a in body.args]
            if wrapped:
                if not command:
                    feature = (Feature.PARAMETERS if step.outputs else
                               Feature.EDGE_CONDITIONS if plan is not None else
                               Feature.ARTIFACTS if moves != ([], []) else
                               Feature.CACHE if cache is not None else
                               _retry_feature(policy))
                    raise self._fail(step.name, feature,
                                     "outputs, retries by class / back-off or edge conditions "
                                     "of a container that runs its image's entrypoint need a "
                                     "command to wrap on Tekton")
                tstep["script"] = _script.step_script(
                    step, '"$@"', file_outputs, stdout, arrays=self._arrays(step),
                    policy=policy, status=self._status_parts(plan), moves=moves,
                    ladder=ladder, cache=cache)
                tstep["args"] = lead + command + args
            else:
                if command:
                    tstep["command"] = command
                if args:
                    tstep["args"] = args
        else:
            source = self._translate(body.source, items)
            interp = list(body.command) or list(_INTERPRETER[body.language])
            args = [self._translate(a, items) for a in body.args]
            if wrapped or len(interp) != 1:
                marker = _heredoc_marker(source)
                path = "/tmp/couler-script"
                run = " ".join(shlex.quote(w) for w in interp) + f' {path} "$@"'
                prologue = f"cat > {path} <<'{marker}'\n{source}"
                if not source.endswith("\n"):
                    prologue += "\n"
                prologue += marker + "\n"
                tstep["script"] = _script.step_script(
                    step, run, file_outputs, stdout, prologue, arrays=self._arrays(step),
                    policy=policy, status=self._status_parts(plan), moves=moves,
                    ladder=ladder, cache=cache)
            else:
                shebang = interp[0] if interp[0].startswith("/") else "/usr/bin/env " + interp[0]
                tstep["script"] = f"#!{shebang}\n{source}"
            if lead or args:
                tstep["args"] = lead + args
        env = []
        for e in step.env:
            if e.secret is not None:
                env.append({"name": e.name, "valueFrom": {"secretKeyRef": {
                    "name": e.secret.name, "key": e.secret.key}}})
            else:
                env.append({"name": e.name, "value": self._translate(e.value, items)})
        if plan is not None and plan.when:
            env += [{"name": f"COULER_WHEN_{side}", "value": f"$(params.{name})"}
                    for side, name in zip("LR", _WHEN_PARAMS, strict=True)]
        if cache is not None:
            env.append({"name": "COULER_CACHE_KEY", "value": cache.key_material})
        if env:
            tstep["env"] = env
        if plan is not None or ladder:
            tstep["onError"] = "continue"  # a ladder's last task drops it (_rungs)
        res = step.resources or d.resources
        if res is not None:
            compute = resource_requirements(res)
            if compute:
                tstep["computeResources"] = compute
        spec: Doc = {}
        meta: Doc = {}
        if step.labels:
            meta["labels"] = dict(step.labels)
        if meta:
            spec["metadata"] = meta
        param_names = [i.name for i in step.inputs] + sorted(
            _item_param(k) for k in items if _item_param(k) not in {i.name for i in step.inputs})
        spec_params = [{"name": n, "type": "string"} for n in param_names]
        if plan is not None:
            spec_params += _status.spec_params(plan.ups)
            if plan.when:
                spec_params += [{"name": n, "type": "string"} for n in _WHEN_PARAMS]
        if spec_params:
            spec["params"] = spec_params
        results = [{"name": o.name,
                    "type": "array" if (step.name, o.name) in self.array_outputs else "string"}
                   for o in step.outputs]
        if policy is not None:
            results += [{"name": ATTEMPTS_RESULT, "type": "string"},
                        {"name": FAILURE_RESULT, "type": "string"}]
        if ladder:
            results.append({"name": EXIT_RESULT, "type": "string"})
        if cache is not None:
            results.append({"name": _cache.CACHED_RESULT, "type": "string"})
        if plan is not None:
            results += [{"name": _status.STATUS_RESULT, "type": "string"},
                        {"name": _status.BRANCH_RESULT, "type": "string"}]
        if results:
            spec["results"] = results
        if step.volume_mounts or moves != ([], []) or cache is not None:
            seen: set[str] = set()
            ws = []
            if moves != ([], []):
                ws.append({"name": ARTIFACTS_WORKSPACE})  # at /workspace/couler-artifacts
                seen.add(ARTIFACTS_WORKSPACE)
            if cache is not None:
                ws.append({"name": cache.workspace})
                seen.add(cache.workspace)
            for m in step.volume_mounts:
                if m.name in seen:
                    raise self._fail(step.name, Feature.VOLUMES,
                                     f"volume {m.name!r} is mounted twice; a Tekton workspace "
                                     "has one mount path per task")
                seen.add(m.name)
                w: Doc = {"name": m.name, "mountPath": m.mount_path}
                if m.read_only:
                    w["readOnly"] = True
                ws.append(w)
            spec["workspaces"] = ws
        spec["steps"] = [tstep]
        return spec
