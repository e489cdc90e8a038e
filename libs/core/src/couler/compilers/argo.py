"""Compile a Couler IR workflow into an Argo Workflows document (plain data).

:func:`compile_workflow` turns an :class:`couler.ir.Workflow` into a
``Workflow`` (or a ``CronWorkflow`` when the workflow has a schedule) as a
plain ``dict``; :func:`to_yaml` renders such a document; :func:`dump_yaml` does
both. The compiler is a pure function: no cluster, no network.

Why plain dicts and not Hera's generated models (``hera.workflows.models``,
pydantic v2): they were tried and measured. A chain of N DAG tasks (one
parameter each) built as models plus ``model_dump(by_alias=True,
exclude_none=True, mode="json")`` took 0.11 s at 10k tasks and 2.3-2.9 s at
100k (ratio ~25: the collector keeps re-walking the live model objects; still
~10x slower than dicts with it paused), against 0.04 s and 0.16-0.34 s for the
same document built as dicts. The models also fit awkwardly (``IntOrString`` and
``Quantity`` root models, aliases) and the result must be plain data anyway. So
the document is built from dicts; the tests check every emitted shape against
Argo's vendored JSON schema, with a walk that also rejects unknown keys.

Cost: linear in the steps. Templates are indexed by content (sha256 of their
JSON) and by the IR fields that shape them, name suffixes are counted per hint,
and the cyclic garbage collector is paused while the (acyclic) document is
built. Measured on a 2-vCPU machine, validation included: 0.12-0.17 s for 10k
steps and 1.4-1.8 s for 100k (chain, fan-out, layered random DAG, shared or
distinct templates), a ratio of 10.7-12.6; the compiler alone 10.4-11.4 and
:func:`couler.ir.validate` alone 11.6-14. A bare loop building 100k small
dicts shows 15-19 on that machine: the excess over 10 is allocator and cache
growth, not the algorithm.

Shape of the output:

* ``spec.entrypoint`` is a DAG template named after the workflow, one task per
  step; dependencies are always rendered as enhanced ``depends`` expressions.
* One template per distinct step body and interface: content-identical steps
  share a template; a name hint shared by different bodies gets ``-2``, ``-3``...
* ``{{inputs.NAME}}`` becomes ``{{inputs.parameters.NAME}}``; ``{{item}}`` and
  ``{{item.KEY}}`` (legal only in Argo task fields) are hoisted into template
  input parameters that the task sets to ``{{item}}`` / ``{{item.KEY}}``.
* Some steps are called through a small wrapper DAG template: a loop (a
  recursive ``<tmpl>-loop`` template), a map with its own parallelism
  (``<tmpl>-map``, Argo has no per-task parallelism) and a step whose stdout is
  exported as a global parameter (``<tmpl>-export``). A wrapper exports every
  output of the step as an output *parameter*, so downstream references to a
  wrapped step read ``outputs.parameters.NAME`` even for stdout outputs.
* Event triggers have no in-workflow Argo equivalent: they are recorded in the
  ``couler.io/triggers`` annotation (JSON) and launches on events are done by
  Couler's submitter.

What Argo cannot express raises :class:`~couler.errors.UnsupportedFeatureError`:

* step ``priority``: the template-level ``priority`` field (pod priority) was
  removed from Argo (argoproj/argo-workflows#14277) and is absent from its schema;
* a non-integral retry back-off ``factor`` (Argo's factor is an integer);
* consuming an output artifact of a mapped step (Argo does not aggregate
  artifacts of a fan-out);
* ``local`` artifact storage (Argo has no such driver);
* container-only settings (env, resources, volume mounts, artifacts, daemon)
  on steps that run no container of their own (jobs and sub-workflows), file
  outputs of those steps, and pod or timeout settings on an inline
  sub-workflow (a DAG template has no pod and no deadline in Argo).

Conventions where the IR leaves a choice:

* An inline sub-workflow's output ``NAME`` is forwarded from the one inner step
  that declares an output ``NAME``.
* Without a user key, a memoize key is the template's content digest (salt
  mixed in), a sha256 of the input values (Argo accepts only ``[a-zA-Z0-9-]``
  in keys, so values are hashed by an expression, not pasted) and the salt.
* ``{{inputs.NAME}}`` / ``{{item}}`` are also translated in script sources and
  job manifests (Argo substitutes there too; an untranslated one would fail).
* An external sub-workflow's pinned ``digest`` is recorded in the
  ``couler.io/digest`` annotation of the child Workflow (Argo cannot pin).

Step defaults (``Workflow.defaults``) apply to the leaf steps; an inline
sub-workflow step is a group, its inner steps receive the defaults instead.
Memory escalation on retry (``memory_factor``) rewrites the main container's
memory via ``podSpecPatch`` indexed by Argo's ``retries`` counter, so it grows
on every retry, not only after an out-of-memory kill (the patch cannot see why
the last attempt failed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import ROUND_CEILING, Decimal
from typing import Any

from couler import ir
from couler.alloc import gc_paused
from couler.compilers import emit
from couler.compilers.argo_capabilities import CAPABILITIES, ENGINE
from couler.compilers.kube import (
    DIGEST_ANNOTATION,
    cron_policy,
    dns_settings,
    resource_requirements,
    se_linux_options,
)
from couler.engines.base import check_capabilities
from couler.errors import UnsupportedFeatureError
from couler.ir.validate import parse_quantity
from couler.optimize.tune import expand_tune

__all__ = [
    "API_VERSION",
    "DEFAULT_CACHE",
    "DIGEST_ANNOTATION",
    "ENGINE",
    "TRIGGERS_ANNOTATION",
    "compile_workflow",
    "dump_yaml",
    "to_yaml",
]

API_VERSION = "argoproj.io/v1alpha1"
TRIGGERS_ANNOTATION = "couler.io/triggers"
DEFAULT_CACHE = "couler-cache"
EXIT_HANDLER = "exit-handler"

Doc = dict[str, Any]

_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
_NOT_TEMPLATE_CHAR = re.compile(r"[^-a-zA-Z0-9]+")
_NOT_PARAM_CHAR = re.compile(r"[^-a-zA-Z0-9_]+")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_TEMPLATE_NAME = 128  # Argo's limit on template names
_MAX_QUANTITY = 2**63 - 1
_NUMERIC = frozenset({ir.ValueType.INT, ir.ValueType.FLOAT, ir.ValueType.BOOL})
_SELF = "\x00self"  # stands for a recursive template's own name while its content is keyed

_SCRIPT_COMMANDS = {
    ir.ScriptLanguage.PYTHON: ["python"],
    ir.ScriptLanguage.BASH: ["bash"],
    ir.ScriptLanguage.SH: ["sh"],
}
_EXIT_STATUS = {
    ir.RunStatus.SUCCEEDED: "Succeeded",
    ir.RunStatus.FAILED: "Failed",
    ir.RunStatus.ERROR: "Error",
}
_EDGE_SUFFIX = {
    ir.EdgeCondition.SUCCEEDED_ONLY: "Succeeded",
    ir.EdgeCondition.FAILED: "Failed",
    ir.EdgeCondition.ERRORED: "Errored",
    ir.EdgeCondition.SKIPPED: "Skipped",
    ir.EdgeCondition.OMITTED: "Omitted",
    ir.EdgeCondition.ANY_SUCCEEDED: "AnySucceeded",
    ir.EdgeCondition.ALL_FAILED: "AllFailed",
}
def _dag(tasks: list[Doc], steps: Sequence[ir.Step]) -> Doc:
    """A DAG template body; ``failFast: false`` unless its steps form one chain.

    Couler's rule (docs/semantics.md, S7): a failed step stops only its own
    dependents; independent branches run to completion, then the run fails.
    Argo's default fail-fast instead fails the DAG as soon as a failed branch
    reaches a leaf, so whether an independent step runs would depend on timing.
    """
    if _is_chain(steps):
        return {"tasks": tasks}
    return {"failFast": False, "tasks": tasks}


def _is_chain(steps: Sequence[ir.Step]) -> bool:
    """Whether every step but the first depends on exactly the one before it (and nothing
    else does): no independent branches, so fail-fast changes nothing."""
    return all(s.depends is None and [d.step for d in s.dependencies] ==
               ([steps[i - 1].name] if i else []) for i, s in enumerate(steps))


_OOM_EXPRESSION = 'asInt(lastRetry.exitCode) == 137 || lastRetry.message contains "OOMKilled"'


# --------------------------------------------------------------------------- public API


def compile_workflow(wf: ir.Workflow, *, validate: bool = True) -> dict[str, Any]:
    """Compile ``wf`` into an Argo ``Workflow`` (``CronWorkflow`` when scheduled).

    Args:
        wf: the workflow.
        validate: run :func:`couler.ir.validate` first (the compiler assumes a
            valid workflow).

    Returns:
        The document as plain data (dicts, lists, strings, numbers, booleans).

    Raises:
        couler.errors.ValidationError: the workflow is invalid.
        couler.errors.UnsupportedFeatureError: the workflow uses a feature
            Argo cannot express.
    """
    with gc_paused():
        if validate:
            ir.validate(wf)
        wf = expand_tune(wf)  # tune steps become ask / trials / tell rounds (no-op without)
        check_capabilities(ENGINE, CAPABILITIES, wf)
        return _Compiler(wf).compile()


def to_yaml(doc: Mapping[str, Any]) -> str:
    """Render a document as YAML: keys in the order built, multi-line strings as ``|`` blocks."""
    return emit.to_yaml(doc)


def dump_yaml(wf: ir.Workflow) -> str:
    """Compile ``wf`` and render it as YAML."""
    return to_yaml(compile_workflow(wf))


# --------------------------------------------------------------------------- helpers


def _ph(expr: str) -> str:
    """An Argo placeholder: ``{{expr}}``."""
    return "{{" + expr + "}}"


def _param(name: str) -> str:
    return _ph("inputs.parameters." + name)


def _index(name: str) -> str:
    """An expression accessor for a map member: ``.name`` or ``["name"]``."""
    return "." + name if _IDENTIFIER.match(name) else f"['{name}']"


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, or ``base-2``, ``base-3``... whichever is not taken; marks it taken."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _duration(seconds: float) -> str:
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    millis = seconds * 1000
    if millis == int(millis):
        return f"{int(millis)}ms"
    return f"{seconds}s"


def _pairs(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    return dict(pairs)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _content_key(body: Doc) -> bytes:
    """A template's content identity: the sha256 of its JSON text.

    Templates are built by one code path, so equal content has equal key order
    and needs no sorting; keeping 32-byte digests instead of the texts keeps the
    registry small for a workflow of 100k distinct steps.
    """
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).digest()


@dataclasses.dataclass(slots=True)
class _Info:
    """How a DAG scope sees one step: its task name and how its outputs are read."""

    task: str
    step: ir.Step
    kind: str | None  # the wrapper it is called through ("loop", "map", "export") or None
    mapped: bool  # fans out: outputs aggregate, artifacts cannot be consumed

    @property
    def wrapped(self) -> bool:
        """Whether a wrapper exports every output, stdout included, as a parameter."""
        return self.kind is not None


_Scope = dict[str, _Info]


@dataclasses.dataclass(slots=True)
class _Call:
    """A step template and what a task must pass to it."""

    name: str
    params: list[tuple[str, ir.ValueSource]]  # input parameter -> where its value comes from
    artifacts: list[tuple[str, ir.StepArtifactRef]]  # input artifact -> upstream artifact


class _Hoist:
    """Input parameters standing for ``{{item}}`` / ``{{item.KEY}}`` in a template."""

    def __init__(self, inputs: Sequence[ir.InputParameter]) -> None:
        self.taken = {i.name for i in inputs}
        # an input already fed by the item stands for it: {{item.k}} reuses that input
        self.existing = {i.value.key: i.name for i in reversed(inputs)
                         if isinstance(i.value, ir.ItemRef)}
        self.params: dict[str, str] = {}  # item key ("" = the whole item) -> new parameter

    def param(self, key: str) -> str:
        name = self.existing.get(key) or self.params.get(key)
        if name is None:
            base = "item" if not key else "item-" + _NOT_PARAM_CHAR.sub("-", key).strip("-")
            name = _fresh(base.rstrip("-") or "item", self.taken)
            self.params[key] = name
        return name


def _translator(inputs: set[str], hoist: _Hoist | None) -> Callable[[str], str]:
    """A function rewriting IR placeholders in a text into Argo's syntax."""

    def repl(m: re.Match[str]) -> str:
        ref = m.group(1)
        if ref.startswith("inputs.") and ref[7:] in inputs:
            return _param(ref[7:])
        if hoist is not None:
            if ref == "item":
                return _param(hoist.param(""))
            if ref.startswith("item."):
                return _param(hoist.param(ref[5:]))
        return m.group(0)

    def translate(text: str) -> str:
        return _PLACEHOLDER.sub(repl, text) if "{{" in text else text

    return translate


