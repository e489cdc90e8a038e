"""The engine-neutral workflow IR.

Every front end (the Python API, natural language, gRPC, events) produces a
:class:`Workflow`; optimizer passes rewrite it; compilers turn it into an
engine's document. The IR is immutable (frozen dataclasses, tuples), has one
canonical JSON form (:func:`couler.ir.to_json`) and a content digest
(:func:`couler.ir.digest`).

Conventions:

* Literal values (parameter defaults, map items, condition operands) are kept
  as canonical JSON text in :class:`Literal`, so they are immutable and
  round-trip exactly through JSON and protobuf.
* String-valued fields of a step (command, args, env values, script source are
  *not* scanned) may contain placeholders ``{{inputs.NAME}}`` naming one of
  the step's input parameters, and ``{{item}}`` / ``{{item.KEY}}`` inside a
  ``map``. Compilers translate them to their engine's syntax.
* Key/value maps (labels, node selectors) are tuples of ``(key, value)``
  pairs, sorted by key; constructors normalise the order.
* Secrets appear only as :class:`SecretRef` (secret name and key), never as
  values.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

Pairs: TypeAlias = tuple[tuple[str, str], ...]

_JSON_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_JSON_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")

__all__ = [
    "TUNE_BEST_PARAMS",
    "TUNE_BEST_VALUE",
    "ArtifactLocation",
    "ArtifactSource",
    "Backoff",
    "CachePolicy",
    "CompareOp",
    "ConcurrencyPolicy",
    "Condition",
    "ContainerSpec",
    "CronSchedule",
    "Dependency",
    "DependsAll",
    "DependsAny",
    "DependsExpr",
    "DependsNot",
    "DependsTerm",
    "DnsConfig",
    "EdgeCondition",
    "EnvVar",
    "EventTrigger",
    "ExitHook",
    "FailureClass",
    "ForEach",
    "InputArtifact",
    "InputParameter",
    "ItemRef",
    "JobAction",
    "JobSpec",
    "Literal",
    "Loop",
    "OutputArtifact",
    "OutputParameter",
    "OutputSource",
    "Pairs",
    "Parameter",
    "Resources",
    "RetryPolicy",
    "RunStatus",
    "SELinuxOptions",
    "ScriptLanguage",
    "ScriptSpec",
    "SecretRef",
    "SecurityContext",
    "Step",
    "StepArtifactRef",
    "StepBody",
    "StepDefaults",
    "StepOutputRef",
    "StorageKind",
    "SubWorkflowSpec",
    "Toleration",
    "Tune",
    "TuneDirection",
    "TuneKind",
    "TuneParam",
    "TunePruner",
    "TuneSampler",
    "ValueSource",
    "ValueType",
    "Volume",
    "VolumeKind",
    "VolumeMount",
    "When",
    "Workflow",
    "WorkflowParamRef",
    "all_steps",
    "assignable",
    "pairs",
    "tune_outputs",
    "type_of",
]

TUNE_BEST_PARAMS = "best_params"  # a tune step's output: the best parameters, a JSON object
TUNE_BEST_VALUE = "best_value"  # a tune step's output: the best objective value


def pairs(mapping: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> Pairs:
    """Normalise a mapping or pair list to sorted ``(key, value)`` tuples."""
    if not mapping:  # None, or empty (most steps': two calls per step captured)
        return ()
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted((str(k), str(v)) for k, v in items))


def _sorted_pairs(obj: object, name: str) -> None:
    value = getattr(obj, name)
    normalised = tuple(sorted((str(k), str(v)) for k, v in value))
    if normalised != value:
        object.__setattr__(obj, name, normalised)


# --------------------------------------------------------------------------- values


class ValueType(enum.StrEnum):
    """Type of a parameter value."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    LIST = "list"
    JSON = "json"


