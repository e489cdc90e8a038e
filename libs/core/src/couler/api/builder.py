"""The workflow builder behind the Couler-compatible API.

There is no module-level mutable state. The builder in use lives in a
:class:`contextvars.ContextVar`: ``with couler.workflow("name") as wf:`` sets
it and restores the previous one on exit (also when the body raises); scripts
without an explicit scope get an implicit builder, created lazily in the same
ContextVar and discarded by :func:`couler.run`. Threads and asyncio tasks
therefore never share a builder.

While steps are being added they are mutable *drafts* (a container step gains
a ``result`` output only when something reads it; implicit DAG data passing
is resolved at the end). :meth:`WorkflowBuilder.to_ir` freezes the drafts into
an immutable, validated :class:`couler.ir.Workflow`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from couler import ir
from couler.alloc import GrowthRelief, gc_paused
from couler.api import naming
from couler.api.depends import depends_steps
from couler.api.handles import (
    ArtifactOutput,
    ItemHandle,
    LocationDraft,
    ParameterOutput,
    Secret,
    SecretMaterial,
    StepOutput,
    WorkflowParam,
)
from couler.api.interpolate import Marks, find_mark, has_mark, texts
from couler.errors import UserError

if TYPE_CHECKING:
    from couler.api.secrets import SecretSpec

__all__ = [
    "CaptureSession",
    "Defaults",
    "EnvDraft",
    "InputArtifactDraft",
    "OutputArtifactDraft",
    "StepDraft",
    "WorkflowBuilder",
    "active_capture",
    "current_builder",
    "discard_implicit_builder",
    "get_defaults",
    "set_defaults",
]


# --------------------------------------------------------------------------- context state


@dataclass(frozen=True)
class Defaults:
    """Process-context defaults set by :func:`couler.config_defaults`."""

    name_salter: Callable[[str], str] | None = None
    service_account: str = ""


class CaptureSession:
    """Records the workflows a program builds instead of submitting them."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.workflows: list[ir.Workflow] = []
        # Per recorded workflow, in memory only: what a local run needs to resolve
        # the secrets the program created with their values.
        self.secrets: list[list[SecretMaterial]] = []
        self.finished: list[WorkflowBuilder] = []

    def record(self, builder: WorkflowBuilder) -> ir.Workflow:
        """Freeze ``builder`` and keep its workflow (and, apart, its secret material)."""
        wf = builder.to_ir()
        builder.recorded = True
        self.workflows.append(wf)
        self.secrets.append(builder.secret_material())
        return wf


_BUILDER: ContextVar[WorkflowBuilder | None] = ContextVar("couler_builder", default=None)
_CAPTURE: ContextVar[CaptureSession | None] = ContextVar("couler_capture", default=None)
_DEFAULTS: ContextVar[Defaults | None] = ContextVar("couler_defaults", default=None)


def current_builder() -> WorkflowBuilder:
    """The builder in use: the innermost ``with couler.workflow(...)``, else the implicit one.

    The implicit builder is created on first use and kept in a ContextVar (so
    each thread and each asyncio task has its own).
    """
    builder = _BUILDER.get()
    if builder is None:
        builder = WorkflowBuilder(implicit=True)
        _BUILDER.set(builder)
    return builder


def peek_builder() -> WorkflowBuilder | None:
    """The builder in use, without creating an implicit one."""
    return _BUILDER.get()


def discard_implicit_builder() -> None:
    """Forget the implicit builder of this context (``run()`` does this after submitting)."""
    builder = _BUILDER.get()
    if builder is not None and builder.implicit:
        _BUILDER.set(None)


def active_capture() -> CaptureSession | None:
    """The capture session in effect, if the program runs under :mod:`couler.api.capture`."""
    return _CAPTURE.get()


def get_defaults() -> Defaults:
    """The defaults set by :func:`couler.config_defaults` in this context."""
    return _DEFAULTS.get() or Defaults()


def set_defaults(defaults: Defaults) -> None:
    """Replace the defaults of this context."""
    _DEFAULTS.set(defaults)


@contextlib.contextmanager
def capture_context(path: str | None) -> Iterator[CaptureSession]:
    """Run the body in capture mode with a fresh implicit builder; restore everything after.

    Defaults set by the captured code (``config_defaults``) do not leak out either.
    """
    session = CaptureSession(path)
    cap_token = _CAPTURE.set(session)
    builder_token = _BUILDER.set(None)
    defaults_token = _DEFAULTS.set(_DEFAULTS.get())
    try:
        yield session
    finally:
        _DEFAULTS.reset(defaults_token)
        _BUILDER.reset(builder_token)
        _CAPTURE.reset(cap_token)


