"""Convert workflows between the IR (:mod:`couler.ir`) and protobuf (``couler.v1``).

:func:`workflow_to_proto` and :func:`workflow_from_proto` are exact inverses:
``workflow_from_proto(workflow_to_proto(wf)) == wf`` for every IR value,
including ``None`` versus a default, ``-0.0``, empty tuples, nested
sub-workflows and recursive depends expressions.

The mapping follows the conventions stated in ``proto/couler/v1/workflow.proto``:

* Messages and fields carry the IR's names. Unions are ``oneof``\\ s whose
  members are named after the IR's ``KIND`` tags (except the depends
  expression's ``all_of`` / ``any_of`` / ``negation``).
* An absent proto field decodes to the IR default of its field. The encoder
  writes every field whose IR value is not ``None``, so nothing relies on a
  default being the same on both sides.
* Enum values are ``<PREFIX>_<MEMBER NAME>``; ``<PREFIX>_UNSPECIFIED`` (0)
  decodes to the field's IR default, or is an error where the IR has none.

Decoding a malformed message raises :class:`couler.errors.InvalidWorkflowError`
naming the workflow, the step and the field (as ``Message.field``); so does
encoding a value protobuf cannot hold (an int outside int64).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, assert_never

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import Message

from couler import ir
from couler.errors import InvalidWorkflowError
from couler.v1 import workflow_pb2 as pb

__all__ = ["step_from_proto", "step_to_proto", "workflow_from_proto", "workflow_to_proto"]

A = TypeVar("A")
B = TypeVar("B")
E = TypeVar("E", bound=enum.Enum)


# =========================================================================== machinery


class _EnumCodec(Generic[E]):
    """Maps an IR enum to the proto enum whose values are ``PREFIX_<member name>``."""

    def __init__(self, ir_enum: type[E], proto_enum: EnumTypeWrapper, prefix: str) -> None:
        self._names = {member: f"{prefix}_{member.name}" for member in ir_enum}
        # Value() raises here, at import, if the proto lacks a member.
        self._members = {proto_enum.Value(name): member for member, name in self._names.items()}
        extra = set(proto_enum.values()) - set(self._members) - {0}
        if extra or proto_enum.Name(0) != f"{prefix}_UNSPECIFIED":
            raise RuntimeError(f"proto enum {prefix} does not mirror {ir_enum.__name__}")

    def encode(self, member: E) -> str:
        """The proto value's name (message constructors accept enum names)."""
        return self._names[member]

    def decode(self, number: int, field: str, default: E | None = None) -> E:
        """The IR member for a proto value; ``default`` for UNSPECIFIED, if given."""
        if number == 0 and default is not None:
            return default
        member = self._members.get(number)
        if member is None:
            raise _invalid(field, "is not set" if number == 0 else f"has unknown value {number}")
        return member


_VALUE_TYPE = _EnumCodec(ir.ValueType, pb.ValueType, "VALUE_TYPE")
_OUTPUT_SOURCE = _EnumCodec(ir.OutputSource, pb.OutputSource, "OUTPUT_SOURCE")
_STORAGE_KIND = _EnumCodec(ir.StorageKind, pb.StorageKind, "STORAGE_KIND")
_EDGE_CONDITION = _EnumCodec(ir.EdgeCondition, pb.EdgeCondition, "EDGE_CONDITION")
_COMPARE_OP = _EnumCodec(ir.CompareOp, pb.CompareOp, "COMPARE_OP")
_RUN_STATUS = _EnumCodec(ir.RunStatus, pb.RunStatus, "RUN_STATUS")
_FAILURE_CLASS = _EnumCodec(ir.FailureClass, pb.FailureClass, "FAILURE_CLASS")
_VOLUME_KIND = _EnumCodec(ir.VolumeKind, pb.VolumeKind, "VOLUME_KIND")
_SCRIPT_LANGUAGE = _EnumCodec(ir.ScriptLanguage, pb.ScriptLanguage, "SCRIPT_LANGUAGE")
_JOB_ACTION = _EnumCodec(ir.JobAction, pb.JobAction, "JOB_ACTION")
_CONCURRENCY_POLICY = _EnumCodec(ir.ConcurrencyPolicy, pb.ConcurrencyPolicy, "CONCURRENCY_POLICY")
_TUNE_KIND = _EnumCodec(ir.TuneKind, pb.TuneKind, "TUNE_KIND")
_TUNE_DIRECTION = _EnumCodec(ir.TuneDirection, pb.TuneDirection, "TUNE_DIRECTION")
_TUNE_SAMPLER = _EnumCodec(ir.TuneSampler, pb.TuneSampler, "TUNE_SAMPLER")
_TUNE_PRUNER = _EnumCodec(ir.TunePruner, pb.TunePruner, "TUNE_PRUNER")