def type_of(value: object) -> ValueType:
    """The IR type of a JSON-compatible Python value."""
    if isinstance(value, bool):
        return ValueType.BOOL
    if isinstance(value, int):
        return ValueType.INT
    if isinstance(value, float):
        return ValueType.FLOAT
    if isinstance(value, str):
        return ValueType.STRING
    if isinstance(value, (list, tuple)):
        return ValueType.LIST
    return ValueType.JSON


def assignable(source: ValueType, target: ValueType) -> bool:
    """Whether a value of type ``source`` may feed an input of type ``target``.

    Strings and JSON accept anything (every value renders as text); an int
    widens to a float; otherwise the types must match.
    """
    if source == target or target in (ValueType.STRING, ValueType.JSON):
        return True
    if source == ValueType.JSON:
        return True  # untyped upstream output: checked at run time
    return source == ValueType.INT and target == ValueType.FLOAT


#: JSON text of a string with nothing escaped: it decodes to the characters between quotes.
SIMPLE_JSON_STRING = re.compile(r'"[^"\\\x00-\x1f]*"')


@dataclass(frozen=True, slots=True)
class Literal:
    """A literal value, stored as canonical JSON text."""

    KIND: ClassVar[str] = "literal"
    json: str

    @classmethod
    def of(cls, value: object) -> Literal:
        """Build a literal from a JSON-compatible Python value."""
        return cls(json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False))

    @property
    def value(self) -> object:
        """The decoded Python value."""
        return json.loads(self.json)

    @property
    def text(self) -> str:
        """The value as the text a command line would see (strings unquoted)."""
        if SIMPLE_JSON_STRING.fullmatch(self.json):  # what json.loads gives, 5x faster
            return self.json[1:-1]
        value = self.value
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return self.json

    @property
    def type(self) -> ValueType:
        """The IR type of the value."""
        # Canonical JSON tells its type by its first characters; decode only otherwise.
        text = self.json
        head = text[:1]
        if head == '"' and text[-1:] == '"':
            return ValueType.STRING
        if head == "[" and text[-1:] == "]":
            return ValueType.LIST
        if text in ("true", "false"):
            return ValueType.BOOL
        if _JSON_INT.fullmatch(text):
            return ValueType.INT
        if _JSON_FLOAT.fullmatch(text):
            return ValueType.FLOAT
        return type_of(self.value)


@dataclass(frozen=True, slots=True)
class StepOutputRef:
    """An output parameter of another step."""

    KIND: ClassVar[str] = "step_output"
    step: str
    output: str


@dataclass(frozen=True, slots=True)
class WorkflowParamRef:
    """A workflow-level parameter."""

    KIND: ClassVar[str] = "workflow_param"
    name: str


@dataclass(frozen=True, slots=True)
class ItemRef:
    """The current item of the enclosing ``map`` (``key`` selects a field)."""

    KIND: ClassVar[str] = "item"
    key: str = ""


ValueSource: TypeAlias = Literal | StepOutputRef | WorkflowParamRef | ItemRef


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A reference to one key of a secret held by the platform, never its value."""

    name: str
    key: str


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True, slots=True)
class Parameter:
    """A workflow-level parameter with an optional default."""

    name: str
    type: ValueType = ValueType.STRING
    default: Literal | None = None
    description: str = ""
    enum: tuple[Literal, ...] = ()


@dataclass(frozen=True, slots=True)
class InputParameter:
    """An input parameter of a step and where its value comes from."""

    name: str
    value: ValueSource
    type: ValueType = ValueType.STRING


class OutputSource(enum.StrEnum):
    """Where a step's output parameter is read from."""

    PATH = "path"  # contents of a file the step writes
    STDOUT = "stdout"  # the step's standard output ("result")
    JSON_PATH = "json_path"  # a JSONPath into a job's resource object
    JQ = "jq"  # a jq filter over a job's resource object