def finish_capture(session: CaptureSession) -> list[ir.Workflow]:
    """At the end of a captured program: record what was built but never run.

    The secret material of each workflow is in ``session.secrets`` afterwards.
    """
    if not session.workflows:
        pending = [b for b in session.finished if not b.recorded and b.has_steps]
        implicit = _BUILDER.get()
        if implicit is not None and implicit.implicit and implicit.has_steps:
            pending.append(implicit)
        for builder in pending:
            session.record(builder)
    return list(session.workflows)


# --------------------------------------------------------------------------- drafts


@dataclass
class EnvDraft:
    """An environment variable of a draft: a value, or one key of a secret."""

    name: str
    value: str = ""
    secret: Secret | None = None
    key: str = ""

    def freeze(self) -> ir.EnvVar:
        if self.secret is not None:
            return ir.EnvVar(self.name, secret=self.secret.ref(self.key))
        return ir.EnvVar(self.name, self.value)


@dataclass(frozen=True)
class OutputArtifactDraft:
    """An output artifact of a draft; its location's credentials resolve at freeze time."""

    name: str
    path: str
    location: LocationDraft | None = None
    is_global: bool = False

    def freeze(self, step: str) -> ir.OutputArtifact:
        loc = self.location.freeze() if self.location is not None else None
        return ir.OutputArtifact(self.name, self.path, location=loc,
                                 global_name=global_name(step, self.name) if self.is_global else "")


@dataclass(frozen=True)
class InputArtifactDraft:
    """An input artifact of a draft: another step's output or a stored location."""

    name: str
    path: str
    source: ir.StepArtifactRef | LocationDraft

    def freeze(self) -> ir.InputArtifact:
        source = self.source.freeze() if isinstance(self.source, LocationDraft) else self.source
        return ir.InputArtifact(self.name, self.path, source)


def global_name(step: str, output: str) -> str:
    """The workflow-level name of a step's global output."""
    return f"{step}-{output}"


class _Scope:
    """An ordered list of steps that share a namespace of dependencies."""

    def __init__(self, kind: str, *, chain: bool) -> None:
        self.kind = kind
        self.chain = chain
        self.drafts: list[StepDraft] = []
        self.by_name: dict[str, StepDraft] = {}
        self.prev: list[StepDraft] = []
        # the last when() of this scope: (its condition's upstream steps, the steps it
        # started after, the steps it ended with); a when() on the same upstream right
        # after it is its sibling, as in the open-source SDK (one step group per condition)
        self.last_when: tuple[tuple[int, ...], list[StepDraft], list[StepDraft]] | None = None

    def __repr__(self) -> str:
        return f"_Scope({self.kind!r}, {len(self.drafts)} steps)"


@dataclass(eq=False)
class StepDraft:
    """A step while the workflow is being built (mutable; frozen by ``to_ir``)."""

    builder: WorkflowBuilder
    base_name: str
    template: str
    body: ir.ContainerSpec | ir.ScriptSpec | ir.JobSpec | None
    explicit_name: bool = False
    name: str = ""
    scope: _Scope | None = None
    args: list[str] = field(default_factory=list)
    inputs: list[ir.InputParameter] = field(default_factory=list)
    next_index: int = 0
    outputs: list[ir.OutputParameter] = field(default_factory=list)
    has_stdout: bool = False
    stdout_used: bool = False
    stdout_type: ir.ValueType = ir.ValueType.STRING
    global_outputs: set[str] = field(default_factory=set)
    input_artifacts: list[InputArtifactDraft] = field(default_factory=list)
    output_artifacts: list[OutputArtifactDraft] = field(default_factory=list)
    env: list[EnvDraft] = field(default_factory=list)
    deps: dict[str, ir.EdgeCondition] = field(default_factory=dict)
    depends: ir.DependsExpr | None = None
    implicit_from: list[str] = field(default_factory=list)
    when: ir.When | None = None
    foreach: ir.ForEach | None = None
    loop: ir.Loop | None = None
    retry: ir.RetryPolicy | None = None
    timeout_seconds: int | None = None
    resources: ir.Resources | None = None
    cache: ir.CachePolicy | None = None
    priority: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[ir.Toleration] = field(default_factory=list)
    volume_mounts: list[ir.VolumeMount] = field(default_factory=list)
    daemon: bool = False
    parallelism: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tune: ir.Tune | None = None
    children: _Scope | None = None
    handles: list[StepOutput] = field(default_factory=list)
    stdout_of: list[StepDraft] = field(default_factory=list)

    def add_dep(self, upstream: str,
                condition: ir.EdgeCondition = ir.EdgeCondition.SUCCEEDED) -> None:
        """Add an edge from ``upstream`` (kept once; never to the step itself)."""
        if upstream and upstream != self.name and upstream not in self.deps:
            self.deps[upstream] = condition

    def new_input_name(self) -> str:
        """The next ``para-<template>-<i>`` input name."""
        name = f"para-{self.template}-{self.next_index}"
        self.next_index += 1
        return name

    def is_stdout(self, output: str) -> bool:
        """Whether ``output`` is the step's standard output (not a declared output)."""
        return output == "result" and all(o.name != "result" for o in self.outputs)

    def stdout_handle(self) -> ParameterOutput:
        """The handle of the step's standard output ``result``."""
        return ParameterOutput(self, "result", stdout=True)

    def content_key(self) -> tuple[Any, ...]:
        """Everything that defines what the step does, for duplicate detection."""
        return (
            self.template, self.body, tuple(self.args), tuple(self.inputs), tuple(self.outputs),
            self.has_stdout, tuple(sorted(self.global_outputs)), tuple(self.input_artifacts),
            tuple(self.output_artifacts),
            tuple((e.name, e.value, id(e.secret), e.key) for e in self.env), self.retry,
            self.timeout_seconds, self.resources, self.cache, self.priority,
            tuple(sorted(self.node_selector.items())), tuple(self.tolerations),
            tuple(self.volume_mounts), self.daemon, self.parallelism,
            tuple(sorted(self.labels.items())),
        )