class _Forward:
    """Extra input parameters of a wrapper template, each carrying an outer value."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken
        self.by_value: dict[str, str] = {}
        self.params: list[tuple[str, str]] = []  # (parameter, value in the outer scope)

    def add(self, base: str, outer_value: str) -> str:
        name = self.by_value.get(outer_value)
        if name is None:
            name = _fresh(base, self.taken)
            self.by_value[outer_value] = name
            self.params.append((name, outer_value))
        return name


# --------------------------------------------------------------------------- compiler


class _Compiler:
    def __init__(self, wf: ir.Workflow) -> None:
        self.wf = wf
        self.templates: list[Doc] = []
        self.names: set[str] = set()
        self.suffix: dict[str, int] = {}  # name base -> last suffix handed out
        self.bases: dict[str, str] = {}  # name hint -> valid name base
        self.by_key: dict[bytes, str] = {}  # template content key -> template name
        self.by_ir: dict[tuple[Any, ...], tuple[str, list[tuple[str, ir.ValueSource]]]] = {}
        self.params = {p.name: p for p in wf.parameters}
        self.volumes = {v.name for v in wf.volumes}

    # ------------------------------------------------------------------ errors

    def unsupported(self, step: str, feature: str, detail: str = "") -> UnsupportedFeatureError:
        return UnsupportedFeatureError(ENGINE, self.wf.name, step, feature, detail)

    # ------------------------------------------------------------------ document

    def compile(self) -> Doc:
        wf = self.wf
        if wf.defaults.priority is not None:
            raise self.unsupported("", "step priority (defaults.priority)", _PRIORITY_DETAIL)
        entry: Doc = {"name": self.reserve(wf.name)}
        self.templates.append(entry)
        exit_tmpl: Doc | None = None
        if wf.exit_hooks:
            exit_tmpl = {"name": self.reserve(EXIT_HANDLER)}
            self.templates.append(exit_tmpl)
        entry["dag"] = _dag(self.dag(wf.steps), wf.steps)
        if exit_tmpl is not None:
            exit_tmpl["dag"] = _dag(self.exit_tasks(), [s for h in wf.exit_hooks for s in h.steps])

        spec = self.workflow_spec(entry["name"], None if exit_tmpl is None else exit_tmpl["name"])
        metadata: Doc = {}
        if wf.schedule is None:
            metadata["generateName"] = f"{wf.name}-"
        else:
            metadata["name"] = wf.name
        if wf.tenant:
            metadata["namespace"] = wf.tenant
        if wf.labels:
            metadata["labels"] = _pairs(wf.labels)
        annotations = _pairs(wf.annotations)
        if wf.triggers:
            annotations[TRIGGERS_ANNOTATION] = json.dumps(
                [{"subject": t.subject, "filter": t.filter} for t in wf.triggers],
                separators=(",", ":"))
        if annotations:
            metadata["annotations"] = annotations

        if wf.schedule is None:
            return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
                    "spec": spec}
        s = wf.schedule
        cron: Doc = {"schedules": [s.schedule]}
        if s.timezone:
            cron["timezone"] = s.timezone
        cron.update(cron_policy(s))
        if wf.labels:
            cron["workflowMetadata"] = {"labels": _pairs(wf.labels)}
        cron["workflowSpec"] = spec
        return {"apiVersion": API_VERSION, "kind": "CronWorkflow", "metadata": metadata,
                "spec": cron}

    def workflow_spec(self, entrypoint: str, on_exit: str | None) -> Doc:
        wf = self.wf
        spec: Doc = {"entrypoint": entrypoint}
        if wf.parameters:
            params = []
            for p in wf.parameters:
                param: Doc = {"name": p.name}
                if p.default is not None:
                    param["value"] = p.default.text
                if p.enum:
                    param["enum"] = [e.text for e in p.enum]
                if p.description:
                    param["description"] = p.description
                params.append(param)
            spec["arguments"] = {"parameters": params}
        if wf.service_account:
            spec["serviceAccountName"] = wf.service_account
        if wf.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": s} for s in wf.image_pull_secrets]
        if wf.dns is not None:
            spec.update(dns_settings(wf.dns))
        if wf.security_context is not None:
            sc = wf.security_context
            ctx: Doc = {}
            if sc.run_as_user is not None:
                ctx["runAsUser"] = sc.run_as_user
            if sc.run_as_group is not None:
                ctx["runAsGroup"] = sc.run_as_group
            if sc.fs_group is not None:
                ctx["fsGroup"] = sc.fs_group
            if sc.run_as_non_root is not None:
                ctx["runAsNonRoot"] = sc.run_as_non_root
            if sc.se_linux_options is not None:
                ctx["seLinuxOptions"] = se_linux_options(sc.se_linux_options)
            if ctx:
                spec["securityContext"] = ctx
        if wf.timeout_seconds is not None:
            spec["activeDeadlineSeconds"] = wf.timeout_seconds
        if wf.ttl_seconds is not None:
            spec["ttlStrategy"] = {"secondsAfterCompletion": wf.ttl_seconds}
        if wf.parallelism is not None:
            spec["parallelism"] = wf.parallelism
        if wf.node_selector:
            spec["nodeSelector"] = _pairs(wf.node_selector)
        if wf.tolerations:
            spec["tolerations"] = [_toleration(t) for t in wf.tolerations]
        volumes = [_volume(v) for v in wf.volumes if v.kind != ir.VolumeKind.CLAIM_TEMPLATE]
        if volumes:
            spec["volumes"] = volumes
        claims = [_claim_template(v) for v in wf.volumes if v.kind == ir.VolumeKind.CLAIM_TEMPLATE]
        if claims:
            spec["volumeClaimTemplates"] = claims
        if on_exit is not None:
            spec["onExit"] = on_exit
        spec["templates"] = self.templates
        return spec

    # ------------------------------------------------------------------ template registry

    def reserve(self, hint: str) -> str:
        """A new template name from ``hint``, made valid for Argo and unique."""
        base = self.bases.get(hint)
        if base is None:
            base = _NOT_TEMPLATE_CHAR.sub("-", hint).strip("-")[: _MAX_TEMPLATE_NAME - 12]
            base = self.bases[hint] = base.strip("-") or "step"
        name, n = base, self.suffix.get(base, 1)  # resume numbering: linear in templates
        if n > 1:
            name = f"{base}-{n}"
        while name in self.names:
            n += 1
            name = f"{base}-{n}"
        self.suffix[base] = n
        self.names.add(name)
        return name

    def register(self, hint: str, body: Doc) -> str:
        """The name of a template with ``body`` (everything but the name); shared by content."""
        key = _content_key(body)
        name = self.by_key.get(key)
        if name is None:
            name = self.reserve(hint)
            self.by_key[key] = name
            self.templates.append({"name": name, **body})
        return name

    def register_recursive(self, hint: str, build: Callable[[str], Doc]) -> str:
        """Like :meth:`register` for a template that calls itself by name."""
        key = _content_key(build(_SELF))
        name = self.by_key.get(key)
        if name is None:
            name = self.reserve(hint)
            self.by_key[key] = name
            self.templates.append({"name": name, **build(name)})
        return name

    # ------------------------------------------------------------------ DAGs

    def dag(self, steps: Sequence[ir.Step], rename: Mapping[str, str] | None = None,
            guard: str = "") -> list[Doc]:
        scope: _Scope = {}
        for s in steps:
            task = s.name if rename is None else rename[s.name]
            scope[s.name] = _Info(task, s, self.wrapper_kind(s), s.foreach is not None)
        return [self.task(s, scope, guard) for s in steps]

    def exit_tasks(self) -> list[Doc]:
        tasks: list[Doc] = []
        used: set[str] = set()
        for hook in self.wf.exit_hooks:
            rename = {s.name: _fresh(s.name, used) for s in hook.steps}
            status = _EXIT_STATUS.get(hook.on)
            guard = "" if status is None else _ph("workflow.status") + " == " + status
            tasks.extend(self.dag(hook.steps, rename, guard))
        return tasks

    @staticmethod
    def wrapper_kind(step: ir.Step) -> str | None:
        if step.loop is not None and step.loop.max_iterations > 1:
            return "loop"
        if step.foreach is not None and step.foreach.parallelism is not None:
            return "map"
        if any(o.source == ir.OutputSource.STDOUT and o.global_name for o in step.outputs):
            return "export"
        return None

    def task(self, step: ir.Step, scope: _Scope, guard: str) -> Doc:
        info = scope[step.name]
        eff = self.effective(step)
        self.check_features(eff)
        call = self.step_template(eff)
        kind = info.kind
        when = self.when(step, scope) if step.when is not None else ""
        task: Doc = {"name": info.task}
        items_inside = False
        if kind is None:
            template = call.name
            params = [(n, self.value(src, scope)) for n, src in call.params]
            artifacts = [(n, self.artifact_from(ref, scope, step)) for n, ref in call.artifacts]
        elif kind == "loop":
            template, params, artifacts = self.loop_wrapper(eff, call, scope)
        elif kind == "map":
            template, params, artifacts, inner_when = self.map_wrapper(eff, call, scope)
            items_inside = True
            if inner_when:
                when = ""
        else:
            template, params, artifacts = self.export_wrapper(eff, call, scope)
        task["template"] = template
        arguments = _arguments(params, artifacts)
        if arguments:
            task["arguments"] = arguments
        depends = self.depends(step, scope)
        if depends:
            task["depends"] = depends
        if guard and when:
            when = f"{guard} && ({when})"
        elif guard:
            when = guard
        if when:
            task["when"] = when
        if step.foreach is not None and not items_inside:
            task.update(self.fan_out(step.foreach, scope))
        return task

    def fan_out(self, fe: ir.ForEach, scope: _Scope) -> Doc:
        if fe.source is not None:
            return {"withParam": self.value(fe.source, scope)}
        return {"withItems": [lit.value for lit in fe.items]}

    # ------------------------------------------------------------------ values

    @staticmethod
    def output_ref(info: _Info, output: str) -> str:
        """A reference to a step's output: stdout is ``result`` unless a wrapper exports it."""
        out = info.step.output(output)
        if out is not None and out.source == ir.OutputSource.STDOUT and not info.wrapped:
            return _ph(f"tasks.{info.task}.outputs.result")
        return _ph(f"tasks.{info.task}.outputs.parameters.{output}")

    def value(self, src: ir.ValueSource, scope: _Scope) -> str:
        if isinstance(src, ir.Literal):
            return src.text
        if isinstance(src, ir.StepOutputRef):
            return self.output_ref(scope[src.step], src.output)
        if isinstance(src, ir.WorkflowParamRef):
            return _ph("workflow.parameters." + src.name)
        return _ph("item." + src.key) if src.key else _ph("item")

    def type_of(self, src: ir.ValueSource, scope: _Scope) -> ir.ValueType:
        if isinstance(src, ir.Literal):
            return src.type
        if isinstance(src, ir.StepOutputRef):
            info = scope.get(src.step)
            out = None if info is None else info.step.output(src.output)
            return ir.ValueType.JSON if out is None else out.type
        if isinstance(src, ir.WorkflowParamRef):
            p = self.params.get(src.name)
            return ir.ValueType.JSON if p is None else p.type
        return ir.ValueType.JSON

    def artifact_from(self, ref: ir.StepArtifactRef, scope: _Scope, step: ir.Step) -> str:
        info = scope[ref.step]
        if info.mapped:
            raise self.unsupported(
                step.name, "consuming an output artifact of a mapped step",
                f"step {ref.step!r} fans out; Argo does not aggregate the artifacts of a fan-out")
        return _ph(f"tasks.{info.task}.outputs.artifacts.{ref.artifact}")

    def compare(self, cond: ir.Condition, op: ir.CompareOp,
                resolve: Callable[[ir.ValueSource], tuple[str, ir.ValueType]]) -> str:
        """``left op right`` for Argo's ``when``; strings single-quoted, numbers bare.

        An ordering (``>``, ``<``, ...) of two run-time values (step outputs, parameters;
        no literal) is emitted bare, so govaluate compares them as numbers, as the other
        engines do when both sides are numbers: quoted, ``'10' > '9'`` would be false.
        """
        sides = [(src, *resolve(src)) for src in (cond.left, cond.right)]
        literals = [t for src, _, t in sides if isinstance(src, ir.Literal)]
        types = literals or [t for _, _, t in sides]
        ordering = op not in (ir.CompareOp.EQ, ir.CompareOp.NE)
        if all(t in _NUMERIC for t in types) or (ordering and not literals):
            return f"{sides[0][1]} {op.value} {sides[1][1]}"
        left, right = (_quote(text, escape=isinstance(src, ir.Literal)) for src, text, _ in sides)
        return f"{left} {op.value} {right}"

    def when(self, step: ir.Step, scope: _Scope) -> str:
        assert step.when is not None
        w = step.when
        op = w.condition.op if w.expect else w.condition.op.negated()
        return self.compare(w.condition, op,
                            lambda src: (self.value(src, scope), self.type_of(src, scope)))

    def depends(self, step: ir.Step, scope: _Scope) -> str:
        if step.depends is not None:
            return self.depends_expr(step.depends, scope, top=True)
        return " && ".join(self.term(d.step, d.condition, scope) for d in step.dependencies)

    def depends_expr(self, expr: ir.DependsExpr, scope: _Scope, *, top: bool) -> str:
        if isinstance(expr, ir.DependsTerm):
            return self.term(expr.step, expr.condition, scope)
        if isinstance(expr, ir.DependsNot):
            return "!" + self.depends_expr(expr.term, scope, top=False)
        joiner = " && " if isinstance(expr, ir.DependsAll) else " || "
        parts = [self.depends_expr(t, scope, top=False) for t in expr.terms]
        text = joiner.join(parts)
        return text if top or len(parts) < 2 else f"({text})"

    @staticmethod
    def term(step: str, cond: ir.EdgeCondition, scope: _Scope) -> str:
        name = scope[step].task
        if cond == ir.EdgeCondition.SUCCEEDED:
            return name
        if cond == ir.EdgeCondition.COMPLETED:
            return f"({name}.Succeeded || {name}.Failed)"
        if cond == ir.EdgeCondition.ANY:
            return (f"({name}.Succeeded || {name}.Failed || {name}.Errored || {name}.Skipped "
                    f"|| {name}.Omitted)")
        return f"{name}.{_EDGE_SUFFIX[cond]}"

    # ------------------------------------------------------------------ step policies

    def effective(self, step: ir.Step) -> ir.Step:
        """``step`` with the workflow's defaults filled in where it leaves a policy unset."""
        d = self.wf.defaults
        if isinstance(step.body, ir.SubWorkflowSpec) and step.body.steps:
            return step  # a group: its inner steps receive the defaults
        changes: dict[str, Any] = {}
        if step.retry is None and d.retry is not None:
            changes["retry"] = d.retry
        if step.timeout_seconds is None and d.timeout_seconds is not None:
            changes["timeout_seconds"] = d.timeout_seconds
        if step.cache is None and d.cache is not None:
            changes["cache"] = d.cache
        if (step.resources is None and d.resources is not None
                and isinstance(step.body, (ir.ContainerSpec, ir.ScriptSpec))):
            changes["resources"] = d.resources
        return dataclasses.replace(step, **changes) if changes else step

    def check_features(self, step: ir.Step) -> None:
        if step.priority is not None:
            raise self.unsupported(step.name, "step priority", _PRIORITY_DETAIL)
        body = step.body
        if isinstance(body, (ir.ContainerSpec, ir.ScriptSpec)):
            return
        inline = isinstance(body, ir.SubWorkflowSpec) and bool(body.steps)
        what = ("an inline sub-workflow (an Argo DAG template)" if inline else
                "a job step (an Argo resource template)" if isinstance(body, ir.JobSpec) else
                "an external sub-workflow step (an Argo resource template)")
        checks: list[tuple[str, object]] = [
            ("env", step.env), ("resources", step.resources),
            ("volume mounts", step.volume_mounts), ("input artifacts", step.input_artifacts),
            ("output artifacts", step.output_artifacts), ("daemon", step.daemon),
        ]
        if inline:
            checks += [("node selector", step.node_selector), ("tolerations", step.tolerations),
                       ("labels", step.labels), ("timeout", step.timeout_seconds)]
        for feature, value in checks:
            if value:
                raise self.unsupported(step.name, f"{feature} on {what}",
                                       "it runs no container of its own")
        if not inline:
            for o in step.outputs:
                if o.source == ir.OutputSource.PATH:
                    raise self.unsupported(step.name, f"file output {o.name!r} on {what}",
                                           "a resource template reads outputs with "
                                           "json_path or jq only")

    # ------------------------------------------------------------------ step templates

    def step_template(self, step: ir.Step) -> _Call:
        """Register the template running ``step``'s body; returns how to call it."""
        ir_key = _ir_key(step)
        known = self.by_ir.get(ir_key)
        if known is None:
            known = self.by_ir[ir_key] = self.build_step_template(step)
        name, hoisted = known
        params: list[tuple[str, ir.ValueSource]] = [(i.name, i.value) for i in step.inputs]
        params += hoisted
        artifacts = [(a.name, a.source) for a in step.input_artifacts
                     if isinstance(a.source, ir.StepArtifactRef)]
        return _Call(name, params, artifacts)

    def build_step_template(self, step: ir.Step
                            ) -> tuple[str, list[tuple[str, ir.ValueSource]]]:
        """Register a step's template: its name and the parameters standing for the item."""
        body = step.body
        input_names = {i.name for i in step.inputs}
        hoist = _Hoist(step.inputs) if step.foreach is not None else None
        tr = _translator(input_names, hoist)
        main: Doc
        key: str
        if isinstance(body, (ir.ContainerSpec, ir.ScriptSpec)):
            key, main = ("script" if isinstance(body, ir.ScriptSpec) else "container",
                         self.container(step, body, tr))
        elif isinstance(body, ir.JobSpec):
            key, main = "resource", self.job(body, tr)
        elif body.steps:
            key, main = "dag", _dag(self.dag(body.steps), body.steps)
        else:
            key, main = "resource", self.external(step, body)

        cache_key = tr(step.cache.key) if step.cache is not None and step.cache.key else ""
        tmpl: Doc = {}
        if step.labels:
            tmpl["metadata"] = {"labels": _pairs(step.labels)}
        hoisted: list[tuple[str, ir.ValueSource]] = []
        if hoist is not None:
            hoisted = [(name, ir.ItemRef(k)) for k, name in hoist.params.items()]
        params = [*(i.name for i in step.inputs), *(n for n, _ in hoisted)]
        inputs: Doc = {}
        if params:
            inputs["parameters"] = [{"name": n} for n in params]
        if step.input_artifacts:
            arts = []
            for a in step.input_artifacts:
                art: Doc = {"name": a.name, "path": a.path}
                if isinstance(a.source, ir.ArtifactLocation):
                    art.update(self.storage(step, a.source, for_input=True))
                arts.append(art)
            inputs["artifacts"] = arts
        if inputs:
            tmpl["inputs"] = inputs
        outputs = self.outputs(step, body)
        if outputs:
            tmpl["outputs"] = outputs
        tmpl[key] = main
        self.pod_settings(step, tmpl, key)
        if step.parallelism is not None:
            tmpl["parallelism"] = step.parallelism
        if step.timeout_seconds is not None:
            if key in ("container", "script"):
                tmpl["activeDeadlineSeconds"] = str(step.timeout_seconds)
            else:
                tmpl["timeout"] = f"{step.timeout_seconds}s"
        if step.retry is not None:
            tmpl["retryStrategy"] = self.retry_strategy(step, step.retry)
            if key in ("container", "script"):
                patch = _memory_patch(step.retry, step.resources)
                if patch:
                    tmpl["podSpecPatch"] = patch
        if step.cache is not None and step.cache.enabled:
            digest = hashlib.sha256((_json(tmpl) + step.cache.salt).encode()).hexdigest()[:16]
            tmpl["memoize"] = _memoize(step.cache, params, digest, cache_key)
        return self.register(step.template or step.name, tmpl), hoisted

    def container(self, step: ir.Step, body: ir.ContainerSpec | ir.ScriptSpec,
                  tr: Callable[[str], str]) -> Doc:
        c: Doc = {"image": body.image}
        command = list(body.command)
        if not command and isinstance(body, ir.ScriptSpec):
            command = list(_SCRIPT_COMMANDS[body.language])
        if command:
            c["command"] = [tr(x) for x in command]
        if body.args:
            c["args"] = [tr(x) for x in body.args]
        if body.working_dir:
            c["workingDir"] = tr(body.working_dir)
        if body.image_pull_policy:
            c["imagePullPolicy"] = body.image_pull_policy
        if step.env:
            c["env"] = [_env(e, tr) for e in step.env]
        if step.resources is not None:
            res = resource_requirements(step.resources)
            if res:
                c["resources"] = res
        if step.volume_mounts:
            c["volumeMounts"] = [_mount(m) for m in step.volume_mounts]
        if isinstance(body, ir.ScriptSpec):
            c["source"] = tr(body.source)
        return c

    def job(self, body: ir.JobSpec, tr: Callable[[str], str]) -> Doc:
        r: Doc = {"action": body.action.value, "manifest": tr(emit.to_yaml(body.manifest_dict))}
        if body.success_condition:
            r["successCondition"] = body.success_condition
        if body.failure_condition:
            r["failureCondition"] = body.failure_condition
        if body.set_owner_reference:
            r["setOwnerReference"] = True
        return r

    def external(self, step: ir.Step, body: ir.SubWorkflowSpec) -> Doc:
        metadata: Doc = {"generateName": f"{body.name}-"}
        if body.digest:
            metadata["annotations"] = {DIGEST_ANNOTATION: body.digest}
        spec: Doc = {"workflowTemplateRef": {"name": body.name}}
        if step.inputs:
            spec["arguments"] = {"parameters": [{"name": i.name, "value": _param(i.name)}
                                                for i in step.inputs]}
        manifest = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
                    "spec": spec}
        return {
            "action": "create",
            "manifest": emit.to_yaml(manifest),
            "successCondition": "status.phase == Succeeded",
            "failureCondition": "status.phase in (Failed, Error)",
            "setOwnerReference": True,
        }

    def outputs(self, step: ir.Step, body: ir.StepBody) -> Doc:
        out: Doc = {}
        params: list[Doc] = []
        if isinstance(body, ir.SubWorkflowSpec) and body.steps:
            for o in step.outputs:
                p: Doc = {"name": o.name, "valueFrom": {"parameter": self.inner_output(step, o)}}
                if o.global_name:
                    p["globalName"] = o.global_name
                params.append(p)
        else:
            for o in step.outputs:
                if o.source == ir.OutputSource.STDOUT:
                    continue  # Argo's outputs.result; a global stdout goes through a wrapper
                vf_key = {ir.OutputSource.PATH: "path", ir.OutputSource.JSON_PATH: "jsonPath",
                          ir.OutputSource.JQ: "jqFilter"}[o.source]
                p = {"name": o.name, "valueFrom": {vf_key: o.selector}}
                if o.global_name:
                    p["globalName"] = o.global_name
                params.append(p)
        if params:
            out["parameters"] = params
        if step.output_artifacts:
            arts = []
            for a in step.output_artifacts:
                art: Doc = {"name": a.name, "path": a.path}
                if a.global_name:
                    art["globalName"] = a.global_name
                if a.location is not None:
                    art.update(self.storage(step, a.location, for_input=False))
                arts.append(art)
            out["artifacts"] = arts
        return out

    def inner_output(self, step: ir.Step, out: ir.OutputParameter) -> str:
        """The reference an inline sub-workflow's output forwards: the inner step's output."""
        assert isinstance(step.body, ir.SubWorkflowSpec)
        producers = [s for s in step.body.steps if s.output(out.name) is not None]
        if len(producers) != 1:
            raise self.unsupported(
                step.name, f"sub-workflow output {out.name!r}",
                "an inline sub-workflow's output is forwarded from the one inner step that "
                f"declares an output of that name; {len(producers)} inner steps do")
        inner = producers[0]
        info = _Info(inner.name, inner, self.wrapper_kind(inner), inner.foreach is not None)
        return self.output_ref(info, out.name)

    def storage(self, step: ir.Step, loc: ir.ArtifactLocation, *, for_input: bool) -> Doc:
        kind = loc.storage
        if kind == ir.StorageKind.DEFAULT:
            return {}  # the workflow's default artifact repository decides the key
        if kind == ir.StorageKind.LOCAL:
            raise self.unsupported(step.name, "local artifact storage",
                                   "Argo has no local artifact driver; use a volume or a bucket")
        s: Doc = {}
        if kind in (ir.StorageKind.S3, ir.StorageKind.OSS):
            if loc.endpoint:
                s["endpoint"] = loc.endpoint
            s["bucket"] = loc.bucket
            s["key"] = loc.key
            if loc.insecure and kind == ir.StorageKind.S3:
                s["insecure"] = True
            if loc.access_key is not None:
                s["accessKeySecret"] = _secret(loc.access_key)
            if loc.secret_key is not None:
                s["secretKeySecret"] = _secret(loc.secret_key)
        elif kind == ir.StorageKind.GCS:
            s = {"bucket": loc.bucket, "key": loc.key}
            key_secret = loc.secret_key or loc.access_key
            if key_secret is not None:
                s["serviceAccountKeySecret"] = _secret(key_secret)
        elif kind == ir.StorageKind.GIT:
            s = {"repo": loc.url}
            if loc.revision:
                s["revision"] = loc.revision
            if loc.access_key is not None:
                s["usernameSecret"] = _secret(loc.access_key)
            if loc.secret_key is not None:
                s["passwordSecret"] = _secret(loc.secret_key)
            if loc.insecure:
                s["insecureIgnoreHostKey"] = True
        elif kind == ir.StorageKind.HTTP:
            s = {"url": loc.url}
            if loc.access_key is not None and loc.secret_key is not None:
                s["auth"] = {"basicAuth": {"usernameSecret": _secret(loc.access_key),
                                           "passwordSecret": _secret(loc.secret_key)}}
        elif kind == ir.StorageKind.HDFS:
            s = {"path": loc.key}
            if loc.endpoint:
                s["addresses"] = [a.strip() for a in loc.endpoint.split(",") if a.strip()]
        return {kind.value: s}

    def pod_settings(self, step: ir.Step, tmpl: Doc, key: str) -> None:
        if step.node_selector:
            tmpl["nodeSelector"] = _pairs(step.node_selector)
        if step.tolerations:
            tmpl["tolerations"] = [_toleration(t) for t in step.tolerations]
        scratch = [m.name for m in step.volume_mounts if m.name not in self.volumes]
        if scratch:  # couler-out-dir* mounts: per-pod scratch space
            tmpl["volumes"] = [{"name": n, "emptyDir": {}} for n in dict.fromkeys(scratch)]
        if step.daemon and key in ("container", "script"):
            tmpl["daemon"] = True

    def retry_strategy(self, step: ir.Step, r: ir.RetryPolicy) -> Doc:
        rs: Doc = {"limit": str(r.limit)}
        classes = set(r.on)
        # Argo tells a failed exit ("Failed") from the platform's errors ("Error") but sees
        # no log: a user error (a Python ValueError, couler.failures) is a failed exit to it.
        # A policy retrying either retries both; one retrying neither (the default policy
        # retries TRANSIENT) cannot leave user errors out on Argo.
        if ir.FailureClass.USER in classes:
            classes.discard(ir.FailureClass.USER)
            classes.add(ir.FailureClass.TRANSIENT)
        if ir.FailureClass.TRANSIENT in classes:
            classes.discard(ir.FailureClass.OOM)  # an OOM kill is a failure of the step
        expression = ""
        if ir.FailureClass.ANY in classes or classes == {ir.FailureClass.TRANSIENT,
                                                         ir.FailureClass.INFRA}:
            policy = "Always"
        elif classes == {ir.FailureClass.TRANSIENT}:
            policy = "OnFailure"
        elif classes == {ir.FailureClass.INFRA}:
            policy = "OnError"
        else:  # OOM, alone or with INFRA
            policy = "Always"
            clauses = []
            if ir.FailureClass.INFRA in classes:
                clauses.append('lastRetry.status == "Error"')
            clauses.append(_OOM_EXPRESSION)
            expression = " || ".join(clauses)
        rs["retryPolicy"] = policy
        if expression:
            rs["expression"] = expression
        if r.backoff is not None:
            b = r.backoff
            if b.factor != int(b.factor):
                raise self.unsupported(step.name, f"retry back-off factor {b.factor}",
                                       "Argo's back-off factor is an integer")
            backoff: Doc = {"duration": _duration(b.base_seconds), "factor": str(int(b.factor))}
            if b.cap_seconds is not None:
                backoff["cap"] = _duration(b.cap_seconds)
            rs["backoff"] = backoff
        return rs

    # ------------------------------------------------------------------ wrappers

    def loop_wrapper(self, step: ir.Step, call: _Call, scope: _Scope
                     ) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
        """A recursive DAG: run the body, then call itself while the condition holds."""
        loop = step.loop
        assert loop is not None
        taken = {n for n, _ in call.params}
        iteration = _fresh("iteration", taken)
        forward = _Forward(taken)

        def inner(src: ir.ValueSource) -> tuple[str, ir.ValueType]:
            if isinstance(src, ir.StepOutputRef) and src.step == step.name:
                out = step.output(src.output)
                assert out is not None
                if out.source == ir.OutputSource.STDOUT:
                    return "{{tasks.body.outputs.result}}", out.type
                return _ph("tasks.body.outputs.parameters." + out.name), out.type
            if isinstance(src, ir.StepOutputRef):
                name = forward.add("loop-" + src.output, self.value(src, scope))
                return _param(name), self.type_of(src, scope)
            return self.value(src, scope), self.type_of(src, scope)

        condition = self.compare(loop.condition, loop.condition.op, inner)
        when = f"{condition} && {_param(iteration)} < {loop.max_iterations}"
        counter = "inputs.parameters" + _index(iteration)
        pass_params = [{"name": n, "value": _param(n)} for n, _ in call.params]
        pass_arts = [{"name": n, "from": _ph("inputs.artifacts." + n)} for n, _ in call.artifacts]

        def build(name: str) -> Doc:
            body: Doc = {"name": "body", "template": call.name}
            args = _args_doc(pass_params, pass_arts)
            if args:
                body["arguments"] = args
            again_params = [*pass_params,
                            {"name": iteration, "value": _ph(f"=asInt({counter}) + 1")},
                            *({"name": n, "value": _param(n)} for n, _ in forward.params)]
            again: Doc = {"name": "again", "template": name,
                          "arguments": _args_doc(again_params, pass_arts),
                          "depends": "body", "when": when}
            tmpl = _inputs_doc(
                [*(n for n, _ in call.params), iteration, *(n for n, _ in forward.params)],
                [n for n, _ in call.artifacts])
            outputs = _wrapper_outputs(step, _last_of)
            arts = [{"name": a.name, "fromExpression":
                     'tasks.again.status == "Succeeded"'
                     f" ? tasks.again.outputs.artifacts{_index(a.name)}"
                     f" : tasks.body.outputs.artifacts{_index(a.name)}"}
                    for a in step.output_artifacts]
            if arts:
                outputs["artifacts"] = arts
            if outputs:
                tmpl["outputs"] = outputs
            tmpl["dag"] = {"tasks": [body, again]}
            return tmpl

        name = self.register_recursive(f"{call.name}-loop", build)
        params = [(n, self.value(src, scope)) for n, src in call.params]
        params.append((iteration, "1"))
        params += forward.params
        artifacts = [(n, self.artifact_from(ref, scope, step)) for n, ref in call.artifacts]
        return name, params, artifacts

    def map_wrapper(self, step: ir.Step, call: _Call, scope: _Scope
                    ) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]], bool]:
        """A one-task DAG fanning the step out with its own ``parallelism``."""
        fe = step.foreach
        assert fe is not None and fe.parallelism is not None
        taken = {n for n, _ in call.params}
        forward = _Forward(taken)
        outer: list[tuple[str, str]] = []
        inner_params: list[Doc] = []
        for n, src in call.params:
            if isinstance(src, ir.ItemRef):
                inner_params.append({"name": n, "value": self.value(src, scope)})
            else:
                outer.append((n, self.value(src, scope)))
                inner_params.append({"name": n, "value": _param(n)})
        body: Doc = {"name": "body", "template": call.name}
        args = _args_doc(inner_params, [{"name": n, "from": _ph("inputs.artifacts." + n)}
                                        for n, _ in call.artifacts])
        if args:
            body["arguments"] = args
        inner_when = False
        if step.when is not None and any(isinstance(s, ir.ItemRef) for s in
                                         (step.when.condition.left, step.when.condition.right)):
            inner_when = True  # the item is only visible inside the wrapper

            def inner(src: ir.ValueSource) -> tuple[str, ir.ValueType]:
                if isinstance(src, ir.StepOutputRef):
                    name = forward.add("when-" + src.output, self.value(src, scope))
                    return _param(name), self.type_of(src, scope)
                return self.value(src, scope), self.type_of(src, scope)

            w = step.when
            op = w.condition.op if w.expect else w.condition.op.negated()
            body["when"] = self.compare(w.condition, op, inner)
        if isinstance(fe.source, ir.StepOutputRef):
            body["withParam"] = _param(forward.add("items", self.value(fe.source, scope)))
        else:
            body.update(self.fan_out(fe, scope))
        tmpl = _inputs_doc([*(n for n, _ in outer), *(n for n, _ in forward.params)],
                           [n for n, _ in call.artifacts])
        outputs = _wrapper_outputs(step, _param_ref)
        if outputs:
            tmpl["outputs"] = outputs
        tmpl["parallelism"] = fe.parallelism
        tmpl["dag"] = {"tasks": [body]}
        name = self.register(f"{call.name}-map", tmpl)
        artifacts = [(n, self.artifact_from(ref, scope, step)) for n, ref in call.artifacts]
        return name, outer + forward.params, artifacts, inner_when

    def export_wrapper(self, step: ir.Step, call: _Call, scope: _Scope
                       ) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
        """A one-task DAG exporting the step's stdout as a (global) output parameter."""
        pass_params = [{"name": n, "value": _param(n)} for n, _ in call.params]
        pass_arts = [{"name": n, "from": _ph("inputs.artifacts." + n)} for n, _ in call.artifacts]
        body: Doc = {"name": "body", "template": call.name}
        args = _args_doc(pass_params, pass_arts)
        if args:
            body["arguments"] = args
        tmpl = _inputs_doc([n for n, _ in call.params], [n for n, _ in call.artifacts])
        outputs = _wrapper_outputs(step, _param_ref)
        arts = [{"name": a.name, "from": _ph("tasks.body.outputs.artifacts." + a.name)}
                for a in step.output_artifacts]
        if arts:
            outputs["artifacts"] = arts
        if outputs:
            tmpl["outputs"] = outputs
        tmpl["dag"] = {"tasks": [body]}
        name = self.register(f"{call.name}-export", tmpl)
        params = [(n, self.value(src, scope)) for n, src in call.params]
        artifacts = [(n, self.artifact_from(ref, scope, step)) for n, ref in call.artifacts]
        return name, params, artifacts