@dataclass(frozen=True, slots=True)
class OutputParameter:
    """An output parameter of a step."""

    name: str
    source: OutputSource = OutputSource.PATH
    selector: str = ""  # the path, JSONPath or jq filter; empty for STDOUT
    type: ValueType = ValueType.STRING
    global_name: str = ""


# --------------------------------------------------------------------------- artifacts


class StorageKind(enum.StrEnum):
    """Kind of artifact storage."""

    DEFAULT = "default"  # the engine's default artifact repository
    LOCAL = "local"
    S3 = "s3"
    OSS = "oss"
    GCS = "gcs"
    HDFS = "hdfs"
    GIT = "git"
    HTTP = "http"


@dataclass(frozen=True, slots=True)
class ArtifactLocation:
    """Where an artifact is stored. Credentials are secret references only."""

    KIND: ClassVar[str] = "location"
    storage: StorageKind = StorageKind.DEFAULT
    endpoint: str = ""
    bucket: str = ""
    key: str = ""
    url: str = ""  # http / git repository URL
    revision: str = ""  # git revision
    insecure: bool = False
    access_key: SecretRef | None = None
    secret_key: SecretRef | None = None


@dataclass(frozen=True, slots=True)
class StepArtifactRef:
    """An output artifact of another step."""

    KIND: ClassVar[str] = "step_artifact"
    step: str
    artifact: str


ArtifactSource: TypeAlias = ArtifactLocation | StepArtifactRef


@dataclass(frozen=True, slots=True)
class InputArtifact:
    """An artifact a step reads, placed at ``path`` before it starts."""

    name: str
    path: str
    source: ArtifactSource


@dataclass(frozen=True, slots=True)
class OutputArtifact:
    """An artifact a step writes at ``path``."""

    name: str
    path: str
    location: ArtifactLocation | None = None
    digest: str = ""  # content digest when known, e.g. "sha256:..."
    global_name: str = ""


# --------------------------------------------------------------------------- control flow


class EdgeCondition(enum.StrEnum):
    """Which outcome of the upstream step lets the downstream step run."""

    SUCCEEDED = "succeeded"  # succeeded, or skipped by its own when (Argo's bare ``depends: A``)
    FAILED = "failed"
    ERRORED = "errored"
    SKIPPED = "skipped"  # skipped by its own when (Argo's Skipped)
    COMPLETED = "completed"  # succeeded or failed
    ANY = "any"  # any terminal state, including skipped and omitted
    SUCCEEDED_ONLY = "succeeded_only"  # ran and succeeded (Argo's ``A.Succeeded``)
    OMITTED = "omitted"  # not run because its own dependencies did not hold (Argo's Omitted)
    ANY_SUCCEEDED = "any_succeeded"  # a map step: at least one item succeeded
    ALL_FAILED = "all_failed"  # a map step: every item failed


@dataclass(frozen=True, slots=True)
class Dependency:
    """An edge from an upstream step."""

    step: str
    condition: EdgeCondition = EdgeCondition.SUCCEEDED


@dataclass(frozen=True, slots=True)
class DependsTerm:
    """One upstream step reaching one outcome (a leaf of a depends expression)."""

    KIND: ClassVar[str] = "term"
    step: str
    condition: EdgeCondition = EdgeCondition.SUCCEEDED


@dataclass(frozen=True, slots=True)
class DependsAll:
    """All of the sub-expressions hold."""

    KIND: ClassVar[str] = "all"
    terms: tuple[DependsExpr, ...]


@dataclass(frozen=True, slots=True)
class DependsAny:
    """At least one of the sub-expressions holds."""

    KIND: ClassVar[str] = "any"
    terms: tuple[DependsExpr, ...]


@dataclass(frozen=True, slots=True)
class DependsNot:
    """The sub-expression does not hold."""

    KIND: ClassVar[str] = "not"
    term: DependsExpr


DependsExpr: TypeAlias = DependsTerm | DependsAll | DependsAny | DependsNot