@dataclass(frozen=True)
class _WhenCtx:
    when: ir.When
    upstream: tuple[StepDraft, ...]
    stdout_of: tuple[StepDraft, ...]


class _Frame:
    """Collects the steps created (or reused) while a callable runs."""

    def __init__(self) -> None:
        self.touched: list[StepDraft] = []
        self.created: list[StepDraft] = []


@dataclass
class WorkflowConfig:
    """Workflow-level settings (mutable while building)."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    schedule: ir.CronSchedule | None = None
    timeout_seconds: int | None = None
    ttl_seconds: int | None = None
    service_account: str = ""
    volumes: list[ir.Volume] = field(default_factory=list)
    tolerations: list[ir.Toleration] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    dns: ir.DnsConfig | None = None
    security_context: ir.SecurityContext | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    parallelism: int | None = None
    defaults: ir.StepDefaults = field(default_factory=ir.StepDefaults)
    cluster_config_file: str | None = None


# --------------------------------------------------------------------------- the builder


def _scratch_volumes(declared: Sequence[ir.Volume], steps: Sequence[ir.Step],
                     hooks: Sequence[ir.ExitHook]) -> tuple[ir.Volume, ...]:
    """An empty directory for each volume a step mounts that the workflow does not declare
    (the open-source SDK added an ``emptyDir`` for it): a scratch volume of the pod."""
    names = {v.name for v in declared}
    every = [*steps, *(s for hook in hooks for s in hook.steps)]
    scratch = dict.fromkeys(m.name for s in ir.all_steps(every) for m in s.volume_mounts
                            if m.name not in names and not m.name.startswith("couler-out-dir"))
    return tuple(ir.Volume(name, kind=ir.VolumeKind.EMPTY_DIR) for name in scratch)


class WorkflowBuilder:
    """Builds one workflow; the object ``with couler.workflow(...) as wf`` gives you.

    Use it as a context manager to make it the current builder; every API
    call inside the block adds to it. :meth:`to_ir` returns the validated IR,
    :meth:`to_yaml` the Argo document as YAML text.
    """

    def __init__(self, name: str | None = None, *, implicit: bool = False) -> None:
        self._name = naming.sanitize(name, limit=naming.MAX_WORKFLOW_NAME, fallback="workflow") \
            if name else None
        self.implicit = implicit
        self.recorded = False
        self.config = WorkflowConfig()
        self._top = _Scope("main", chain=True)
        self._scopes: list[_Scope] = [self._top]
        self._exit_scopes: dict[ir.RunStatus, _Scope] = {}
        self._names = naming.NameRegistry()
        self._relief = GrowthRelief()
        self._step_count = 0
        self._dag_mode = False
        self._dedupe_depth = 0
        self._frames: list[_Frame] = []
        self._when: _WhenCtx | None = None
        self._maps: list[object] = []
        self._parameters: dict[str, ir.Parameter] = {}
        self._secrets: list[Secret] = []
        self._secret_values: dict[int, dict[str, str]] = {}
        self._tokens: list[Token[WorkflowBuilder | None]] = []
        self._salted: dict[str, str] = {}
        self.marks = Marks()  # handles formatted into text (couler.api.interpolate)

    # ------------------------------------------------------------------ scope management

    def __enter__(self) -> WorkflowBuilder:
        self._tokens.append(_BUILDER.set(self))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _BUILDER.reset(self._tokens.pop())
        session = _CAPTURE.get()
        if exc_type is None and session is not None and self not in session.finished:
            session.finished.append(self)

    def __repr__(self) -> str:
        return f"WorkflowBuilder(name={self.workflow_name()!r}, steps={len(self._top.drafts)})"

    @property
    def name(self) -> str:
        """The workflow's name (see :meth:`workflow_name`)."""
        return self.workflow_name()

    def set_name(self, name: str) -> None:
        """Set the workflow's name (sanitised to DNS-1123)."""
        self._name = naming.sanitize(name, limit=naming.MAX_WORKFLOW_NAME, fallback="workflow")

    def workflow_name(self) -> str:
        """The given name, else the entry program's file name, else ``workflow``; salted if set."""
        base = self._name or _derived_name() or "workflow"
        salter = get_defaults().name_salter
        if salter is None:
            return base
        if base not in self._salted:
            self._salted[base] = naming.sanitize(str(salter(base)), limit=naming.MAX_WORKFLOW_NAME,
                                                 fallback="workflow")
        return self._salted[base]

    @property
    def has_steps(self) -> bool:
        """Whether any step was added."""
        return bool(self._top.drafts) or any(s.drafts for s in self._exit_scopes.values())

    @property
    def dag_mode(self) -> bool:
        """Whether ``dag()``/``set_dependencies()`` switched the workflow to explicit edges."""
        return self._dag_mode

    @property
    def scope(self) -> _Scope:
        """The scope new steps go into."""
        return self._scopes[-1]

    def enter_dag_mode(self) -> None:
        """Top-level steps get only explicit edges from now on."""
        self._dag_mode = True

    @contextlib.contextmanager
    def in_scope(self, scope: _Scope) -> Iterator[_Scope]:
        """Add steps to ``scope`` inside the block."""
        self._scopes.append(scope)
        try:
            yield scope
        finally:
            self._scopes.pop()

    def new_scope(self, kind: str) -> _Scope:
        """A fresh scope whose steps run one after another."""
        return _Scope(kind, chain=True)

    def exit_scope(self, status: ir.RunStatus) -> _Scope:
        """The scope of the exit hook run on ``status`` (created on first use)."""
        scope = self._exit_scopes.get(status)
        if scope is None:
            scope = self._exit_scopes[status] = _Scope(f"exit-{status.value}", chain=True)
        return scope

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """If the block raises, remove the steps it added and restore the scopes' state."""
        scopes: list[_Scope] = []
        for s in (self._top, *self._exit_scopes.values(), *self._scopes):
            if s not in scopes:
                scopes.append(s)
        snapshot = [(s, len(s.drafts), list(s.prev)) for s in scopes]
        exit_keys = set(self._exit_scopes)
        names_mark = self._names.mark()
        try:
            yield
        except BaseException:
            for s, count, prev in snapshot:
                for d in s.drafts[count:]:
                    s.by_name.pop(d.name, None)
                del s.drafts[count:]
                s.prev = prev
            for key in [k for k in self._exit_scopes if k not in exit_keys]:
                del self._exit_scopes[key]
            self._names.rollback(names_mark)
            raise

    @contextlib.contextmanager
    def capture(self) -> Iterator[_Frame]:
        """Collect the steps created or reused inside the block."""
        frame = _Frame()
        self._frames.append(frame)
        try:
            yield frame
        finally:
            self._frames.remove(frame)

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """No enclosing ``when`` or capture applies inside the block (restored after)."""
        frames, when, maps = self._frames, self._when, self._maps
        self._frames, self._when, self._maps = [], None, []
        try:
            yield
        finally:
            self._frames, self._when, self._maps = frames, when, maps

    @contextlib.contextmanager
    def paused_capture(self) -> Iterator[None]:
        """Steps created inside the block are not collected by enclosing captures."""
        frames = self._frames
        self._frames = []
        try:
            yield
        finally:
            self._frames = frames

    @contextlib.contextmanager
    def when_context(self, when: ir.When, upstream: tuple[StepDraft, ...],
                     stdout_of: tuple[StepDraft, ...]) -> Iterator[None]:
        """Every step added inside the block carries ``when`` and depends on ``upstream``."""
        if self._when is not None:
            raise UserError(f"workflow {self.workflow_name()!r}: when() inside the body of another "
                            "when() is not supported; combine the conditions into one step's "
                            "output or use set_dependencies with a depends expression")
        self._when = _WhenCtx(when, upstream, stdout_of)
        try:
            yield
        finally:
            self._when = None

    @contextlib.contextmanager
    def dedupe_context(self) -> Iterator[None]:
        """Inside ``dag``/``set_dependencies``: a repeated explicit step_name reuses the step."""
        self._dedupe_depth += 1
        try:
            yield
        finally:
            self._dedupe_depth -= 1

    @contextlib.contextmanager
    def map_context(self, token: object) -> Iterator[None]:
        """Item handles of the map ``token`` are valid inside the block."""
        self._maps.append(token)
        try:
            yield
        finally:
            self._maps.remove(token)

    # ------------------------------------------------------------------ steps

    def add_step(self, draft: StepDraft) -> StepDraft:
        """Add ``draft`` to the current scope (or return the step it duplicates)."""
        scope = self.scope
        if draft.explicit_name and self._dedupe_depth > 0:
            existing = scope.by_name.get(draft.base_name)
            if existing is not None:
                if existing.content_key() != draft.content_key():
                    raise UserError(
                        f"workflow {self.workflow_name()!r}: step {draft.base_name!r} is defined "
                        "twice with different images, commands, arguments or options; give one "
                        "of them another step_name")
                for upstream, condition in draft.deps.items():
                    existing.add_dep(upstream, condition)
                self._touch(existing, created=False)
                return existing
        draft.name = self._names.take(draft.base_name)
        draft.scope = scope
        for up in draft.stdout_of:
            up.stdout_used = True
        draft.stdout_of = []
        if self._when is not None:
            draft.when = self._when.when
            for up in self._when.upstream:
                if up.scope is not scope:
                    raise UserError(
                        f"workflow {self.workflow_name()!r}, step {draft.name!r}: the when() "
                        f"condition reads step {up.name!r}, which is outside this step's scope")
                draft.add_dep(up.name)
            for up in self._when.stdout_of:
                up.stdout_used = True
        if scope.chain and not (scope is self._top and self._dag_mode):
            for prev in scope.prev:
                draft.add_dep(prev.name)
            scope.prev = [draft]
        scope.drafts.append(draft)
        scope.by_name[draft.name] = draft
        self._step_count += 1
        self._relief.grew(self._step_count)
        self._touch(draft, created=True)
        return draft

    def _touch(self, draft: StepDraft, *, created: bool) -> None:
        for frame in self._frames:
            if draft not in frame.touched:
                frame.touched.append(draft)
            if created:
                frame.created.append(draft)

    def find_step(self, name: str) -> StepDraft | None:
        """The step of the current scope called ``name`` (sanitised like step names)."""
        scope = self.scope
        return scope.by_name.get(name) or scope.by_name.get(naming.sanitize(name))

    def step_outputs(self, name: str) -> list[StepOutput]:
        """The outputs of the step called ``name``: the list its ``run_*`` call returned.

        The current scope is searched first, then every other scope of the
        workflow (main steps, exit handlers, concurrent sub-tasks).

        Raises:
            UserError: if no step has that name.
        """
        wanted = {name, naming.sanitize(name)}
        for scope in self._all_scopes():
            for candidate in wanted:
                draft = scope.by_name.get(candidate)
                if draft is not None:
                    return list(draft.handles)
        known = sorted({d.name for s in self._all_scopes() for d in s.drafts})
        raise UserError(f"workflow {self.workflow_name()!r}: get_step_output: no step called "
                        f"{name!r} has been defined yet; defined steps: {known}")

    def _all_scopes(self) -> list[_Scope]:
        """Every scope, innermost current one first, then the rest in definition order."""
        ordered: list[_Scope] = []
        pending = [*reversed(self._scopes), self._top, *self._exit_scopes.values()]
        while pending:
            scope = pending.pop(0)
            if scope in ordered:
                continue
            ordered.append(scope)
            pending.extend(d.children for d in scope.drafts if d.children is not None)
        return ordered

    def reserve_name(self, base: str) -> str:
        """A unique step name for a step built by the API itself (sub-workflows)."""
        return self._names.take(base)

    # ------------------------------------------------------------------ values

    def unwrap(self, value: object) -> object:
        """Resolve the SDK's conveniences: call a callable, take the first of a list of outputs."""
        for _ in range(16):
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], StepOutput):
                value = value[0]
            elif callable(value) and not isinstance(value, type):
                with self.paused_capture():
                    value = value()
            else:
                break
        return value

    def operand(self, value: object, *, what: str) -> tuple[ir.ValueSource, ir.ValueType,
                                                            StepDraft | None]:
        """The IR value source of an argument or predicate operand.

        Returns the source, its type and the producing step (if another step's output).
        """
        value = self.unwrap(value)
        if isinstance(value, ParameterOutput):
            draft = self.check_output(value, what=what)
            return ir.StepOutputRef(draft.name, value.name), value.type, draft
        if isinstance(value, ArtifactOutput):
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: artifact "
                            f"{value.name!r} of step {value.step_name!r} is a file, not a value")
        if isinstance(value, ItemHandle):
            if value.owner not in self._maps:
                raise UserError(f"workflow {self.workflow_name()!r}: {what}: a map item is used "
                                "outside the function passed to map()")
            return ir.ItemRef(value.key), value.type, None
        if isinstance(value, WorkflowParam):
            if value.builder is not self:
                raise UserError(f"workflow {self.workflow_name()!r}: {what}: parameter "
                                f"{value.name!r} belongs to another workflow")
            return ir.WorkflowParamRef(value.name), value.type, None
        if isinstance(value, Secret):
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: pass secrets with "
                            "secret=..., not as values")
        if value is None:
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: None is not a value")
        try:
            lit = ir.Literal.of(value)
        except (TypeError, ValueError) as e:
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: {value!r} is not a "
                            f"JSON-compatible value ({e})") from e
        return lit, lit.type, None

    def check_output(self, handle: StepOutput, *, what: str) -> StepDraft:
        """The draft behind ``handle``, checked to belong to this workflow and scope."""
        draft = handle.draft
        if draft.builder is not self:
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: output {handle.name!r} "
                            f"belongs to step {draft.name!r} of another workflow")
        if draft.scope is not self.scope:
            raise UserError(f"workflow {self.workflow_name()!r}: {what}: step {draft.name!r} is "
                            "outside the current scope (a concurrent sub-task, exit handler or "
                            "the main steps); its outputs cannot be read here")
        return draft

    # ------------------------------------------------------------------ parameters and secrets

    def add_parameter(self, param: ir.Parameter) -> WorkflowParam:
        """Declare a workflow parameter (again with the same definition is fine)."""
        existing = self._parameters.get(param.name)
        if existing is not None and existing != param:
            raise UserError(f"workflow {self.workflow_name()!r}: parameter {param.name!r} is "
                            f"declared twice with different definitions ({_describe(existing)}"
                            f" and {_describe(param)})")
        self._parameters[param.name] = param
        return WorkflowParam(self, param.name, param.type)

    def parameter_names(self) -> list[str]:
        """The names of the workflow parameters declared so far."""
        return list(self._parameters)

    def parameter(self, name: str) -> WorkflowParam:
        """The handle of the declared workflow parameter ``name``."""
        param = self._parameters.get(name)
        if param is None:
            raise UserError(f"workflow {self.workflow_name()!r}: no parameter {name!r}; "
                            f"declared: {sorted(self._parameters)}")
        return WorkflowParam(self, name, param.type)

    def add_secret(self, spec: SecretSpec) -> Secret:
        """Register a secret (the same data twice gives the same secret)."""
        for secret in self._secrets:
            values = self._secret_values.get(secret.index)
            if (spec.values is not None and values == spec.values
                    and secret.namespace == spec.namespace
                    and spec.name in (None, secret.name)
                    and secret.dry_run == spec.dry_run):
                return secret
            if (spec.values is None and secret.use_existing and secret.name == spec.name
                    and secret.keys == spec.keys):
                return secret
        keys = tuple(spec.values) if spec.values is not None else spec.keys
        secret = Secret(self, len(self._secrets) + 1, spec.name, keys, spec.namespace,
                        dry_run=spec.dry_run, use_existing=spec.values is None,
                        artifact_secret=spec.artifact_secret)
        self._secrets.append(secret)
        if spec.values is not None:
            self._secret_values[secret.index] = dict(spec.values)
        return secret

    def find_secret(self, name: str) -> Secret | None:
        """The registered secret called ``name``."""
        return next((s for s in self._secrets if s.name == name), None)

    def secret(self, name: str) -> Secret:
        """The secret registered as ``name`` (by ``create_secret`` or ``obtain_secret``).

        Raises:
            UserError: if no secret has that name.
        """
        secret = self.find_secret(name)
        if secret is None:
            known = [s.name for s in self._secrets]
            raise UserError(f"workflow {self.workflow_name()!r}: get_secret: no secret called "
                            f"{name!r}; create it first with create_secret or obtain_secret "
                            f"(registered: {known})")
        return secret

    def secret_material(self) -> list[SecretMaterial]:
        """The secrets to create at submit time, values included (never part of the IR)."""
        return [
            SecretMaterial(s.name, s.namespace, self._secret_values.get(s.index, {}),
                           dry_run=s.dry_run, use_existing=s.use_existing, keys=s.keys)
            for s in self._secrets
        ]

    # ------------------------------------------------------------------ freezing

    def to_ir(self) -> ir.Workflow:
        """The workflow as validated IR.

        Raises:
            couler.errors.ValidationError: listing every problem, by step and field.
        """
        self._relief.release()
        with gc_paused():  # freezing and validating allocate many small, acyclic objects
            return self._to_ir()

    def _to_ir(self) -> ir.Workflow:
        cfg = self.config
        steps = self._freeze_scope(self._top)
        hooks = tuple(ir.ExitHook(status, self._freeze_scope(scope))
                      for status, scope in self._exit_scopes.items() if scope.drafts)
        service_account = cfg.service_account or get_defaults().service_account
        wf = ir.Workflow(
            name=self.workflow_name(),
            steps=steps,
            parameters=tuple(self._parameters.values()),
            exit_hooks=hooks,
            schedule=cfg.schedule,
            labels=ir.pairs(cfg.labels),
            annotations=ir.pairs(cfg.annotations),
            tenant=cfg.tenant,
            defaults=cfg.defaults,
            volumes=tuple(cfg.volumes) + _scratch_volumes(cfg.volumes, steps, hooks),
            node_selector=ir.pairs(cfg.node_selector),
            tolerations=tuple(cfg.tolerations),
            service_account=service_account,
            image_pull_secrets=tuple(cfg.image_pull_secrets),
            dns=cfg.dns,
            security_context=cfg.security_context,
            timeout_seconds=cfg.timeout_seconds,
            ttl_seconds=cfg.ttl_seconds,
            parallelism=cfg.parallelism,
        )
        if self.marks:
            self._refuse_marks(wf)
        ir.validate(wf)
        return wf

    def _refuse_marks(self, wf: ir.Workflow) -> None:
        """Refuse a formatted handle left where no engine can fill it in (an image, a name)."""
        for step in ir.all_steps([*wf.steps, *(s for h in wf.exit_hooks for s in h.steps)]):
            field_name = find_mark(step)
            if field_name:
                text = "".join(texts(getattr(step.body, field_name[5:])
                                     if field_name.startswith("body.")
                                     else getattr(step, field_name)))
                raise UserError(
                    f"workflow {wf.name!r}, step {step.name!r}, field {field_name!r}: "
                    f"{self.marks.describe(text)} is formatted into this text, but its value is "
                    "known only when the workflow runs; Couler fills such values in a step's "
                    "args, command and env only -- pass it there, or as an argument")
        rest = "".join(texts(dataclasses.replace(wf, steps=(), exit_hooks=())))
        if has_mark(rest):
            raise UserError(f"workflow {wf.name!r}: {self.marks.describe(rest)} is "
                            "formatted into a workflow setting (a label, annotation or name); "
                            "its value is known only when the workflow runs")

    def to_yaml(self) -> str:
        """The Argo document (``Workflow`` or ``CronWorkflow``) as YAML text."""
        from couler.compilers.argo import to_yaml

        return to_yaml(self.workflow_yaml())

    def workflow_yaml(self) -> dict[str, Any]:
        """The Argo document as a dict, with any cluster-config hooks applied."""
        from couler.argo import compile_builder

        return compile_builder(self)

    def run(self, submitter: object = None) -> object:
        """Submit this workflow (see :func:`couler.run`)."""
        from couler.api.submission import run_builder

        return run_builder(self, submitter)

    def _freeze_scope(self, scope: _Scope) -> tuple[ir.Step, ...]:
        return tuple(self._freeze(d, scope) for d in scope.drafts)

    def _freeze(self, d: StepDraft, scope: _Scope) -> ir.Step:
        inputs = list(d.inputs)
        args = list(d.args)
        in_artifacts = [a.freeze() for a in d.input_artifacts]
        if d.implicit_from:
            self._implicit_inputs(d, scope, inputs, args, in_artifacts)
        outputs: list[ir.OutputParameter] = []
        if d.has_stdout or d.stdout_used:
            outputs.append(ir.OutputParameter("result", ir.OutputSource.STDOUT, type=d.stdout_type))
        outputs.extend(dataclasses.replace(o, global_name=global_name(d.name, o.name))
                       if o.name in d.global_outputs else o for o in d.outputs)
        body: ir.StepBody
        if isinstance(d.body, (ir.ContainerSpec, ir.ScriptSpec)):
            body = dataclasses.replace(d.body, args=tuple(args))
        elif isinstance(d.body, ir.JobSpec):
            body = d.body
        else:
            children = d.children if d.children is not None else _Scope("empty", chain=True)
            body = ir.SubWorkflowSpec(name=d.name, steps=self._freeze_scope(children))
        return ir.Step(
            name=d.name,
            body=body,
            template=d.template,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            input_artifacts=tuple(in_artifacts),
            output_artifacts=tuple(a.freeze(d.name) for a in d.output_artifacts),
            env=tuple(e.freeze() for e in d.env),
            dependencies=tuple(ir.Dependency(n, c) for n, c in d.deps.items()),
            depends=_full_depends(d),
            when=d.when,
            foreach=d.foreach,
            loop=d.loop,
            retry=d.retry,
            timeout_seconds=d.timeout_seconds,
            resources=d.resources,
            cache=d.cache,
            priority=d.priority,
            node_selector=ir.pairs(d.node_selector),
            tolerations=tuple(d.tolerations),
            volume_mounts=tuple(d.volume_mounts),
            daemon=d.daemon,
            parallelism=d.parallelism,
            labels=ir.pairs(d.labels),
            tune=d.tune,
        )

    def _implicit_inputs(self, d: StepDraft, scope: _Scope, inputs: list[ir.InputParameter],
                         args: list[str], in_artifacts: list[ir.InputArtifact]) -> None:
        """DAG data passing: feed the declared outputs of upstream steps into ``d``."""
        index = d.next_index
        fed = {(i.value.step, i.value.output) for i in inputs
               if isinstance(i.value, ir.StepOutputRef)}
        fed_artifacts = {(a.source.step, a.source.artifact) for a in in_artifacts
                         if isinstance(a.source, ir.StepArtifactRef)}
        used_artifact_names = {a.name for a in in_artifacts}
        for upstream_name in d.implicit_from:
            up = scope.by_name.get(upstream_name)
            if up is None:
                continue  # reported by validation as an unknown dependency
            for out in up.outputs:
                if out.source != ir.OutputSource.PATH or (up.name, out.name) in fed:
                    continue
                name = f"para-{d.template}-{index}"
                index += 1
                ref = ir.StepOutputRef(up.name, out.name)
                inputs.append(ir.InputParameter(name, ref, out.type))
                fed.add((up.name, out.name))
                if isinstance(d.body, ir.ContainerSpec):
                    args.append(f"{{{{inputs.{name}}}}}")
            for art in up.output_artifacts:
                if (up.name, art.name) in fed_artifacts:
                    continue
                art_name = art.name
                if art_name in used_artifact_names:
                    art_name = f"{up.name}-{art.name}"
                used_artifact_names.add(art_name)
                in_artifacts.append(ir.InputArtifact(art_name, art.path,
                                                     ir.StepArtifactRef(up.name, art.name)))
                fed_artifacts.add((up.name, art.name))


def _full_depends(d: StepDraft) -> ir.DependsExpr | None:
    """The step's depends expression, AND-ed with the edges it does not mention.

    Edges from data flow (an argument reading another step's output) must
    hold whatever the user's expression says.
    """
    if d.depends is None:
        return None
    named = depends_steps(d.depends)
    missing = [ir.DependsTerm(n, c) for n, c in d.deps.items() if n not in named]
    if not missing:
        return d.depends
    return ir.DependsAll((d.depends, *missing))


def _derived_name() -> str | None:
    """The workflow name implied by the entry program's file name."""
    session = _CAPTURE.get()
    if session is not None and session.path:
        return naming.workflow_name_from_path(session.path)
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str):
        return naming.workflow_name_from_path(path)
    return None


def freeze_mapping(values: Mapping[str, object] | None, *, what: str) -> dict[str, str]:
    """A str -> str dict from a user mapping (values rendered with ``str``)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise UserError(f"{what} must be a mapping of names to values, not {type(values).__name__}")
    return {str(k): str(v) for k, v in values.items()}


def _describe(param: ir.Parameter) -> str:
    """A parameter's definition in a few words, for error messages."""
    default = "no default" if param.default is None else f"default {param.default.json}"
    return f"{param.type.value}, {default}"
