"""Validation of the IR: every problem found, each named by workflow, step and field.

:func:`find_issues` returns all problems; :func:`validate` raises
:class:`couler.errors.ValidationError` carrying all of them. Checks: names that
engines reject (DNS-1123), duplicates, dangling references, cycles, data flow
without an explicit edge, type mismatches between an output and the input it
feeds, placeholders naming unknown inputs, and malformed policies.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation

from couler.alloc import gc_paused
from couler.errors import Issue, ValidationError
from couler.ir.model import (
    SIMPLE_JSON_STRING,
    TUNE_BEST_PARAMS,
    TUNE_BEST_VALUE,
    ArtifactLocation,
    Condition,
    ContainerSpec,
    DependsAll,
    DependsAny,
    DependsExpr,
    DependsNot,
    DependsTerm,
    EdgeCondition,
    EnvVar,
    ForEach,
    ItemRef,
    JobSpec,
    Literal,
    OutputSource,
    Parameter,
    Resources,
    RetryPolicy,
    ScriptSpec,
    SecretRef,
    Step,
    StepArtifactRef,
    StepOutputRef,
    SubWorkflowSpec,
    Tune,
    TuneKind,
    TuneParam,
    TuneSampler,
    ValueSource,
    ValueType,
    VolumeKind,
    Workflow,
    WorkflowParamRef,
    assignable,
)

__all__ = ["check_parameters", "find_issues", "parse_quantity", "validate"]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
NATS_SUBJECT = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")
PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)

MAX_STEP_NAME = 63
# A tune step's name, with the suffixes of the steps its rewrite for static engines adds
# ("-tell-NNN"), stays a valid step name.
MAX_TUNE_STEP_NAME = MAX_STEP_NAME - 10
MAX_TUNE_TRIALS = 10_000
# CronWorkflow names become CronJob-like object names, which Kubernetes caps at 52.
MAX_WORKFLOW_NAME = 52

_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "2Gi", "1e3") into a number.

    Raises:
        ValueError: if ``text`` is not a quantity.
    """
    match = QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. '500m', '2Gi')")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as e:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"{text!r} is not a number") from e
    if not suffix:
        return value
    if suffix in _SUFFIX:  # before the exponent case: "Ei" is a suffix, not e+"i"
        return value * _SUFFIX[suffix]
    try:
        return value * (Decimal(10) ** int(suffix[1:]))
    except ArithmeticError as e:  # decimal.Overflow, e.g. "1e999999999"
        raise ValueError(f"{text!r} is out of range") from e


def validate(workflow: Workflow) -> None:
    """Raise :class:`ValidationError` listing every problem in ``workflow``."""
    issues = find_issues(workflow)
    if issues:
        raise ValidationError(issues)


def check_parameters(workflow: Workflow, values: Mapping[str, str]) -> None:
    """Check run-time parameter values (text, as given on a command line) against the
    workflow's declared parameters; raise :class:`ValidationError` listing every problem.

    An unknown name, a value that does not parse as the declared type (int, float, bool
    ``true``/``false``, JSON, a JSON list), a value outside the declared ``enum``, and a
    parameter without a default that was not given are problems.
    """
    declared = {p.name: p for p in workflow.parameters}
    issues: list[Issue] = []

    def problem(name: str, message: str) -> None:
        issues.append(Issue(workflow.name, "", f"parameters.{name}", message))

    for name, text in values.items():
        param = declared.get(name)
        if param is None:
            known = ", ".join(sorted(declared)) or "none"
            problem(name, f"no such parameter (the workflow declares: {known})")
            continue
        why = _type_problem(param.type, text)
        if why:
            problem(name, f"{text!r} is not a valid {param.type.value}: {why}")
        elif param.enum and text not in {lit.text for lit in param.enum}:
            allowed = ", ".join(lit.text for lit in param.enum)
            problem(name, f"{text!r} is not one of the allowed values ({allowed})")
    for name, param in declared.items():
        if param.default is None and name not in values:
            problem(name, f"has no default; give a value (e.g. -p {name}=VALUE)")
    if issues:
        raise ValidationError(issues)