class CompareOp(enum.StrEnum):
    """Comparison operator of a condition."""

    EQ = "=="
    NE = "!="
    GT = ">"
    LT = "<"
    GE = ">="
    LE = "<="

    def negated(self) -> CompareOp:
        """The operator that holds exactly when this one does not."""
        return _NEGATED[self]


_NEGATED = {
    CompareOp.EQ: CompareOp.NE,
    CompareOp.NE: CompareOp.EQ,
    CompareOp.GT: CompareOp.LE,
    CompareOp.LE: CompareOp.GT,
    CompareOp.LT: CompareOp.GE,
    CompareOp.GE: CompareOp.LT,
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A comparison between two values, e.g. an upstream output and a literal."""

    left: ValueSource
    op: CompareOp
    right: ValueSource


@dataclass(frozen=True, slots=True)
class When:
    """Run the step only when ``condition`` evaluates to ``expect``.

    ``expect=False`` marks the else branch of a ``when``.
    """

    condition: Condition
    expect: bool = True


@dataclass(frozen=True, slots=True)
class ForEach:
    """Fan the step out over static ``items`` or over a list produced upstream."""

    items: tuple[Literal, ...] = ()
    source: StepOutputRef | WorkflowParamRef | None = None
    parallelism: int | None = None


@dataclass(frozen=True, slots=True)
class Loop:
    """Repeat the step while ``condition`` holds, at most ``max_iterations`` runs.

    The condition usually reads the step's own outputs.
    """

    condition: Condition
    max_iterations: int = 100


class RunStatus(enum.StrEnum):
    """Final status of a workflow, for exit hooks."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ERROR = "error"
    ANY = "any"


# --------------------------------------------------------------------------- policies


class FailureClass(enum.StrEnum):
    """Which failures a retry policy retries."""

    TRANSIENT = "transient"  # a timeout, or an unknown non-zero exit seen once
    INFRA = "infra"  # platform errors: pod evicted, node lost, network, DNS
    OOM = "oom"  # killed for exceeding its memory limit
    # Deterministic: the step's own bug (a Python ValueError, the same exit and error
    # twice). Running it again fails the same way, so the default policy never retries it.
    USER = "user"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off between attempts: base * factor**n, capped."""

    base_seconds: float = 1.0
    factor: float = 2.0
    cap_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed attempts are retried."""

    limit: int
    backoff: Backoff | None = None
    on: tuple[FailureClass, ...] = (FailureClass.ANY,)
    memory_factor: float | None = None  # multiply the memory limit on each OOM retry
    memory_ceiling: str = ""  # never escalate beyond this quantity, e.g. "16Gi"


@dataclass(frozen=True, slots=True)
class Resources:
    """Resource requests and limits as Kubernetes quantities ("500m", "2Gi")."""

    cpu_request: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    memory_limit: str = ""
    gpu: int = 0
    gpu_resource: str = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Whether and how a step's result may be reused."""

    enabled: bool = True
    salt: str = ""  # mixed into the content key to force a fresh entry
    max_age_seconds: int | None = None
    key: str = ""  # a user-written key (Argo memoize compatibility)
    name: str = ""  # a cache name (Argo memoize ConfigMap)


@dataclass(frozen=True, slots=True)
class Toleration:
    """A Kubernetes toleration."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class VolumeKind(enum.StrEnum):
    """Kind of volume."""

    PVC = "pvc"  # an existing claim
    CLAIM_TEMPLATE = "claim_template"  # a claim made per workflow
    EMPTY_DIR = "empty_dir"
    CONFIG_MAP = "config_map"
    SECRET = "secret"


@dataclass(frozen=True, slots=True)
class Volume:
    """A workflow-level volume."""

    name: str
    kind: VolumeKind = VolumeKind.PVC
    claim_name: str = ""  # PVC claim / config map / secret name
    size: str = ""  # claim template size
    access_modes: tuple[str, ...] = ()
    storage_class: str = ""


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A volume mounted into a step."""

    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable: a literal value or a secret reference."""

    name: str
    value: str = ""
    secret: SecretRef | None = None


# --------------------------------------------------------------------------- tuning


class TuneKind(enum.StrEnum):
    """The distribution one hyperparameter of a tune step is drawn from."""

    UNIFORM = "uniform"  # a float in [low, high] (on a grid of ``step`` when set)
    LOGUNIFORM = "loguniform"  # a float in [low, high], uniform in its logarithm
    INT = "int"  # an integer in [low, high] (every ``step``; ``log`` for a log scale)
    CHOICE = "choice"  # one of ``choices``


@dataclass(frozen=True, slots=True)
class TuneParam:
    """One hyperparameter of a tune step's search space."""

    name: str
    kind: TuneKind = TuneKind.UNIFORM
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False  # an integer range on a log scale
    choices: tuple[Literal, ...] = ()

    @property
    def value_type(self) -> ValueType:
        """The IR type of the values this parameter takes."""
        if self.kind is TuneKind.INT:
            return ValueType.INT
        if self.kind is TuneKind.CHOICE:
            types = {c.type for c in self.choices}
            if len(types) == 1:
                return types.pop()
            return ValueType.FLOAT if types == {ValueType.INT, ValueType.FLOAT} else \
                ValueType.JSON
        return ValueType.FLOAT


class TuneDirection(enum.StrEnum):
    """Whether a tune step looks for the largest or the smallest objective."""

    MAXIMIZE = "maximize"
    MINIMIZE = "minimize"


class TuneSampler(enum.StrEnum):
    """How a tune step proposes the next trial's parameters."""

    TPE = "tpe"  # Bayesian optimization (tree-structured Parzen estimator)
    RANDOM = "random"
    CMAES = "cmaes"  # covariance matrix adaptation (numeric parameters)
    GRID = "grid"  # every combination of a discrete space, in turn


class TunePruner(enum.StrEnum):
    """How a tune step stops unpromising trials from the intermediate values they report."""

    MEDIAN = "median"  # stop a trial whose value is worse than the median of earlier trials
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Tune:
    """Hyperparameter tuning: run the step as ``trials`` trials, ``parallel`` at once.

    Each trial is an execution of the step with one set of parameters drawn from
    ``space``, which it reads as the map item (:class:`ItemRef` keyed by the
    parameter's name, ``{{item.NAME}}``); its ``objective`` is one of the step's
    declared outputs. Later steps read the tune step's outputs: ``best_params``
    (a JSON object), ``best_value`` and each parameter of the best trial by its
    name (:func:`tune_outputs`). ``storage`` references the secret holding the
    study's database URL on engines that run the study in steps of their own;
    the local engine and Ray use their own setting.
    """

    space: tuple[TuneParam, ...]
    objective: str
    trials: int = 20
    parallel: int = 1
    direction: TuneDirection = TuneDirection.MAXIMIZE
    sampler: TuneSampler = TuneSampler.TPE
    pruner: TunePruner = TunePruner.MEDIAN
    seed: int | None = None
    storage: SecretRef | None = None
    image: str = ""  # the image of the ask/tell steps on static engines; "" = the default

    def param(self, name: str) -> TuneParam | None:
        """The parameter called ``name``, if any."""
        return next((p for p in self.space if p.name == name), None)


def tune_outputs(tune: Tune) -> tuple[OutputParameter, ...]:
    """The outputs later steps read from a tune step: the best parameters (one JSON
    object), the best objective value and each best parameter by name."""
    return (
        OutputParameter(TUNE_BEST_PARAMS, OutputSource.PATH, "/tmp/couler-tune/best_params",
                        ValueType.JSON),
        OutputParameter(TUNE_BEST_VALUE, OutputSource.PATH, "/tmp/couler-tune/best_value",
                        ValueType.FLOAT),
        *(OutputParameter(p.name, OutputSource.PATH, f"/tmp/couler-tune/params/{p.name}",
                          p.value_type) for p in tune.space),
    )


# --------------------------------------------------------------------------- step bodies


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Run a command in a container image."""

    KIND: ClassVar[str] = "container"
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    image_pull_policy: str = ""


class ScriptLanguage(enum.StrEnum):
    """Language of a script step."""

    PYTHON = "python"
    BASH = "bash"
    SH = "sh"


@dataclass(frozen=True, slots=True)
class ScriptSpec:
    """Run source code with an interpreter in a container image."""

    KIND: ClassVar[str] = "script"
    image: str
    source: str
    language: ScriptLanguage = ScriptLanguage.PYTHON
    command: tuple[str, ...] = ()  # interpreter command; empty = the language's default
    args: tuple[str, ...] = ()
    working_dir: str = ""
    image_pull_policy: str = ""


class JobAction(enum.StrEnum):
    """What to do with a job's resource manifest."""

    CREATE = "create"
    APPLY = "apply"
    REPLACE = "replace"
    PATCH = "patch"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Create a Kubernetes resource (PyTorchJob, TFJob, MPIJob, ...) and wait for it."""

    KIND: ClassVar[str] = "job"
    manifest: str  # canonical JSON of the resource manifest
    action: JobAction = JobAction.CREATE
    success_condition: str = ""
    failure_condition: str = ""
    set_owner_reference: bool = True

    @classmethod
    def of(cls, manifest: Mapping[str, object], **kwargs: object) -> JobSpec:
        """Build a job from a manifest mapping."""
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return cls(manifest=text, **kwargs)  # type: ignore[arg-type]

    @property
    def manifest_dict(self) -> dict[str, object]:
        """The decoded manifest."""
        value = json.loads(self.manifest)
        if not isinstance(value, dict):
            raise TypeError("job manifest is not a JSON object")
        return value


@dataclass(frozen=True, slots=True)
class SubWorkflowSpec:
    """A nested graph of steps, run as one step.

    With ``steps`` it is an inline body (a loop body with several steps, a
    group of concurrent sub-tasks); without, it refers to another workflow by
    ``name`` (and ``digest`` when pinned), which is what splitting produces.
    An output declared on an inline sub-workflow step is forwarded from the
    one inner step that declares an output of the same name (its ``source``
    and ``selector`` are not used). Inner steps see only each other: they do
    not read the enclosing step's inputs or map item.
    """

    KIND: ClassVar[str] = "subworkflow"
    name: str
    steps: tuple[Step, ...] = ()
    digest: str = ""


StepBody: TypeAlias = ContainerSpec | ScriptSpec | JobSpec | SubWorkflowSpec


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Step:
    """One node of the workflow graph."""

    name: str
    body: StepBody
    template: str = ""  # a naming hint shared by steps built from the same function
    inputs: tuple[InputParameter, ...] = ()
    outputs: tuple[OutputParameter, ...] = ()
    input_artifacts: tuple[InputArtifact, ...] = ()
    output_artifacts: tuple[OutputArtifact, ...] = ()
    env: tuple[EnvVar, ...] = ()
    dependencies: tuple[Dependency, ...] = ()
    depends: DependsExpr | None = None  # overrides "all dependencies hold" when set
    when: When | None = None
    foreach: ForEach | None = None
    loop: Loop | None = None
    retry: RetryPolicy | None = None
    timeout_seconds: int | None = None
    resources: Resources | None = None
    cache: CachePolicy | None = None
    priority: int | None = None
    node_selector: Pairs = ()
    tolerations: tuple[Toleration, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()
    daemon: bool = False
    parallelism: int | None = None
    labels: Pairs = ()
    tune: Tune | None = None  # run as hyperparameter-tuning trials

    def __post_init__(self) -> None:
        _sorted_pairs(self, "node_selector")
        _sorted_pairs(self, "labels")

    def input(self, name: str) -> InputParameter | None:
        """The input parameter called ``name``, if any."""
        return next((i for i in self.inputs if i.name == name), None)

    def output(self, name: str) -> OutputParameter | None:
        """The output parameter called ``name`` that later steps read, if any (a tune
        step's are its :func:`tune_outputs`, its own outputs being its trials')."""
        if self.tune is not None:
            return next((o for o in tune_outputs(self.tune) if o.name == name), None)
        return next((o for o in self.outputs if o.name == name), None)


@dataclass(frozen=True, slots=True)
class ExitHook:
    """Steps run after the workflow ends with ``on`` status."""

    on: RunStatus
    steps: tuple[Step, ...]


# --------------------------------------------------------------------------- workflow


class ConcurrencyPolicy(enum.StrEnum):
    """What a cron schedule does when the previous run is still going."""

    ALLOW = "allow"
    FORBID = "forbid"
    REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """Run the workflow on a cron schedule."""

    schedule: str
    timezone: str = ""  # empty = the engine's default (UTC on most)
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    starting_deadline_seconds: int | None = None
    successful_history_limit: int | None = None
    failed_history_limit: int | None = None
    suspend: bool = False


@dataclass(frozen=True, slots=True)
class EventTrigger:
    """Start the workflow when a message arrives on ``subject`` matching ``filter``."""

    subject: str
    filter: str = ""  # an expression over the event body; empty = every event


@dataclass(frozen=True, slots=True)
class StepDefaults:
    """Policies applied to every step that does not set its own."""

    retry: RetryPolicy | None = None
    timeout_seconds: int | None = None
    resources: Resources | None = None
    cache: CachePolicy | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class DnsConfig:
    """Pod DNS settings."""

    policy: str = ""
    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: Pairs = ()

    def __post_init__(self) -> None:
        _sorted_pairs(self, "options")


@dataclass(frozen=True, slots=True)
class SELinuxOptions:
    """The SELinux labels of a pod's containers (Kubernetes ``seLinuxOptions``)."""

    user: str = ""
    role: str = ""
    type: str = ""
    level: str = ""


@dataclass(frozen=True, slots=True)
class SecurityContext:
    """Pod security context."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None
    run_as_non_root: bool | None = None
    se_linux_options: SELinuxOptions | None = None


@dataclass(frozen=True, slots=True)
class Workflow:
    """A whole workflow: the unit every front end produces and every engine runs."""

    name: str
    steps: tuple[Step, ...]
    parameters: tuple[Parameter, ...] = ()
    exit_hooks: tuple[ExitHook, ...] = ()
    schedule: CronSchedule | None = None
    triggers: tuple[EventTrigger, ...] = ()
    labels: Pairs = ()
    annotations: Pairs = ()
    tenant: str = ""  # namespace
    defaults: StepDefaults = field(default_factory=StepDefaults)
    volumes: tuple[Volume, ...] = ()
    node_selector: Pairs = ()
    tolerations: tuple[Toleration, ...] = ()
    service_account: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    dns: DnsConfig | None = None
    security_context: SecurityContext | None = None
    timeout_seconds: int | None = None
    ttl_seconds: int | None = None  # delete this long after completion
    parallelism: int | None = None

    def __post_init__(self) -> None:
        for name in ("labels", "annotations", "node_selector"):
            _sorted_pairs(self, name)

    def step(self, name: str) -> Step | None:
        """The top-level step called ``name``, if any."""
        return next((s for s in self.steps if s.name == name), None)

    def parameter(self, name: str) -> Parameter | None:
        """The workflow parameter called ``name``, if any."""
        return next((p for p in self.parameters if p.name == name), None)


def all_steps(steps: Iterable[Step]) -> Iterable[Step]:
    """Every step, descending into inline sub-workflow bodies."""
    for step in steps:
        yield step
        if isinstance(step.body, SubWorkflowSpec):
            yield from all_steps(step.body.steps)
