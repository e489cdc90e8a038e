"""Handles the API gives back to the user: step outputs, map items, workflow parameters, secrets.

Handles are references into the workflow being built. They can be passed as
``args`` of later steps, as operands of ``when`` predicates and as the source
of a ``map``; the builder turns them into IR value sources
(:class:`~couler.ir.StepOutputRef`, :class:`~couler.ir.ItemRef`,
:class:`~couler.ir.WorkflowParamRef`, :class:`~couler.ir.SecretRef`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from couler.api.interpolate import Formattable, Marks
from couler.ir import ArtifactLocation, SecretRef, StorageKind, ValueType

if TYPE_CHECKING:
    from couler.api.builder import StepDraft, WorkflowBuilder

__all__ = [
    "ArtifactOutput",
    "ItemHandle",
    "LocationDraft",
    "Outputs",
    "ParameterOutput",
    "Secret",
    "SecretMaterial",
    "StepOutput",
    "WorkflowParam",
]


class StepOutput(Formattable):
    """An output of a step created by ``run_*``; pass it to later steps to feed them.

    Formatted into a step's args, command or env (``f"--model={out}"``), it
    becomes a placeholder the engine fills in (see :mod:`couler.api.interpolate`).
    """

    __slots__ = ("_draft", "_name")

    def __init__(self, draft: StepDraft, name: str) -> None:
        self._draft = draft
        self._name = name

    @property
    def step_name(self) -> str:
        """The name of the step that produces this output."""
        return self._draft.name

    @property
    def name(self) -> str:
        """The output's name on its step."""
        return self._name

    @property
    def draft(self) -> StepDraft:
        """The producing step's draft (internal)."""
        return self._draft

    def _marks(self) -> Marks:
        return self._draft.builder.marks

    def __repr__(self) -> str:
        return f"{type(self).__name__}(step={self.step_name!r}, name={self._name!r})"


class ParameterOutput(StepOutput):
    """An output parameter: a file's contents, a step's stdout or a job field."""

    __slots__ = ("_stdout", "_type")

    def __init__(self, draft: StepDraft, name: str, *, type: ValueType = ValueType.STRING,
                 stdout: bool = False) -> None:
        super().__init__(draft, name)
        self._type = type
        self._stdout = stdout

    @property
    def type(self) -> ValueType:
        """The output's value type."""
        return self._type

    @property
    def is_stdout(self) -> bool:
        """Whether this is the step's standard output (``result``)."""
        return self._stdout


class ArtifactOutput(StepOutput):
    """An output artifact: a file or directory the step writes at ``path``."""

    __slots__ = ("_path",)

    def __init__(self, draft: StepDraft, name: str, path: str) -> None:
        super().__init__(draft, name)
        self._path = path

    @property
    def path(self) -> str:
        """Where the producing step writes the artifact."""
        return self._path


class ItemHandle(Formattable):
    """The current item of a ``map`` (``key`` selects one list when several are zipped).

    ``"print(%s)" % item`` or ``f"--n={item}"`` in a step's args becomes the
    engine's item placeholder.
    """

    __slots__ = ("_key", "_owner", "_type")

    def __init__(self, owner: object, key: str = "", type: ValueType = ValueType.STRING) -> None:
        self._owner = owner
        self._key = key
        self._type = type

    @property
    def type(self) -> ValueType:
        """The type shared by all items (``string`` when they differ)."""
        return self._type

    @property
    def key(self) -> str:
        """The item key; empty for a map over a single list."""
        return self._key

    @property
    def owner(self) -> object:
        """The map call this item belongs to (internal)."""
        return self._owner

    def _marks(self) -> Marks | None:
        from couler.api.builder import peek_builder

        builder = peek_builder()
        return builder.marks if builder is not None else None

    def __repr__(self) -> str:
        return f"ItemHandle(key={self._key!r})"


class WorkflowParam(Formattable):
    """A workflow-level parameter; usable as a step argument or a ``when`` operand.

    Formatted into a step's args, command or env (``f"--lr={lr}"``), it
    becomes the engine's parameter placeholder.
    """

    __slots__ = ("_builder", "_name", "_type")

    def __init__(self, builder: WorkflowBuilder, name: str, type: ValueType) -> None:
        self._builder = builder
        self._name = name
        self._type = type

    @property
    def name(self) -> str:
        """The parameter's name."""
        return self._name

    @property
    def type(self) -> ValueType:
        """The parameter's value type."""
        return self._type

    @property
    def builder(self) -> WorkflowBuilder:
        """The workflow the parameter belongs to (internal)."""
        return self._builder

    def _marks(self) -> Marks:
        return self._builder.marks

    def __repr__(self) -> str:
        return f"WorkflowParam(name={self._name!r}, type={self._type.value!r})"