def _default(cls: type[Any], name: str) -> Any:
    """The IR default of dataclass field ``cls.name``: what an absent proto field means."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            if f.default is not dataclasses.MISSING:
                return f.default
    raise LookupError(f"{cls.__name__}.{name} has no default")  # pragma: no cover


def _opt(encode: Callable[[A], B], value: A | None) -> B | None:
    """``encode(value)``, or None (an absent field) when ``value`` is None."""
    return None if value is None else encode(value)


def _invalid(field: str, problem: str) -> InvalidWorkflowError:
    return InvalidWorkflowError(f"field {field!r} {problem}")


def _require(msg: Message, name: str) -> None:
    if not msg.HasField(name):
        raise _invalid(f"{msg.DESCRIPTOR.name}.{name}", "is not set")


def _unset_oneof(msg: Message, oneof: str, field: str) -> InvalidWorkflowError:
    options = ", ".join(f.name for f in msg.DESCRIPTOR.oneofs_by_name[oneof].fields)
    return _invalid(field, f"is not set; expected one of: {options}")


@contextmanager
def _located(where: str) -> Iterator[None]:
    """Prefix errors raised inside with ``where`` (a workflow or step)."""
    try:
        yield
    except InvalidWorkflowError as e:
        raise InvalidWorkflowError(f"{where}, {e}") from None
    except (ValueError, TypeError) as e:  # e.g. an int outside int64
        raise InvalidWorkflowError(f"{where}: cannot convert: {e}") from e


def _pairs_to_proto(pairs: ir.Pairs) -> list[pb.StringPair]:
    return [pb.StringPair(key=k, value=v) for k, v in pairs]


def _pairs_from_proto(msgs: Iterable[pb.StringPair]) -> ir.Pairs:
    return tuple((m.key, m.value) for m in msgs)


# =========================================================================== values


def _literal_to_proto(v: ir.Literal) -> pb.Literal:
    return pb.Literal(json=v.json)


def _literal_from_proto(m: pb.Literal) -> ir.Literal:
    return ir.Literal(json=m.json)


def _value_to_proto(v: ir.ValueSource) -> pb.ValueSource:
    if isinstance(v, ir.Literal):
        return pb.ValueSource(literal=_literal_to_proto(v))
    if isinstance(v, ir.StepOutputRef):
        return pb.ValueSource(step_output=pb.StepOutputRef(step=v.step, output=v.output))
    if isinstance(v, ir.WorkflowParamRef):
        return pb.ValueSource(workflow_param=pb.WorkflowParamRef(name=v.name))
    if isinstance(v, ir.ItemRef):
        return pb.ValueSource(item=pb.ItemRef(key=v.key))
    assert_never(v)


def _value_from_proto(m: pb.ValueSource, field: str) -> ir.ValueSource:
    kind = m.WhichOneof("kind")
    if kind == "literal":
        return _literal_from_proto(m.literal)
    if kind == "step_output":
        return ir.StepOutputRef(step=m.step_output.step, output=m.step_output.output)
    if kind == "workflow_param":
        return ir.WorkflowParamRef(name=m.workflow_param.name)
    if kind == "item":
        return ir.ItemRef(key=m.item.key)
    raise _unset_oneof(m, "kind", field)


def _secret_to_proto(v: ir.SecretRef) -> pb.SecretRef:
    return pb.SecretRef(name=v.name, key=v.key)


def _secret_from_proto(m: pb.SecretRef) -> ir.SecretRef:
    return ir.SecretRef(name=m.name, key=m.key)


# =========================================================================== parameters


def _parameter_to_proto(v: ir.Parameter) -> pb.Parameter:
    return pb.Parameter(
        name=v.name,
        type=_VALUE_TYPE.encode(v.type),
        default=_opt(_literal_to_proto, v.default),
        description=v.description,
        enum=[_literal_to_proto(x) for x in v.enum],
    )


def _parameter_from_proto(m: pb.Parameter) -> ir.Parameter:
    return ir.Parameter(
        name=m.name,
        type=_VALUE_TYPE.decode(m.type, "Parameter.type", _default(ir.Parameter, "type")),
        default=_literal_from_proto(m.default) if m.HasField("default") else None,
        description=m.description,
        enum=tuple(_literal_from_proto(x) for x in m.enum),
    )


def _input_to_proto(v: ir.InputParameter) -> pb.InputParameter:
    return pb.InputParameter(
        name=v.name, value=_value_to_proto(v.value), type=_VALUE_TYPE.encode(v.type)
    )


def _input_from_proto(m: pb.InputParameter) -> ir.InputParameter:
    return ir.InputParameter(
        name=m.name,
        value=_value_from_proto(m.value, "InputParameter.value"),
        type=_VALUE_TYPE.decode(m.type, "InputParameter.type", _default(ir.InputParameter, "type")),
    )


def _output_to_proto(v: ir.OutputParameter) -> pb.OutputParameter:
    return pb.OutputParameter(
        name=v.name,
        source=_OUTPUT_SOURCE.encode(v.source),
        selector=v.selector,
        type=_VALUE_TYPE.encode(v.type),
        global_name=v.global_name,
    )


def _output_from_proto(m: pb.OutputParameter) -> ir.OutputParameter:
    cls = ir.OutputParameter
    return ir.OutputParameter(
        name=m.name,
        source=_OUTPUT_SOURCE.decode(m.source, "OutputParameter.source", _default(cls, "source")),
        selector=m.selector,
        type=_VALUE_TYPE.decode(m.type, "OutputParameter.type", _default(cls, "type")),
        global_name=m.global_name,
    )


# =========================================================================== artifacts


def _location_to_proto(v: ir.ArtifactLocation) -> pb.ArtifactLocation:
    return pb.ArtifactLocation(
        storage=_STORAGE_KIND.encode(v.storage),
        endpoint=v.endpoint,
        bucket=v.bucket,
        key=v.key,
        url=v.url,
        revision=v.revision,
        insecure=v.insecure,
        access_key=_opt(_secret_to_proto, v.access_key),
        secret_key=_opt(_secret_to_proto, v.secret_key),
    )


def _location_from_proto(m: pb.ArtifactLocation) -> ir.ArtifactLocation:
    default_storage = _default(ir.ArtifactLocation, "storage")
    return ir.ArtifactLocation(
        storage=_STORAGE_KIND.decode(m.storage, "ArtifactLocation.storage", default_storage),
        endpoint=m.endpoint,
        bucket=m.bucket,
        key=m.key,
        url=m.url,
        revision=m.revision,
        insecure=m.insecure,
        access_key=_secret_from_proto(m.access_key) if m.HasField("access_key") else None,
        secret_key=_secret_from_proto(m.secret_key) if m.HasField("secret_key") else None,
    )


def _input_artifact_to_proto(v: ir.InputArtifact) -> pb.InputArtifact:
    msg = pb.InputArtifact(name=v.name, path=v.path)
    source = v.source
    if isinstance(source, ir.ArtifactLocation):
        msg.location.CopyFrom(_location_to_proto(source))
    elif isinstance(source, ir.StepArtifactRef):
        msg.step_artifact.CopyFrom(pb.StepArtifactRef(step=source.step, artifact=source.artifact))
    else:
        assert_never(source)
    return msg


def _input_artifact_from_proto(m: pb.InputArtifact) -> ir.InputArtifact:
    kind = m.WhichOneof("source")
    source: ir.ArtifactSource
    if kind == "location":
        source = _location_from_proto(m.location)
    elif kind == "step_artifact":
        source = ir.StepArtifactRef(step=m.step_artifact.step, artifact=m.step_artifact.artifact)
    else:
        raise _unset_oneof(m, "source", "InputArtifact.source")
    return ir.InputArtifact(name=m.name, path=m.path, source=source)


def _output_artifact_to_proto(v: ir.OutputArtifact) -> pb.OutputArtifact:
    return pb.OutputArtifact(
        name=v.name,
        path=v.path,
        location=_opt(_location_to_proto, v.location),
        digest=v.digest,
        global_name=v.global_name,
    )


def _output_artifact_from_proto(m: pb.OutputArtifact) -> ir.OutputArtifact:
    return ir.OutputArtifact(
        name=m.name,
        path=m.path,
        location=_location_from_proto(m.location) if m.HasField("location") else None,
        digest=m.digest,
        global_name=m.global_name,
    )


# =========================================================================== control flow


def _dependency_to_proto(v: ir.Dependency) -> pb.Dependency:
    return pb.Dependency(step=v.step, condition=_EDGE_CONDITION.encode(v.condition))


def _dependency_from_proto(m: pb.Dependency) -> ir.Dependency:
    default = _default(ir.Dependency, "condition")
    return ir.Dependency(
        step=m.step, condition=_EDGE_CONDITION.decode(m.condition, "Dependency.condition", default)
    )


def _depends_to_proto(v: ir.DependsExpr) -> pb.DependsExpr:
    if isinstance(v, ir.DependsTerm):
        term = pb.DependsTerm(step=v.step, condition=_EDGE_CONDITION.encode(v.condition))
        return pb.DependsExpr(term=term)
    if isinstance(v, ir.DependsAll):
        return pb.DependsExpr(all_of=pb.DependsAll(terms=[_depends_to_proto(t) for t in v.terms]))
    if isinstance(v, ir.DependsAny):
        return pb.DependsExpr(any_of=pb.DependsAny(terms=[_depends_to_proto(t) for t in v.terms]))
    if isinstance(v, ir.DependsNot):
        return pb.DependsExpr(negation=pb.DependsNot(term=_depends_to_proto(v.term)))
    assert_never(v)


def _depends_from_proto(m: pb.DependsExpr, field: str) -> ir.DependsExpr:
    kind = m.WhichOneof("kind")
    if kind == "term":
        default = _default(ir.DependsTerm, "condition")
        condition = _EDGE_CONDITION.decode(m.term.condition, "DependsTerm.condition", default)
        return ir.DependsTerm(step=m.term.step, condition=condition)
    if kind == "all_of":
        return ir.DependsAll(
            terms=tuple(_depends_from_proto(t, "DependsAll.terms") for t in m.all_of.terms)
        )
    if kind == "any_of":
        return ir.DependsAny(
            terms=tuple(_depends_from_proto(t, "DependsAny.terms") for t in m.any_of.terms)
        )
    if kind == "negation":
        _require(m.negation, "term")
        return ir.DependsNot(term=_depends_from_proto(m.negation.term, "DependsNot.term"))
    raise _unset_oneof(m, "kind", field)


def _condition_to_proto(v: ir.Condition) -> pb.Condition:
    return pb.Condition(
        left=_value_to_proto(v.left),
        op=_COMPARE_OP.encode(v.op),
        right=_value_to_proto(v.right),
    )


def _condition_from_proto(m: pb.Condition) -> ir.Condition:
    return ir.Condition(
        left=_value_from_proto(m.left, "Condition.left"),
        op=_COMPARE_OP.decode(m.op, "Condition.op"),
        right=_value_from_proto(m.right, "Condition.right"),
    )


def _when_to_proto(v: ir.When) -> pb.When:
    return pb.When(condition=_condition_to_proto(v.condition), expect=v.expect)


def _when_from_proto(m: pb.When) -> ir.When:
    _require(m, "condition")
    return ir.When(
        condition=_condition_from_proto(m.condition),
        expect=m.expect if m.HasField("expect") else _default(ir.When, "expect"),
    )


def _foreach_to_proto(v: ir.ForEach) -> pb.ForEach:
    msg = pb.ForEach(items=[_literal_to_proto(x) for x in v.items], parallelism=v.parallelism)
    source = v.source
    if isinstance(source, ir.StepOutputRef):
        msg.step_output.CopyFrom(pb.StepOutputRef(step=source.step, output=source.output))
    elif isinstance(source, ir.WorkflowParamRef):
        msg.workflow_param.CopyFrom(pb.WorkflowParamRef(name=source.name))
    elif source is not None:
        assert_never(source)
    return msg


def _foreach_from_proto(m: pb.ForEach) -> ir.ForEach:
    kind = m.WhichOneof("source")
    source: ir.StepOutputRef | ir.WorkflowParamRef | None = None
    if kind == "step_output":
        source = ir.StepOutputRef(step=m.step_output.step, output=m.step_output.output)
    elif kind == "workflow_param":
        source = ir.WorkflowParamRef(name=m.workflow_param.name)
    return ir.ForEach(
        items=tuple(_literal_from_proto(x) for x in m.items),
        source=source,
        parallelism=m.parallelism if m.HasField("parallelism") else None,
    )


def _tune_param_to_proto(v: ir.TuneParam) -> pb.TuneParam:
    return pb.TuneParam(name=v.name, kind=_TUNE_KIND.encode(v.kind), low=v.low, high=v.high,
                        step=v.step, log=v.log,
                        choices=[_literal_to_proto(x) for x in v.choices])


def _tune_param_from_proto(m: pb.TuneParam) -> ir.TuneParam:
    with _located(f"tune parameter {m.name!r}"):
        return ir.TuneParam(
            name=m.name,
            kind=_TUNE_KIND.decode(m.kind, "kind", ir.TuneKind.UNIFORM),
            low=m.low, high=m.high, step=m.step if m.HasField("step") else None, log=m.log,
            choices=tuple(_literal_from_proto(x) for x in m.choices))


def _tune_to_proto(v: ir.Tune) -> pb.Tune:
    return pb.Tune(
        space=[_tune_param_to_proto(p) for p in v.space], objective=v.objective,
        trials=v.trials, parallel=v.parallel, direction=_TUNE_DIRECTION.encode(v.direction),
        sampler=_TUNE_SAMPLER.encode(v.sampler), pruner=_TUNE_PRUNER.encode(v.pruner),
        seed=v.seed, storage=_opt(_secret_to_proto, v.storage), image=v.image)


def _tune_from_proto(m: pb.Tune) -> ir.Tune:
    return ir.Tune(
        space=tuple(_tune_param_from_proto(p) for p in m.space),
        objective=m.objective,
        trials=m.trials if m.HasField("trials") else _default(ir.Tune, "trials"),
        parallel=m.parallel if m.HasField("parallel") else _default(ir.Tune, "parallel"),
        direction=_TUNE_DIRECTION.decode(m.direction, "tune.direction",
                                         ir.TuneDirection.MAXIMIZE),
        sampler=_TUNE_SAMPLER.decode(m.sampler, "tune.sampler", ir.TuneSampler.TPE),
        pruner=_TUNE_PRUNER.decode(m.pruner, "tune.pruner", ir.TunePruner.MEDIAN),
        seed=m.seed if m.HasField("seed") else None,
        storage=_secret_from_proto(m.storage) if m.HasField("storage") else None,
        image=m.image,
    )


def _loop_to_proto(v: ir.Loop) -> pb.Loop:
    return pb.Loop(condition=_condition_to_proto(v.condition), max_iterations=v.max_iterations)


def _loop_from_proto(m: pb.Loop) -> ir.Loop:
    _require(m, "condition")
    return ir.Loop(
        condition=_condition_from_proto(m.condition),
        max_iterations=(
            m.max_iterations
            if m.HasField("max_iterations")
            else _default(ir.Loop, "max_iterations")
        ),
    )


# =========================================================================== policies


def _backoff_to_proto(v: ir.Backoff) -> pb.Backoff:
    return pb.Backoff(base_seconds=v.base_seconds, factor=v.factor, cap_seconds=v.cap_seconds)


def _backoff_from_proto(m: pb.Backoff) -> ir.Backoff:
    return ir.Backoff(
        base_seconds=(
            m.base_seconds if m.HasField("base_seconds") else _default(ir.Backoff, "base_seconds")
        ),
        factor=m.factor if m.HasField("factor") else _default(ir.Backoff, "factor"),
        cap_seconds=m.cap_seconds if m.HasField("cap_seconds") else None,
    )


def _retry_to_proto(v: ir.RetryPolicy) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        limit=v.limit,
        backoff=_opt(_backoff_to_proto, v.backoff),
        on=[_FAILURE_CLASS.encode(x) for x in v.on],
        memory_factor=v.memory_factor,
        memory_ceiling=v.memory_ceiling,
    )


def _retry_from_proto(m: pb.RetryPolicy) -> ir.RetryPolicy:
    return ir.RetryPolicy(
        limit=m.limit,
        backoff=_backoff_from_proto(m.backoff) if m.HasField("backoff") else None,
        on=tuple(_FAILURE_CLASS.decode(x, "RetryPolicy.on") for x in m.on),
        memory_factor=m.memory_factor if m.HasField("memory_factor") else None,
        memory_ceiling=m.memory_ceiling,
    )


def _resources_to_proto(v: ir.Resources) -> pb.Resources:
    return pb.Resources(
        cpu_request=v.cpu_request,
        cpu_limit=v.cpu_limit,
        memory_request=v.memory_request,
        memory_limit=v.memory_limit,
        gpu=v.gpu,
        gpu_resource=v.gpu_resource,
    )


def _resources_from_proto(m: pb.Resources) -> ir.Resources:
    return ir.Resources(
        cpu_request=m.cpu_request,
        cpu_limit=m.cpu_limit,
        memory_request=m.memory_request,
        memory_limit=m.memory_limit,
        gpu=m.gpu,
        gpu_resource=(
            m.gpu_resource if m.HasField("gpu_resource") else _default(ir.Resources, "gpu_resource")
        ),
    )


def _cache_to_proto(v: ir.CachePolicy) -> pb.CachePolicy:
    return pb.CachePolicy(
        enabled=v.enabled,
        salt=v.salt,
        max_age_seconds=v.max_age_seconds,
        key=v.key,
        name=v.name,
    )


def _cache_from_proto(m: pb.CachePolicy) -> ir.CachePolicy:
    return ir.CachePolicy(
        enabled=m.enabled if m.HasField("enabled") else _default(ir.CachePolicy, "enabled"),
        salt=m.salt,
        max_age_seconds=m.max_age_seconds if m.HasField("max_age_seconds") else None,
        key=m.key,
        name=m.name,
    )


def _toleration_to_proto(v: ir.Toleration) -> pb.Toleration:
    return pb.Toleration(
        key=v.key,
        operator=v.operator,
        value=v.value,
        effect=v.effect,
        toleration_seconds=v.toleration_seconds,
    )


def _toleration_from_proto(m: pb.Toleration) -> ir.Toleration:
    return ir.Toleration(
        key=m.key,
        operator=m.operator if m.HasField("operator") else _default(ir.Toleration, "operator"),
        value=m.value,
        effect=m.effect,
        toleration_seconds=m.toleration_seconds if m.HasField("toleration_seconds") else None,
    )


def _volume_to_proto(v: ir.Volume) -> pb.Volume:
    return pb.Volume(
        name=v.name,
        kind=_VOLUME_KIND.encode(v.kind),
        claim_name=v.claim_name,
        size=v.size,
        access_modes=v.access_modes,
        storage_class=v.storage_class,
    )


def _volume_from_proto(m: pb.Volume) -> ir.Volume:
    return ir.Volume(
        name=m.name,
        kind=_VOLUME_KIND.decode(m.kind, "Volume.kind", _default(ir.Volume, "kind")),
        claim_name=m.claim_name,
        size=m.size,
        access_modes=tuple(m.access_modes),
        storage_class=m.storage_class,
    )


def _mount_to_proto(v: ir.VolumeMount) -> pb.VolumeMount:
    return pb.VolumeMount(
        name=v.name, mount_path=v.mount_path, read_only=v.read_only, sub_path=v.sub_path
    )


def _mount_from_proto(m: pb.VolumeMount) -> ir.VolumeMount:
    return ir.VolumeMount(
        name=m.name, mount_path=m.mount_path, read_only=m.read_only, sub_path=m.sub_path
    )


def _env_to_proto(v: ir.EnvVar) -> pb.EnvVar:
    return pb.EnvVar(name=v.name, value=v.value, secret=_opt(_secret_to_proto, v.secret))


def _env_from_proto(m: pb.EnvVar) -> ir.EnvVar:
    return ir.EnvVar(
        name=m.name,
        value=m.value,
        secret=_secret_from_proto(m.secret) if m.HasField("secret") else None,
    )


# =========================================================================== step bodies


def _container_to_proto(v: ir.ContainerSpec) -> pb.ContainerSpec:
    return pb.ContainerSpec(
        image=v.image,
        command=v.command,
        args=v.args,
        working_dir=v.working_dir,
        image_pull_policy=v.image_pull_policy,
    )


def _container_from_proto(m: pb.ContainerSpec) -> ir.ContainerSpec:
    return ir.ContainerSpec(
        image=m.image,
        command=tuple(m.command),
        args=tuple(m.args),
        working_dir=m.working_dir,
        image_pull_policy=m.image_pull_policy,
    )


def _script_to_proto(v: ir.ScriptSpec) -> pb.ScriptSpec:
    return pb.ScriptSpec(
        image=v.image,
        source=v.source,
        language=_SCRIPT_LANGUAGE.encode(v.language),
        command=v.command,
        args=v.args,
        working_dir=v.working_dir,
        image_pull_policy=v.image_pull_policy,
    )


def _script_from_proto(m: pb.ScriptSpec) -> ir.ScriptSpec:
    default_language = _default(ir.ScriptSpec, "language")
    return ir.ScriptSpec(
        image=m.image,
        source=m.source,
        language=_SCRIPT_LANGUAGE.decode(m.language, "ScriptSpec.language", default_language),
        command=tuple(m.command),
        args=tuple(m.args),
        working_dir=m.working_dir,
        image_pull_policy=m.image_pull_policy,
    )


def _job_to_proto(v: ir.JobSpec) -> pb.JobSpec:
    return pb.JobSpec(
        manifest=v.manifest,
        action=_JOB_ACTION.encode(v.action),
        success_condition=v.success_condition,
        failure_condition=v.failure_condition,
        set_owner_reference=v.set_owner_reference,
    )


def _job_from_proto(m: pb.JobSpec) -> ir.JobSpec:
    return ir.JobSpec(
        manifest=m.manifest,
        action=_JOB_ACTION.decode(m.action, "JobSpec.action", _default(ir.JobSpec, "action")),
        success_condition=m.success_condition,
        failure_condition=m.failure_condition,
        set_owner_reference=(
            m.set_owner_reference
            if m.HasField("set_owner_reference")
            else _default(ir.JobSpec, "set_owner_reference")
        ),
    )


def _subworkflow_to_proto(v: ir.SubWorkflowSpec) -> pb.SubWorkflowSpec:
    return pb.SubWorkflowSpec(
        name=v.name, steps=[step_to_proto(s) for s in v.steps], digest=v.digest
    )


def _subworkflow_from_proto(m: pb.SubWorkflowSpec) -> ir.SubWorkflowSpec:
    return ir.SubWorkflowSpec(
        name=m.name, steps=tuple(step_from_proto(s) for s in m.steps), digest=m.digest
    )


# =========================================================================== steps


def step_to_proto(step: ir.Step) -> pb.Step:
    """Encode one step (and any inline sub-workflow steps) as protobuf."""
    with _located(f"step {step.name!r}"):
        msg = pb.Step(
            name=step.name,
            template=step.template,
            inputs=[_input_to_proto(x) for x in step.inputs],
            outputs=[_output_to_proto(x) for x in step.outputs],
            input_artifacts=[_input_artifact_to_proto(x) for x in step.input_artifacts],
            output_artifacts=[_output_artifact_to_proto(x) for x in step.output_artifacts],
            env=[_env_to_proto(x) for x in step.env],
            dependencies=[_dependency_to_proto(x) for x in step.dependencies],
            depends=None if step.depends is None else _depends_to_proto(step.depends),
            when=_opt(_when_to_proto, step.when),
            foreach=_opt(_foreach_to_proto, step.foreach),
            loop=_opt(_loop_to_proto, step.loop),
            retry=_opt(_retry_to_proto, step.retry),
            timeout_seconds=step.timeout_seconds,
            resources=_opt(_resources_to_proto, step.resources),
            cache=_opt(_cache_to_proto, step.cache),
            priority=step.priority,
            node_selector=_pairs_to_proto(step.node_selector),
            tolerations=[_toleration_to_proto(x) for x in step.tolerations],
            volume_mounts=[_mount_to_proto(x) for x in step.volume_mounts],
            daemon=step.daemon,
            parallelism=step.parallelism,
            labels=_pairs_to_proto(step.labels),
            tune=_opt(_tune_to_proto, step.tune),
        )
        body = step.body
        if isinstance(body, ir.ContainerSpec):
            msg.container.CopyFrom(_container_to_proto(body))
        elif isinstance(body, ir.ScriptSpec):
            msg.script.CopyFrom(_script_to_proto(body))
        elif isinstance(body, ir.JobSpec):
            msg.job.CopyFrom(_job_to_proto(body))
        elif isinstance(body, ir.SubWorkflowSpec):
            msg.subworkflow.CopyFrom(_subworkflow_to_proto(body))
        else:
            assert_never(body)
    return msg


def step_from_proto(msg: pb.Step) -> ir.Step:
    """Decode one step; raises :class:`InvalidWorkflowError` naming the bad field."""
    with _located(f"step {msg.name!r}"):
        return ir.Step(
            name=msg.name,
            body=_body_from_proto(msg),
            template=msg.template,
            inputs=tuple(_input_from_proto(x) for x in msg.inputs),
            outputs=tuple(_output_from_proto(x) for x in msg.outputs),
            input_artifacts=tuple(_input_artifact_from_proto(x) for x in msg.input_artifacts),
            output_artifacts=tuple(_output_artifact_from_proto(x) for x in msg.output_artifacts),
            env=tuple(_env_from_proto(x) for x in msg.env),
            dependencies=tuple(_dependency_from_proto(x) for x in msg.dependencies),
            depends=(
                _depends_from_proto(msg.depends, "Step.depends")
                if msg.HasField("depends")
                else None
            ),
            when=_when_from_proto(msg.when) if msg.HasField("when") else None,
            foreach=_foreach_from_proto(msg.foreach) if msg.HasField("foreach") else None,
            loop=_loop_from_proto(msg.loop) if msg.HasField("loop") else None,
            retry=_retry_from_proto(msg.retry) if msg.HasField("retry") else None,
            timeout_seconds=msg.timeout_seconds if msg.HasField("timeout_seconds") else None,
            resources=_resources_from_proto(msg.resources) if msg.HasField("resources") else None,
            cache=_cache_from_proto(msg.cache) if msg.HasField("cache") else None,
            priority=msg.priority if msg.HasField("priority") else None,
            node_selector=_pairs_from_proto(msg.node_selector),
            tolerations=tuple(_toleration_from_proto(x) for x in msg.tolerations),
            volume_mounts=tuple(_mount_from_proto(x) for x in msg.volume_mounts),
            daemon=msg.daemon,
            parallelism=msg.parallelism if msg.HasField("parallelism") else None,
            labels=_pairs_from_proto(msg.labels),
            tune=_tune_from_proto(msg.tune) if msg.HasField("tune") else None,
        )


def _body_from_proto(msg: pb.Step) -> ir.StepBody:
    kind = msg.WhichOneof("body")
    if kind == "container":
        return _container_from_proto(msg.container)
    if kind == "script":
        return _script_from_proto(msg.script)
    if kind == "job":
        return _job_from_proto(msg.job)
    if kind == "subworkflow":
        return _subworkflow_from_proto(msg.subworkflow)
    raise _unset_oneof(msg, "body", "Step.body")


def _exit_hook_to_proto(v: ir.ExitHook) -> pb.ExitHook:
    return pb.ExitHook(on=_RUN_STATUS.encode(v.on), steps=[step_to_proto(s) for s in v.steps])


def _exit_hook_from_proto(m: pb.ExitHook) -> ir.ExitHook:
    return ir.ExitHook(
        on=_RUN_STATUS.decode(m.on, "ExitHook.on"),
        steps=tuple(step_from_proto(s) for s in m.steps),
    )


# =========================================================================== workflow


def _schedule_to_proto(v: ir.CronSchedule) -> pb.CronSchedule:
    return pb.CronSchedule(
        schedule=v.schedule,
        timezone=v.timezone,
        concurrency_policy=_CONCURRENCY_POLICY.encode(v.concurrency_policy),
        starting_deadline_seconds=v.starting_deadline_seconds,
        successful_history_limit=v.successful_history_limit,
        failed_history_limit=v.failed_history_limit,
        suspend=v.suspend,
    )


def _schedule_from_proto(m: pb.CronSchedule) -> ir.CronSchedule:
    policy_default = _default(ir.CronSchedule, "concurrency_policy")
    return ir.CronSchedule(
        schedule=m.schedule,
        timezone=m.timezone,
        concurrency_policy=_CONCURRENCY_POLICY.decode(
            m.concurrency_policy, "CronSchedule.concurrency_policy", policy_default
        ),
        starting_deadline_seconds=(
            m.starting_deadline_seconds if m.HasField("starting_deadline_seconds") else None
        ),
        successful_history_limit=(
            m.successful_history_limit if m.HasField("successful_history_limit") else None
        ),
        failed_history_limit=(
            m.failed_history_limit if m.HasField("failed_history_limit") else None
        ),
        suspend=m.suspend,
    )


def _defaults_to_proto(v: ir.StepDefaults) -> pb.StepDefaults:
    return pb.StepDefaults(
        retry=_opt(_retry_to_proto, v.retry),
        timeout_seconds=v.timeout_seconds,
        resources=_opt(_resources_to_proto, v.resources),
        cache=_opt(_cache_to_proto, v.cache),
        priority=v.priority,
    )


def _defaults_from_proto(m: pb.StepDefaults) -> ir.StepDefaults:
    return ir.StepDefaults(
        retry=_retry_from_proto(m.retry) if m.HasField("retry") else None,
        timeout_seconds=m.timeout_seconds if m.HasField("timeout_seconds") else None,
        resources=_resources_from_proto(m.resources) if m.HasField("resources") else None,
        cache=_cache_from_proto(m.cache) if m.HasField("cache") else None,
        priority=m.priority if m.HasField("priority") else None,
    )


def _dns_to_proto(v: ir.DnsConfig) -> pb.DnsConfig:
    return pb.DnsConfig(
        policy=v.policy,
        nameservers=v.nameservers,
        searches=v.searches,
        options=_pairs_to_proto(v.options),
    )


def _dns_from_proto(m: pb.DnsConfig) -> ir.DnsConfig:
    return ir.DnsConfig(
        policy=m.policy,
        nameservers=tuple(m.nameservers),
        searches=tuple(m.searches),
        options=_pairs_from_proto(m.options),
    )


def _security_to_proto(v: ir.SecurityContext) -> pb.SecurityContext:
    se = v.se_linux_options
    return pb.SecurityContext(
        run_as_user=v.run_as_user,
        run_as_group=v.run_as_group,
        fs_group=v.fs_group,
        run_as_non_root=v.run_as_non_root,
        se_linux_options=(pb.SELinuxOptions(user=se.user, role=se.role, type=se.type,
                                            level=se.level) if se is not None else None),
    )


def _security_from_proto(m: pb.SecurityContext) -> ir.SecurityContext:
    se = m.se_linux_options
    return ir.SecurityContext(
        run_as_user=m.run_as_user if m.HasField("run_as_user") else None,
        run_as_group=m.run_as_group if m.HasField("run_as_group") else None,
        fs_group=m.fs_group if m.HasField("fs_group") else None,
        run_as_non_root=m.run_as_non_root if m.HasField("run_as_non_root") else None,
        se_linux_options=(ir.SELinuxOptions(user=se.user, role=se.role, type=se.type,
                                            level=se.level)
                          if m.HasField("se_linux_options") else None),
    )


def workflow_to_proto(wf: ir.Workflow) -> pb.Workflow:
    """Encode a workflow as a ``couler.v1.Workflow`` message.

    Raises:
        InvalidWorkflowError: if a value does not fit protobuf (an int outside int64).
    """
    with _located(f"workflow {wf.name!r}"):
        return pb.Workflow(
            name=wf.name,
            steps=[step_to_proto(s) for s in wf.steps],
            parameters=[_parameter_to_proto(p) for p in wf.parameters],
            exit_hooks=[_exit_hook_to_proto(h) for h in wf.exit_hooks],
            schedule=_opt(_schedule_to_proto, wf.schedule),
            triggers=[pb.EventTrigger(subject=t.subject, filter=t.filter) for t in wf.triggers],
            labels=_pairs_to_proto(wf.labels),
            annotations=_pairs_to_proto(wf.annotations),
            tenant=wf.tenant,
            defaults=_defaults_to_proto(wf.defaults),
            volumes=[_volume_to_proto(v) for v in wf.volumes],
            node_selector=_pairs_to_proto(wf.node_selector),
            tolerations=[_toleration_to_proto(t) for t in wf.tolerations],
            service_account=wf.service_account,
            image_pull_secrets=wf.image_pull_secrets,
            dns=_opt(_dns_to_proto, wf.dns),
            security_context=_opt(_security_to_proto, wf.security_context),
            timeout_seconds=wf.timeout_seconds,
            ttl_seconds=wf.ttl_seconds,
            parallelism=wf.parallelism,
        )


def workflow_from_proto(msg: pb.Workflow) -> ir.Workflow:
    """Decode a ``couler.v1.Workflow`` message into the IR.

    Raises:
        InvalidWorkflowError: if the message is malformed (an unset ``oneof`` or
            required field, an unknown enum value); the message names the
            workflow, the step and the field.
    """
    with _located(f"workflow {msg.name!r}"):
        return ir.Workflow(
            name=msg.name,
            steps=tuple(step_from_proto(s) for s in msg.steps),
            parameters=tuple(_parameter_from_proto(p) for p in msg.parameters),
            exit_hooks=tuple(_exit_hook_from_proto(h) for h in msg.exit_hooks),
            schedule=_schedule_from_proto(msg.schedule) if msg.HasField("schedule") else None,
            triggers=tuple(
                ir.EventTrigger(subject=t.subject, filter=t.filter) for t in msg.triggers
            ),
            labels=_pairs_from_proto(msg.labels),
            annotations=_pairs_from_proto(msg.annotations),
            tenant=msg.tenant,
            defaults=(
                _defaults_from_proto(msg.defaults)
                if msg.HasField("defaults")
                else _default(ir.Workflow, "defaults")
            ),
            volumes=tuple(_volume_from_proto(v) for v in msg.volumes),
            node_selector=_pairs_from_proto(msg.node_selector),
            tolerations=tuple(_toleration_from_proto(t) for t in msg.tolerations),
            service_account=msg.service_account,
            image_pull_secrets=tuple(msg.image_pull_secrets),
            dns=_dns_from_proto(msg.dns) if msg.HasField("dns") else None,
            security_context=(
                _security_from_proto(msg.security_context)
                if msg.HasField("security_context")
                else None
            ),
            timeout_seconds=msg.timeout_seconds if msg.HasField("timeout_seconds") else None,
            ttl_seconds=msg.ttl_seconds if msg.HasField("ttl_seconds") else None,
            parallelism=msg.parallelism if msg.HasField("parallelism") else None,
        )