def _type_problem(kind: ValueType, text: str) -> str:
    """Why ``text`` is not a value of type ``kind`` ("" when it is)."""
    try:
        if kind is ValueType.INT:
            int(text)
        elif kind is ValueType.FLOAT:
            float(text)
        elif kind is ValueType.BOOL:
            if text.lower() not in ("true", "false"):
                return "expected true or false"
        elif kind is ValueType.JSON:
            json.loads(text)
        elif kind is ValueType.LIST and not isinstance(json.loads(text), list):
            return "expected a JSON list, e.g. [1, 2]"
    except ValueError as e:
        return str(e)
    return ""


def find_issues(workflow: Workflow) -> list[Issue]:
    """Every problem in ``workflow``; empty when it is valid."""
    with gc_paused():
        return _Checker(workflow).run()


class _Checker:
    def __init__(self, workflow: Workflow) -> None:
        self.wf = workflow
        self.issues: list[Issue] = []
        self.volumes = {v.name for v in workflow.volumes}

    def add(self, step: str, field: str, message: str) -> None:
        self.issues.append(Issue(self.wf.name, step, field, message))

    # ------------------------------------------------------------------ workflow level

    def run(self) -> list[Issue]:
        wf = self.wf
        if not wf.name:
            self.add("", "name", "a workflow needs a name")
        elif len(wf.name) > MAX_WORKFLOW_NAME or not DNS_LABEL.match(wf.name):
            self.add("", "name", _dns_message(wf.name, MAX_WORKFLOW_NAME))
        if not wf.steps:
            self.add("", "steps", "a workflow needs at least one step")
        if wf.tenant and not DNS_LABEL.match(wf.tenant):
            self.add("", "tenant", _dns_message(wf.tenant, 63))
        self.check_parameters(wf.parameters)
        self.check_labels("", "labels", wf.labels, values=True)
        self.check_labels("", "annotations", wf.annotations, values=False)
        self.check_labels("", "node_selector", wf.node_selector, values=True)
        seen: set[str] = set()
        for v in wf.volumes:
            if v.name in seen:
                self.add("", "volumes", f"volume {v.name!r} is declared twice")
            seen.add(v.name)
            if not DNS_LABEL.match(v.name):
                self.add("", "volumes", f"volume name: {_dns_message(v.name, 63)}")
            if (
                v.kind in (VolumeKind.PVC, VolumeKind.CONFIG_MAP, VolumeKind.SECRET)
                and not v.claim_name
            ):
                self.add(
                    "", "volumes", f"volume {v.name!r} of kind {v.kind.value} needs claim_name"
                )
            if v.kind == VolumeKind.CLAIM_TEMPLATE:
                self.check_quantity("", f"volumes.{v.name}.size", v.size, required=True)
        if wf.schedule is not None:
            fields = wf.schedule.schedule.split()
            if not (len(fields) in (5, 6) or wf.schedule.schedule.startswith("@")):
                self.add(
                    "",
                    "schedule.schedule",
                    f"{wf.schedule.schedule!r} is not a cron expression of 5 fields",
                )
        for t in wf.triggers:
            if not _subject_ok(t.subject):
                self.add("", "triggers.subject", f"{t.subject!r} is not a valid subject")
        for name in ("timeout_seconds", "ttl_seconds", "parallelism"):
            self.check_positive("", name, getattr(wf, name))
        d = wf.defaults
        self.check_retry("", "defaults.retry", d.retry)
        self.check_positive("", "defaults.timeout_seconds", d.timeout_seconds)
        self.check_resources("", "defaults.resources", d.resources)
        for secret in wf.image_pull_secrets:
            if not DNS_SUBDOMAIN.match(secret):
                self.add("", "image_pull_secrets", f"{secret!r} is not a valid secret name")

        self.check_scope(wf.steps)
        for i, hook in enumerate(wf.exit_hooks):
            if not hook.steps:
                self.add("", f"exit_hooks[{i}]", "an exit hook needs at least one step")
            self.check_scope(hook.steps)
        return self.issues

    def check_parameters(self, params: Sequence[Parameter]) -> None:
        seen: set[str] = set()
        for p in params:
            field = f"parameters.{p.name}"
            if p.name in seen:
                self.add("", field, "parameter is declared twice")
            seen.add(p.name)
            if not PARAM_NAME.match(p.name):
                self.add("", field, f"{p.name!r} is not a valid parameter name")
            for lit in (p.default, *p.enum):
                if lit is not None and not self.literal_ok("", field, lit):
                    continue
                if lit is not None and not assignable(lit.type, p.type):
                    self.add("", field, f"value {lit.json} is not of type {p.type.value}")

    def literal_ok(self, step: str, field: str, lit: Literal) -> bool:
        if SIMPLE_JSON_STRING.fullmatch(lit.json):  # valid; a regex is 5x cheaper to ask
            return True
        try:
            json.loads(lit.json)
        except ValueError:
            self.add(step, field, f"{lit.json!r} is not valid JSON")
            return False
        return True

    # ------------------------------------------------------------------ graph

    def check_scope(self, steps: Sequence[Step]) -> None:
        by_name: dict[str, Step] = {}
        for s in steps:
            if s.name in by_name:
                self.add(s.name, "name", "step name is used twice")
            by_name[s.name] = s
        for s in steps:
            self.check_step(s, by_name)
        self.check_cycles(steps, by_name)

    def check_edge(self, s: Step, field: str, upstream: str, condition: EdgeCondition,
                   scope: dict[str, Step]) -> None:
        """An item-counting condition (any succeeded / all failed) needs a map upstream."""
        if condition not in (EdgeCondition.ANY_SUCCEEDED, EdgeCondition.ALL_FAILED):
            return
        up = scope.get(upstream)
        if up is not None and up.foreach is None:
            self.add(s.name, field, f"condition {condition.value!r} on {upstream!r} needs a map "
                     "step (it counts the items); use 'succeeded_only' or 'failed' for a "
                     "single step")

    def check_cycles(self, steps: Sequence[Step], by_name: dict[str, Step]) -> None:
        indegree = {s.name: 0 for s in steps}
        children: dict[str, list[str]] = {s.name: [] for s in steps}
        for s in steps:
            for d in {d.step for d in s.dependencies}:
                if d in by_name and d != s.name:
                    indegree[s.name] += 1
                    children[d].append(s.name)
        ready = [n for n, k in indegree.items() if k == 0]
        done = 0
        while ready:
            n = ready.pop()
            done += 1
            for c in children[n]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    ready.append(c)
        if done < len(indegree):
            stuck = sorted(n for n, k in indegree.items() if k > 0)
            cycle = _find_cycle(stuck, by_name)
            for name in cycle:
                self.add(
                    name, "dependencies", "dependency cycle: " + " -> ".join([*cycle, cycle[0]])
                )

    # ------------------------------------------------------------------ one step

    def check_step(self, s: Step, scope: dict[str, Step]) -> None:
        name = s.name
        if not name:
            self.add("", "name", "a step needs a name")
        elif len(name) > MAX_STEP_NAME or not DNS_LABEL.match(name):
            self.add(name, "name", _dns_message(name, MAX_STEP_NAME))
        deps: dict[str, str] = {}
        for d in s.dependencies:
            if d.step == name:
                self.add(name, "dependencies", "a step cannot depend on itself")
            elif d.step not in scope:
                self.add(name, "dependencies", f"depends on unknown step {d.step!r}")
            if d.step in deps:
                self.add(name, "dependencies", f"dependency on {d.step!r} is listed twice")
            deps[d.step] = d.condition.value
            self.check_edge(s, "dependencies", d.step, d.condition, scope)
        if s.depends is not None:
            for term in _terms(s.depends):
                if term.step not in deps:
                    self.add(
                        name,
                        "depends",
                        f"expression names {term.step!r}, which is not in dependencies",
                    )
                self.check_edge(s, "depends", term.step, term.condition, scope)

        self.check_body(s, scope)
        self.check_io(s, scope, set(deps))
        if s.when is not None:
            self.check_condition(s, "when", s.when.condition, scope, set(deps), self_ok=False)
        if s.foreach is not None:
            self.check_foreach(s, s.foreach, scope, set(deps))
        if s.tune is not None:
            self.check_tune(s, s.tune)
        if s.loop is not None:
            if s.foreach is not None:
                self.add(
                    name, "loop", "a step cannot both loop and map; wrap one in a sub-workflow"
                )
            if s.loop.max_iterations < 1:
                self.add(name, "loop.max_iterations", "must be at least 1")
            self.check_condition(
                s, "loop.condition", s.loop.condition, scope, set(deps), self_ok=True
            )
        self.check_retry(name, "retry", s.retry)
        self.check_positive(name, "timeout_seconds", s.timeout_seconds)
        self.check_positive(name, "parallelism", s.parallelism)
        self.check_resources(name, "resources", s.resources)
        if s.cache is not None:
            self.check_positive(name, "cache.max_age_seconds", s.cache.max_age_seconds)
        self.check_labels(name, "node_selector", s.node_selector, values=True)
        self.check_labels(name, "labels", s.labels, values=True)
        for m in s.volume_mounts:
            if m.name not in self.volumes and not m.name.startswith("couler-out-dir"):
                self.add(name, "volume_mounts", f"mounts unknown volume {m.name!r}")
            if not m.mount_path.startswith("/"):
                self.add(name, "volume_mounts", f"mount path {m.mount_path!r} is not absolute")

    def check_body(self, s: Step, scope: dict[str, Step]) -> None:
        b = s.body
        if isinstance(b, (ContainerSpec, ScriptSpec)):
            if not b.image:
                self.add(s.name, "image", "a container or script step needs an image")
            self.check_text(s, "command", b.command)
            self.check_text(s, "args", b.args)
            self.check_text(s, "working_dir", (b.working_dir,))
            if isinstance(b, ScriptSpec) and not b.source.strip():
                self.add(s.name, "source", "a script step needs source code")
        elif isinstance(b, JobSpec):
            try:
                manifest = json.loads(b.manifest)
            except ValueError:
                self.add(s.name, "manifest", "the job manifest is not valid JSON")
            else:
                if not isinstance(manifest, dict):
                    self.add(s.name, "manifest", "the job manifest must be an object")
                else:
                    for key in ("apiVersion", "kind"):
                        if not manifest.get(key):
                            self.add(s.name, f"manifest.{key}", "the job manifest needs this field")
        elif isinstance(b, SubWorkflowSpec):
            if not b.steps and not DNS_LABEL.match(b.name):
                self.add(s.name, "body.name", _dns_message(b.name, MAX_WORKFLOW_NAME))
            if b.steps:
                self.check_scope(b.steps)
        for i, e in enumerate(s.env):
            self.check_env(s, i, e)

    def check_env(self, s: Step, i: int, e: EnvVar) -> None:
        if not ENV_NAME.match(e.name):
            self.add(
                s.name, f"env[{i}].name", f"{e.name!r} is not a valid environment variable name"
            )
        if e.secret is not None:
            if e.value:
                self.add(s.name, f"env.{e.name}", "set a value or a secret reference, not both")
            self.check_secret(s.name, f"env.{e.name}.secret", e.secret)
        else:
            self.check_text(s, f"env.{e.name}", (e.value,))

    def check_secret(self, step: str, field: str, ref: SecretRef) -> None:
        if not DNS_SUBDOMAIN.match(ref.name):
            self.add(step, field, f"{ref.name!r} is not a valid secret name")
        if not SECRET_KEY.match(ref.key):
            self.add(step, field, f"{ref.key!r} is not a valid secret key")

    def check_text(self, s: Step, field: str, texts: Iterable[str]) -> None:
        inputs: set[str] | None = None
        for text in texts:
            if "{{" not in text:  # no placeholder (most texts; a 100k-step chain has 300k)
                continue
            for ref in PLACEHOLDER.findall(text):
                if ref.startswith("inputs."):
                    target = ref.removeprefix("inputs.")
                    if inputs is None:
                        inputs = {i.name for i in s.inputs}
                    if target not in inputs:
                        self.add(
                            s.name, field, f"placeholder {{{{{ref}}}}} names no input of the step"
                        )
                elif ref == "item" or ref.startswith("item."):
                    if s.tune is not None:
                        key = ref.removeprefix("item").removeprefix(".")
                        if s.tune.param(key) is None:
                            self.add(s.name, field, f"placeholder {{{{{ref}}}}} names no "
                                     "parameter of the tune space; use {{item.NAME}}")
                    elif s.foreach is None:
                        self.add(s.name, field, f"placeholder {{{{{ref}}}}} is used outside a map")
                elif ref not in ("workflow.name", "workflow.uid", "workflow.status"):
                    self.add(
                        s.name,
                        field,
                        f"unknown placeholder {{{{{ref}}}}}; use "
                        "{{inputs.NAME}}, {{item}}, {{item.KEY}} or {{workflow.name}}",
                    )

    def check_io(self, s: Step, scope: dict[str, Step], deps: set[str]) -> None:
        seen: set[str] = set()
        for inp in s.inputs:
            field = f"inputs.{inp.name}"
            if inp.name in seen:
                self.add(s.name, field, "input is declared twice")
            seen.add(inp.name)
            if not PARAM_NAME.match(inp.name):
                self.add(s.name, field, f"{inp.name!r} is not a valid parameter name")
            source_type = self.check_source(s, field, inp.value, scope, deps, self_ok=False)
            if source_type is not None and not assignable(source_type, inp.type):
                self.add(
                    s.name,
                    field,
                    f"type mismatch: a {source_type.value} value feeds an input of type "
                    f"{inp.type.value}",
                )
        seen.clear()
        is_job = isinstance(s.body, JobSpec)
        for out in s.outputs:
            field = f"outputs.{out.name}"
            if out.name in seen:
                self.add(s.name, field, "output is declared twice")
            seen.add(out.name)
            if not PARAM_NAME.match(out.name):
                self.add(s.name, field, f"{out.name!r} is not a valid parameter name")
            if isinstance(s.body, SubWorkflowSpec) and s.body.steps:
                self.check_forwarded_output(s, s.body, field, out.name, out.type)
                continue
            if out.source == OutputSource.PATH and not out.selector.startswith("/"):
                self.add(s.name, field, "an output read from a file needs an absolute path")
            if out.source in (OutputSource.JSON_PATH, OutputSource.JQ):
                if not is_job:
                    self.add(s.name, field, f"{out.source.value} outputs are only for job steps")
                if not out.selector:
                    self.add(s.name, field, f"a {out.source.value} output needs a selector")
            if out.source == OutputSource.STDOUT and not isinstance(
                s.body, (ContainerSpec, ScriptSpec)
            ):
                self.add(s.name, field, "stdout outputs are only for container and script steps")
        seen.clear()
        for a in s.input_artifacts:
            field = f"input_artifacts.{a.name}"
            if a.name in seen:
                self.add(s.name, field, "artifact is declared twice")
            seen.add(a.name)
            if not a.path.startswith("/"):
                self.add(s.name, field, "artifact path must be absolute")
            if isinstance(a.source, StepArtifactRef):
                self.check_step_ref(s, field, a.source.step, scope, deps, self_ok=False)
                up = scope.get(a.source.step)
                if up is not None and not any(
                    o.name == a.source.artifact for o in up.output_artifacts
                ):
                    self.add(
                        s.name,
                        field,
                        f"step {a.source.step!r} has no output artifact {a.source.artifact!r}",
                    )
            else:
                self.check_location(s.name, field, a.source)
        seen.clear()
        for oa in s.output_artifacts:
            field = f"output_artifacts.{oa.name}"
            if oa.name in seen:
                self.add(s.name, field, "artifact is declared twice")
            seen.add(oa.name)
            if not oa.path.startswith("/"):
                self.add(s.name, field, "artifact path must be absolute")
            if oa.location is not None:
                self.check_location(s.name, field, oa.location)

    def check_forwarded_output(
        self, s: Step, body: SubWorkflowSpec, field: str, name: str, type_: ValueType
    ) -> None:
        """An inline sub-workflow's output is the same-named output of exactly one inner step."""
        producers = [inner for inner in body.steps if inner.output(name) is not None]
        if len(producers) != 1:
            self.add(
                s.name,
                field,
                f"a sub-workflow output is forwarded from the inner step that declares "
                f"{name!r}; {len(producers)} inner steps do",
            )
            return
        inner_out = producers[0].output(name)
        if inner_out is not None and not assignable(inner_out.type, type_):
            self.add(
                s.name,
                field,
                f"type mismatch: inner step {producers[0].name!r} produces a "
                f"{inner_out.type.value} value for an output of type {type_.value}",
            )

    def check_location(self, step: str, field: str, loc: ArtifactLocation) -> None:
        for attr in ("access_key", "secret_key"):
            ref = getattr(loc, attr)
            if ref is not None:
                self.check_secret(step, f"{field}.{attr}", ref)
        if loc.storage.value in ("s3", "oss", "gcs") and not loc.bucket:
            self.add(step, field, f"a {loc.storage.value} artifact needs a bucket")
        if loc.storage.value in ("git", "http") and not loc.url:
            self.add(step, field, f"a {loc.storage.value} artifact needs a url")

    def check_step_ref(
        self,
        s: Step,
        field: str,
        target: str,
        scope: dict[str, Step],
        deps: set[str],
        *,
        self_ok: bool,
    ) -> bool:
        if target == s.name and self_ok:
            return True
        if target not in scope:
            self.add(s.name, field, f"refers to unknown step {target!r}")
            return False
        if target not in deps:
            self.add(
                s.name,
                field,
                f"reads step {target!r} but does not depend on it; add it to dependencies",
            )
        return True

    def check_source(
        self,
        s: Step,
        field: str,
        src: ValueSource,
        scope: dict[str, Step],
        deps: set[str],
        *,
        self_ok: bool,
    ) -> ValueType | None:
        if isinstance(src, Literal):
            return src.type if self.literal_ok(s.name, field, src) else None
        if isinstance(src, StepOutputRef):
            if not self.check_step_ref(s, field, src.step, scope, deps, self_ok=self_ok):
                return None
            up = s if src.step == s.name else scope[src.step]
            out = up.output(src.output)
            if out is None:
                self.add(s.name, field, f"step {src.step!r} has no output {src.output!r}")
                return None
            return out.type
        if isinstance(src, WorkflowParamRef):
            p = self.wf.parameter(src.name)
            if p is None:
                self.add(s.name, field, f"refers to unknown workflow parameter {src.name!r}")
                return None
            return p.type
        if isinstance(src, ItemRef):
            if s.tune is not None:
                param = s.tune.param(src.key)
                if param is None:
                    self.add(s.name, field, f"reads trial parameter {src.key!r}, which is not "
                             f"in the tune space {[p.name for p in s.tune.space]}")
                    return None
                return param.value_type
            if s.foreach is None:
                self.add(s.name, field, "uses the map item but the step has no map")
                return None
            items = s.foreach.items
            if src.key and items:
                for lit in items:
                    v = lit.value
                    if not isinstance(v, dict) or src.key not in v:
                        self.add(s.name, field, f"map item {lit.json} has no key {src.key!r}")
                        return None
            return ValueType.JSON
        return None  # pragma: no cover - exhaustive over ValueSource

    def check_condition(
        self,
        s: Step,
        field: str,
        cond: Condition,
        scope: dict[str, Step],
        deps: set[str],
        *,
        self_ok: bool,
    ) -> None:
        for side in ("left", "right"):
            self.check_source(
                s, f"{field}.{side}", getattr(cond, side), scope, deps, self_ok=self_ok
            )

    def check_foreach(self, s: Step, fe: ForEach, scope: dict[str, Step], deps: set[str]) -> None:
        if bool(fe.items) == (fe.source is not None):
            self.add(s.name, "foreach", "a map needs either static items or a source, not both")
        if fe.parallelism is not None and fe.parallelism < 1:
            self.add(s.name, "foreach.parallelism", "must be at least 1")
        for lit in fe.items:
            self.literal_ok(s.name, "foreach.items", lit)
        if fe.source is not None:
            t = self.check_source(s, "foreach.source", fe.source, scope, deps, self_ok=False)
            if t is not None and t not in (ValueType.LIST, ValueType.JSON):
                self.add(s.name, "foreach.source", f"a map needs a list, not a {t.value} value")

    def check_tune(self, s: Step, t: Tune) -> None:
        """A tune step: a container or script step, neither mapped nor looping, a space of
        well-formed parameters, its objective one of its outputs, positive counts."""
        name = s.name
        if len(name) > MAX_TUNE_STEP_NAME:
            self.add(name, "name", f"a tune step's name has at most {MAX_TUNE_STEP_NAME} "
                     "characters (engines that run the study in steps add suffixes)")
        if not isinstance(s.body, (ContainerSpec, ScriptSpec)):
            self.add(name, "tune", f"only container and script steps can be tuned, not a "
                     f"{s.body.KIND} step")
        if s.foreach is not None or s.loop is not None:
            self.add(name, "tune", "a tune step cannot also map or loop; its trials are its "
                     "executions")
        if s.daemon:
            self.add(name, "tune", "a daemon step cannot be tuned")
        if not t.space:
            self.add(name, "tune.space", "the search space is empty; give at least one "
                     "parameter (uniform, loguniform, int_range or choice)")
        seen: set[str] = set()
        for p in t.space:
            field = f"tune.space.{p.name}"
            if p.name in seen:
                self.add(name, field, "parameter is declared twice")
            seen.add(p.name)
            if not PARAM_NAME.match(p.name):
                self.add(name, field, f"{p.name!r} is not a valid parameter name")
            if p.name in (TUNE_BEST_PARAMS, TUNE_BEST_VALUE):
                self.add(name, field, f"{p.name!r} is the name of a tune output; rename the "
                         "parameter")
            self.check_tune_param(name, field, p)
        outputs = {o.name: o for o in s.outputs}
        out = outputs.get(t.objective)
        if out is None:
            self.add(name, "tune.objective", f"the objective {t.objective!r} is not an output "
                     f"of the step; its outputs: {sorted(outputs)}")
        elif out.type not in (ValueType.FLOAT, ValueType.INT, ValueType.STRING, ValueType.JSON):
            self.add(name, "tune.objective", f"the objective {t.objective!r} must be a number, "
                     f"not a {out.type.value} value")
        if t.trials < 1:
            self.add(name, "tune.trials", f"must be at least 1, got {t.trials}")
        elif t.trials > MAX_TUNE_TRIALS:
            self.add(name, "tune.trials", f"at most {MAX_TUNE_TRIALS}, got {t.trials}")
        if t.parallel < 1:
            self.add(name, "tune.parallel", f"must be at least 1, got {t.parallel}")
        if t.sampler is TuneSampler.GRID:
            for p in t.space:
                if p.kind in (TuneKind.UNIFORM, TuneKind.LOGUNIFORM) and p.step is None:
                    self.add(name, f"tune.space.{p.name}", "the grid sampler needs a discrete "
                             "space: give this parameter a step, or use choice()")
        if t.sampler is TuneSampler.CMAES and all(p.kind is TuneKind.CHOICE for p in t.space):
            self.add(name, "tune.sampler", "CMA-ES needs at least one numeric parameter")
        if t.storage is not None:
            self.check_secret(name, "tune.storage", t.storage)
        if t.seed is not None and t.seed < 0:
            self.add(name, "tune.seed", f"must not be negative, got {t.seed}")

    def check_tune_param(self, step: str, field: str, p: TuneParam) -> None:
        if p.kind is TuneKind.CHOICE:
            if not p.choices:
                self.add(step, field, "choice() needs at least one value")
            for lit in p.choices:
                self.literal_ok(step, field, lit)
            if len({c.json for c in p.choices}) != len(p.choices):
                self.add(step, field, "choice() lists a value twice")
            return
        if p.choices:
            self.add(step, field, f"a {p.kind.value} parameter has no choices")
        if not (math.isfinite(p.low) and math.isfinite(p.high)):
            self.add(step, field, "bounds must be finite numbers")
            return
        if p.low > p.high:
            self.add(step, field, f"bad bounds: low {p.low:g} is above high {p.high:g}")
        if (p.kind is TuneKind.LOGUNIFORM or p.log) and p.low <= 0:
            self.add(step, field, f"bad bounds: a log-scale range needs low > 0, got "
                     f"{p.low:g}")
        if p.kind is TuneKind.INT:
            if p.low != int(p.low) or p.high != int(p.high):
                self.add(step, field, f"bad bounds: an int range needs integer bounds, got "
                         f"{p.low:g}..{p.high:g}")
            if p.step is not None and (p.step != int(p.step) or p.step < 1):
                self.add(step, field, f"an int range's step must be a positive integer, got "
                         f"{p.step:g}")
            if p.log and p.step not in (None, 1):
                self.add(step, field, "a log-scale int range cannot have a step")
        elif p.step is not None:
            if p.kind is TuneKind.LOGUNIFORM:
                self.add(step, field, "a loguniform parameter cannot have a step")
            elif not (p.step > 0):
                self.add(step, field, f"step must be positive, got {p.step:g}")
        if p.log and p.kind is not TuneKind.INT:
            self.add(step, field, "log applies to int ranges; use loguniform for floats")

    # ------------------------------------------------------------------ policies

    def check_retry(self, step: str, field: str, r: RetryPolicy | None) -> None:
        if r is None:
            return
        if r.limit < 0:
            self.add(step, f"{field}.limit", "must not be negative")
        if not r.on:
            self.add(step, f"{field}.on", "name at least one failure class to retry")
        b = r.backoff
        if b is not None:
            if b.base_seconds <= 0:
                self.add(step, f"{field}.backoff.base_seconds", "must be positive")
            if b.factor < 1:
                self.add(step, f"{field}.backoff.factor", "must be at least 1")
            if b.cap_seconds is not None and b.cap_seconds < b.base_seconds:
                self.add(step, f"{field}.backoff.cap_seconds", "must not be below base_seconds")
        if r.memory_factor is not None and r.memory_factor <= 1:
            self.add(step, f"{field}.memory_factor", "must be greater than 1")
        if r.memory_ceiling:
            self.check_quantity(step, f"{field}.memory_ceiling", r.memory_ceiling)

    def check_resources(self, step: str, field: str, r: Resources | None) -> None:
        if r is None:
            return
        for kind in ("cpu", "memory"):
            req = getattr(r, f"{kind}_request")
            lim = getattr(r, f"{kind}_limit")
            ok_req = self.check_quantity(step, f"{field}.{kind}_request", req)
            ok_lim = self.check_quantity(step, f"{field}.{kind}_limit", lim)
            if req and lim and ok_req and ok_lim and parse_quantity(req) > parse_quantity(lim):
                self.add(step, f"{field}.{kind}_request", f"request {req} exceeds limit {lim}")
        if r.gpu < 0:
            self.add(step, f"{field}.gpu", "must not be negative")

    def check_quantity(self, step: str, field: str, text: str, *, required: bool = False) -> bool:
        if not text:
            if required:
                self.add(step, field, "a quantity is required")
            return not required
        try:
            if parse_quantity(text) < 0:
                self.add(step, field, f"{text!r} is negative")
                return False
        except ValueError as e:
            self.add(step, field, str(e))
            return False
        return True

    def check_positive(self, step: str, field: str, value: int | None) -> None:
        if value is not None and value <= 0:
            self.add(step, field, f"must be positive, got {value}")

    def check_labels(
        self, step: str, field: str, items: Iterable[tuple[str, str]], *, values: bool
    ) -> None:
        for key, value in items:
            if not LABEL_KEY.match(key) or len(key.split("/")[-1]) > 63:
                self.add(step, field, f"{key!r} is not a valid key")
            if values and (len(value) > 63 or not LABEL_VALUE.match(value)):
                self.add(step, field, f"{value!r} is not a valid value for {key!r}")