_PRIORITY_DETAIL = ("Argo removed the template-level priority field (pod priority); "
                    "use a Kubernetes PriorityClass instead")


# --------------------------------------------------------------------------- pieces


def _ir_key(step: ir.Step) -> tuple[Any, ...]:
    """Everything in a step that shapes its template (not its name, wiring or values)."""
    return (
        step.body,
        tuple((i.name, i.value.key if isinstance(i.value, ir.ItemRef) else None)
              for i in step.inputs),
        step.foreach is not None,
        step.outputs,
        tuple((a.name, a.path, a.source if isinstance(a.source, ir.ArtifactLocation) else None)
              for a in step.input_artifacts),
        step.output_artifacts, step.env, step.resources, step.volume_mounts, step.retry,
        step.timeout_seconds, step.cache, step.node_selector, step.tolerations, step.labels,
        step.daemon, step.parallelism,
    )


def _quote(text: str, *, escape: bool) -> str:
    """A single-quoted string for Argo's ``when`` (govaluate); literals get escapes."""
    if escape:
        text = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _inputs_doc(params: Sequence[str], artifacts: Sequence[str]) -> Doc:
    """The start of a wrapper template: ``{"inputs": ...}`` when it has any."""
    inputs: Doc = {}
    if params:
        inputs["parameters"] = [{"name": n} for n in params]
    if artifacts:
        inputs["artifacts"] = [{"name": n} for n in artifacts]
    return {"inputs": inputs} if inputs else {}