class Outputs(list[StepOutput]):
    """The outputs a ``run_*`` call returns.

    Passing the list as an argument passes its first output; formatting it
    (``f"{out}"``) does the same, so a Python list never reaches a workflow.
    """

    def __str__(self) -> str:
        return str(self[0]) if self else "[]"

    def __format__(self, spec: str) -> str:
        return format(self[0], spec) if self else format("[]", spec)


class Secret:
    """A reference to a Kubernetes secret; ``str(secret)`` is its name.

    The values given to :func:`couler.create_secret` are not held here: they
    stay in the workflow builder's in-memory secret material, are handed to
    the submitter at submit time, and never enter the IR. Neither ``repr``
    nor ``str`` shows them.
    """

    __slots__ = ("_builder", "_explicit_name", "_index", "artifact_secret", "dry_run", "keys",
                 "namespace", "use_existing")

    def __init__(self, builder: WorkflowBuilder, index: int, explicit_name: str | None,
                 keys: tuple[str, ...], namespace: str, *, dry_run: bool, use_existing: bool,
                 artifact_secret: bool) -> None:
        self._builder = builder
        self._index = index
        self._explicit_name = explicit_name
        self.keys = keys
        self.namespace = namespace
        self.dry_run = dry_run
        self.use_existing = use_existing
        self.artifact_secret = artifact_secret

    @property
    def index(self) -> int:
        """Creation order of the secret in its workflow, from 1."""
        return self._index

    @property
    def builder(self) -> WorkflowBuilder:
        """The workflow the secret belongs to (internal)."""
        return self._builder

    @property
    def name(self) -> str:
        """The secret's name: the one given, else ``<workflow>-secret-<n>``."""
        if self._explicit_name:
            return self._explicit_name
        return f"{self._builder.workflow_name()}-secret-{self._index}"

    def ref(self, key: str) -> SecretRef:
        """The IR reference to one key of this secret."""
        return SecretRef(self.name, key)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Secret(name={self.name!r}, keys={list(self.keys)!r})"


class SecretMaterial:
    """A secret to create at submit time: its name, namespace and (hidden) values.

    ``repr`` and ``str`` never show the values; call :meth:`reveal` to get them.
    """

    __slots__ = ("_data", "dry_run", "keys", "name", "namespace", "use_existing")

    def __init__(self, name: str, namespace: str, data: dict[str, str], *, dry_run: bool,
                 use_existing: bool, keys: tuple[str, ...] | None = None) -> None:
        self.name = name
        self.namespace = namespace
        self.keys = keys if keys is not None else tuple(data)
        self._data = dict(data)
        self.dry_run = dry_run
        self.use_existing = use_existing

    @property
    def should_create(self) -> bool:
        """Whether the submitter must create this secret (not a dry run, not existing)."""
        return not self.dry_run and not self.use_existing and bool(self._data)

    def reveal(self) -> dict[str, str]:
        """The secret's values, for the submitter only."""
        return dict(self._data)

    def __repr__(self) -> str:
        return (f"SecretMaterial(name={self.name!r}, namespace={self.namespace!r}, "
                f"keys={list(self.keys)!r}, values=<hidden>)")

    __str__ = __repr__


@dataclass(frozen=True)
class LocationDraft:
    """An artifact storage location whose credentials are resolved when the IR is built."""

    storage: StorageKind = StorageKind.DEFAULT
    endpoint: str = ""
    bucket: str = ""
    key: str = ""
    insecure: bool = False
    credentials: Secret | None = None

    def freeze(self) -> ArtifactLocation:
        """The IR location, with credentials as secret references."""
        creds = self.credentials
        return ArtifactLocation(
            storage=self.storage, endpoint=self.endpoint, bucket=self.bucket, key=self.key,
            insecure=self.insecure,
            access_key=creds.ref("accessKey") if creds is not None else None,
            secret_key=creds.ref("secretKey") if creds is not None else None,
        )