def _terms(expr: DependsExpr) -> Iterable[DependsTerm]:
    if isinstance(expr, DependsTerm):
        yield expr
    elif isinstance(expr, (DependsAll, DependsAny)):
        for t in expr.terms:
            yield from _terms(t)
    elif isinstance(expr, DependsNot):
        yield from _terms(expr.term)


def _find_cycle(stuck: list[str], by_name: dict[str, Step]) -> list[str]:
    """One cycle among the steps Kahn's algorithm could not order."""
    stuck_set = set(stuck)
    start = stuck[0]
    path: list[str] = []
    index: dict[str, int] = {}
    node = start
    while node not in index:
        index[node] = len(path)
        path.append(node)
        nxt = sorted(
            d.step for d in by_name[node].dependencies if d.step in stuck_set and d.step != node
        )  # self-edges: reported apart
        if not nxt:  # pragma: no cover - every stuck node has a stuck predecessor
            return path
        node = nxt[0]
    cycle = path[index[node] :]
    cycle.reverse()  # report in execution order: upstream -> downstream
    return cycle


def _subject_ok(subject: str) -> bool:
    """A NATS subject to subscribe to: dot-separated tokens, each a name, ``*`` (one token)
    or, last, ``>`` (the rest)."""
    tokens = subject.split(".")
    return all(t == "*" or (t == ">" and i == len(tokens) - 1) or NATS_SUBJECT.match(t)
               for i, t in enumerate(tokens))


def _dns_message(name: str, limit: int) -> str:
    return (
        f"{name!r} is not a valid name: use at most {limit} lowercase letters, digits and "
        "'-', starting and ending with a letter or digit (DNS-1123)"
    )