def _args_doc(params: Sequence[Doc], artifacts: Sequence[Doc]) -> Doc:
    args: Doc = {}
    if params:
        args["parameters"] = list(params)
    if artifacts:
        args["artifacts"] = list(artifacts)
    return args


def _arguments(params: Sequence[tuple[str, str]], artifacts: Sequence[tuple[str, str]]) -> Doc:
    return _args_doc([{"name": n, "value": v} for n, v in params],
                     [{"name": n, "from": f} for n, f in artifacts])


def _param_ref(out: ir.OutputParameter) -> Doc:
    """The body task's output (over a fan-out, Argo aggregates it into a JSON list)."""
    if out.source == ir.OutputSource.STDOUT:
        return {"parameter": "{{tasks.body.outputs.result}}"}
    return {"parameter": _ph("tasks.body.outputs.parameters." + out.name)}


def _last_of(out: ir.OutputParameter) -> Doc:
    """The output of the last iteration of a loop template."""
    body = ("tasks.body.outputs.result" if out.source == ir.OutputSource.STDOUT
            else "tasks.body.outputs.parameters" + _index(out.name))
    again = "tasks.again.outputs.parameters" + _index(out.name)
    return {"expression": f'tasks.again.status == "Succeeded" ? {again} : {body}'}


def _wrapper_outputs(step: ir.Step, value_from: Callable[[ir.OutputParameter], Doc]) -> Doc:
    params = []
    for o in step.outputs:
        p: Doc = {"name": o.name, "valueFrom": value_from(o)}
        if o.global_name and o.source == ir.OutputSource.STDOUT:
            p["globalName"] = o.global_name  # file outputs are exported by the step's template
        params.append(p)
    return {"parameters": params} if params else {}


def _secret(ref: ir.SecretRef) -> Doc:
    return {"name": ref.name, "key": ref.key}


def _env(e: ir.EnvVar, tr: Callable[[str], str]) -> Doc:
    if e.secret is not None:
        return {"name": e.name, "valueFrom": {"secretKeyRef": _secret(e.secret)}}
    return {"name": e.name, "value": tr(e.value)}


def _mount(m: ir.VolumeMount) -> Doc:
    d: Doc = {"name": m.name, "mountPath": m.mount_path}
    if m.read_only:
        d["readOnly"] = True
    if m.sub_path:
        d["subPath"] = m.sub_path
    return d


def _toleration(t: ir.Toleration) -> Doc:
    d: Doc = {}
    if t.key:
        d["key"] = t.key
    d["operator"] = t.operator or "Equal"
    if t.value:
        d["value"] = t.value
    if t.effect:
        d["effect"] = t.effect
    if t.toleration_seconds is not None:
        d["tolerationSeconds"] = t.toleration_seconds
    return d


def _volume(v: ir.Volume) -> Doc:
    if v.kind == ir.VolumeKind.PVC:
        return {"name": v.name, "persistentVolumeClaim": {"claimName": v.claim_name}}
    if v.kind == ir.VolumeKind.CONFIG_MAP:
        return {"name": v.name, "configMap": {"name": v.claim_name}}
    if v.kind == ir.VolumeKind.SECRET:
        return {"name": v.name, "secret": {"secretName": v.claim_name}}
    return {"name": v.name, "emptyDir": {"sizeLimit": v.size} if v.size else {}}


def _claim_template(v: ir.Volume) -> Doc:
    spec: Doc = {"accessModes": list(v.access_modes) or ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": v.size}}}
    if v.storage_class:
        spec["storageClassName"] = v.storage_class
    return {"metadata": {"name": v.name}, "spec": spec}


def _memoize(cache: ir.CachePolicy, params: Sequence[str], digest: str, user_key: str) -> Doc:
    """Argo ``memoize`` for a cache policy.

    Without a key of the user's, the key is the template's content digest (salt
    included) and a sha256 of its input values: Argo accepts only
    ``[a-zA-Z0-9-]`` in a key, so the values (``0.1``, JSON, paths) are hashed
    by an expression rather than pasted in.
    """
    if user_key:
        parts = [user_key]
    else:
        parts = [f"couler-{digest}"]
        if params:
            values = ", ".join("inputs.parameters" + _index(p) for p in params)
            parts.append(_ph(f"=sprig.sha256sum(toJson([{values}]))"))
    salt = _NOT_TEMPLATE_CHAR.sub("-", cache.salt).strip("-")
    if salt:
        parts.append(salt)
    return {
        "key": "-".join(parts),
        "maxAge": f"{cache.max_age_seconds}s" if cache.max_age_seconds else "",
        "cache": {"configMap": {"name": cache.name or DEFAULT_CACHE}},
    }


def _memory_patch(r: ir.RetryPolicy, res: ir.Resources | None) -> str:
    """A ``podSpecPatch`` raising the main container's memory on each retry, or ``""``."""
    if r.memory_factor is None or res is None or not (res.memory_limit or res.memory_request):
        return ""  # nothing to multiply
    factor = Decimal(str(r.memory_factor))
    ceiling = parse_quantity(r.memory_ceiling) if r.memory_ceiling else None

    def series(quantity: str) -> list[int]:
        base = parse_quantity(quantity)
        top = Decimal(_MAX_QUANTITY) if ceiling is None else max(ceiling, base)
        values = []
        value = base
        for _ in range(r.limit + 1):
            values.append(int(min(value, top).to_integral_value(ROUND_CEILING)))
            value *= factor
        return values

    resources: Doc = {}
    limits = series(res.memory_limit) if res.memory_limit else []
    requests = series(res.memory_request) if res.memory_request else []
    if limits and requests:
        requests = [min(a, b) for a, b in zip(requests, limits, strict=True)]
    if limits:
        resources["limits"] = {"memory": _by_retry(limits)}
    if requests:
        resources["requests"] = {"memory": _by_retry(requests)}
    return json.dumps({"containers": [{"name": "main", "resources": resources}]},
                      separators=(",", ":"))


def _by_retry(values: list[int]) -> str:
    """An Argo expression picking ``values[retries]`` (constant tail folded)."""
    last = len(values) - 1
    while last > 0 and values[last - 1] == values[last]:
        last -= 1
    listed = "[" + ", ".join(str(v) for v in values[: last + 1]) + "]"
    if last == len(values) - 1:
        return _ph(f"={listed}[sprig.int(retries)]")
    return _ph(f"={listed}[sprig.min(sprig.int(retries), {last})]")
