from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ValueType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_TYPE_UNSPECIFIED: _ClassVar[ValueType]
    VALUE_TYPE_STRING: _ClassVar[ValueType]
    VALUE_TYPE_INT: _ClassVar[ValueType]
    VALUE_TYPE_FLOAT: _ClassVar[ValueType]
    VALUE_TYPE_BOOL: _ClassVar[ValueType]
    VALUE_TYPE_LIST: _ClassVar[ValueType]
    VALUE_TYPE_JSON: _ClassVar[ValueType]

class OutputSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_SOURCE_UNSPECIFIED: _ClassVar[OutputSource]
    OUTPUT_SOURCE_PATH: _ClassVar[OutputSource]
    OUTPUT_SOURCE_STDOUT: _ClassVar[OutputSource]
    OUTPUT_SOURCE_JSON_PATH: _ClassVar[OutputSource]
    OUTPUT_SOURCE_JQ: _ClassVar[OutputSource]

class StorageKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_KIND_UNSPECIFIED: _ClassVar[StorageKind]
    STORAGE_KIND_DEFAULT: _ClassVar[StorageKind]
    STORAGE_KIND_LOCAL: _ClassVar[StorageKind]
    STORAGE_KIND_S3: _ClassVar[StorageKind]
    STORAGE_KIND_OSS: _ClassVar[StorageKind]
    STORAGE_KIND_GCS: _ClassVar[StorageKind]
    STORAGE_KIND_HDFS: _ClassVar[StorageKind]
    STORAGE_KIND_GIT: _ClassVar[StorageKind]
    STORAGE_KIND_HTTP: _ClassVar[StorageKind]

class EdgeCondition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EDGE_CONDITION_UNSPECIFIED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_SUCCEEDED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_FAILED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_ERRORED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_SKIPPED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_COMPLETED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_ANY: _ClassVar[EdgeCondition]
    EDGE_CONDITION_SUCCEEDED_ONLY: _ClassVar[EdgeCondition]
    EDGE_CONDITION_OMITTED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_ANY_SUCCEEDED: _ClassVar[EdgeCondition]
    EDGE_CONDITION_ALL_FAILED: _ClassVar[EdgeCondition]

class CompareOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPARE_OP_UNSPECIFIED: _ClassVar[CompareOp]
    COMPARE_OP_EQ: _ClassVar[CompareOp]
    COMPARE_OP_NE: _ClassVar[CompareOp]
    COMPARE_OP_GT: _ClassVar[CompareOp]
    COMPARE_OP_LT: _ClassVar[CompareOp]
    COMPARE_OP_GE: _ClassVar[CompareOp]
    COMPARE_OP_LE: _ClassVar[CompareOp]

class TuneKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUNE_KIND_UNSPECIFIED: _ClassVar[TuneKind]
    TUNE_KIND_UNIFORM: _ClassVar[TuneKind]
    TUNE_KIND_LOGUNIFORM: _ClassVar[TuneKind]
    TUNE_KIND_INT: _ClassVar[TuneKind]
    TUNE_KIND_CHOICE: _ClassVar[TuneKind]

class TuneDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUNE_DIRECTION_UNSPECIFIED: _ClassVar[TuneDirection]
    TUNE_DIRECTION_MAXIMIZE: _ClassVar[TuneDirection]
    TUNE_DIRECTION_MINIMIZE: _ClassVar[TuneDirection]

class TuneSampler(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUNE_SAMPLER_UNSPECIFIED: _ClassVar[TuneSampler]
    TUNE_SAMPLER_TPE: _ClassVar[TuneSampler]
    TUNE_SAMPLER_RANDOM: _ClassVar[TuneSampler]
    TUNE_SAMPLER_CMAES: _ClassVar[TuneSampler]
    TUNE_SAMPLER_GRID: _ClassVar[TuneSampler]

class TunePruner(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUNE_PRUNER_UNSPECIFIED: _ClassVar[TunePruner]
    TUNE_PRUNER_MEDIAN: _ClassVar[TunePruner]
    TUNE_PRUNER_NONE: _ClassVar[TunePruner]

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_SUCCEEDED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_ERROR: _ClassVar[RunStatus]
    RUN_STATUS_ANY: _ClassVar[RunStatus]

class FailureClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_CLASS_UNSPECIFIED: _ClassVar[FailureClass]
    FAILURE_CLASS_TRANSIENT: _ClassVar[FailureClass]
    FAILURE_CLASS_INFRA: _ClassVar[FailureClass]
    FAILURE_CLASS_OOM: _ClassVar[FailureClass]
    FAILURE_CLASS_ANY: _ClassVar[FailureClass]
    FAILURE_CLASS_USER: _ClassVar[FailureClass]

class VolumeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VOLUME_KIND_UNSPECIFIED: _ClassVar[VolumeKind]
    VOLUME_KIND_PVC: _ClassVar[VolumeKind]
    VOLUME_KIND_CLAIM_TEMPLATE: _ClassVar[VolumeKind]
    VOLUME_KIND_EMPTY_DIR: _ClassVar[VolumeKind]
    VOLUME_KIND_CONFIG_MAP: _ClassVar[VolumeKind]
    VOLUME_KIND_SECRET: _ClassVar[VolumeKind]

class ScriptLanguage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCRIPT_LANGUAGE_UNSPECIFIED: _ClassVar[ScriptLanguage]
    SCRIPT_LANGUAGE_PYTHON: _ClassVar[ScriptLanguage]
    SCRIPT_LANGUAGE_BASH: _ClassVar[ScriptLanguage]
    SCRIPT_LANGUAGE_SH: _ClassVar[ScriptLanguage]

class JobAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_ACTION_UNSPECIFIED: _ClassVar[JobAction]
    JOB_ACTION_CREATE: _ClassVar[JobAction]
    JOB_ACTION_APPLY: _ClassVar[JobAction]
    JOB_ACTION_REPLACE: _ClassVar[JobAction]
    JOB_ACTION_PATCH: _ClassVar[JobAction]
    JOB_ACTION_DELETE: _ClassVar[JobAction]

class ConcurrencyPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONCURRENCY_POLICY_UNSPECIFIED: _ClassVar[ConcurrencyPolicy]
    CONCURRENCY_POLICY_ALLOW: _ClassVar[ConcurrencyPolicy]
    CONCURRENCY_POLICY_FORBID: _ClassVar[ConcurrencyPolicy]
    CONCURRENCY_POLICY_REPLACE: _ClassVar[ConcurrencyPolicy]
VALUE_TYPE_UNSPECIFIED: ValueType
VALUE_TYPE_STRING: ValueType
VALUE_TYPE_INT: ValueType
VALUE_TYPE_FLOAT: ValueType
VALUE_TYPE_BOOL: ValueType
VALUE_TYPE_LIST: ValueType
VALUE_TYPE_JSON: ValueType
OUTPUT_SOURCE_UNSPECIFIED: OutputSource
OUTPUT_SOURCE_PATH: OutputSource
OUTPUT_SOURCE_STDOUT: OutputSource
OUTPUT_SOURCE_JSON_PATH: OutputSource
OUTPUT_SOURCE_JQ: OutputSource
STORAGE_KIND_UNSPECIFIED: StorageKind
STORAGE_KIND_DEFAULT: StorageKind
STORAGE_KIND_LOCAL: StorageKind
STORAGE_KIND_S3: StorageKind
STORAGE_KIND_OSS: StorageKind
STORAGE_KIND_GCS: StorageKind
STORAGE_KIND_HDFS: StorageKind
STORAGE_KIND_GIT: StorageKind
STORAGE_KIND_HTTP: StorageKind
EDGE_CONDITION_UNSPECIFIED: EdgeCondition
EDGE_CONDITION_SUCCEEDED: EdgeCondition
EDGE_CONDITION_FAILED: EdgeCondition
EDGE_CONDITION_ERRORED: EdgeCondition
EDGE_CONDITION_SKIPPED: EdgeCondition
EDGE_CONDITION_COMPLETED: EdgeCondition
EDGE_CONDITION_ANY: EdgeCondition
EDGE_CONDITION_SUCCEEDED_ONLY: EdgeCondition
EDGE_CONDITION_OMITTED: EdgeCondition
EDGE_CONDITION_ANY_SUCCEEDED: EdgeCondition
EDGE_CONDITION_ALL_FAILED: EdgeCondition
COMPARE_OP_UNSPECIFIED: CompareOp
COMPARE_OP_EQ: CompareOp
COMPARE_OP_NE: CompareOp
COMPARE_OP_GT: CompareOp
COMPARE_OP_LT: CompareOp
COMPARE_OP_GE: CompareOp
COMPARE_OP_LE: CompareOp
TUNE_KIND_UNSPECIFIED: TuneKind
TUNE_KIND_UNIFORM: TuneKind
TUNE_KIND_LOGUNIFORM: TuneKind
TUNE_KIND_INT: TuneKind
TUNE_KIND_CHOICE: TuneKind
TUNE_DIRECTION_UNSPECIFIED: TuneDirection
TUNE_DIRECTION_MAXIMIZE: TuneDirection
TUNE_DIRECTION_MINIMIZE: TuneDirection
TUNE_SAMPLER_UNSPECIFIED: TuneSampler
TUNE_SAMPLER_TPE: TuneSampler
TUNE_SAMPLER_RANDOM: TuneSampler
TUNE_SAMPLER_CMAES: TuneSampler
TUNE_SAMPLER_GRID: TuneSampler
TUNE_PRUNER_UNSPECIFIED: TunePruner
TUNE_PRUNER_MEDIAN: TunePruner
TUNE_PRUNER_NONE: TunePruner
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_SUCCEEDED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_ERROR: RunStatus
RUN_STATUS_ANY: RunStatus
FAILURE_CLASS_UNSPECIFIED: FailureClass
FAILURE_CLASS_TRANSIENT: FailureClass
FAILURE_CLASS_INFRA: FailureClass
FAILURE_CLASS_OOM: FailureClass
FAILURE_CLASS_ANY: FailureClass
FAILURE_CLASS_USER: FailureClass
VOLUME_KIND_UNSPECIFIED: VolumeKind
VOLUME_KIND_PVC: VolumeKind
VOLUME_KIND_CLAIM_TEMPLATE: VolumeKind
VOLUME_KIND_EMPTY_DIR: VolumeKind
VOLUME_KIND_CONFIG_MAP: VolumeKind
VOLUME_KIND_SECRET: VolumeKind
SCRIPT_LANGUAGE_UNSPECIFIED: ScriptLanguage
SCRIPT_LANGUAGE_PYTHON: ScriptLanguage
SCRIPT_LANGUAGE_BASH: ScriptLanguage
SCRIPT_LANGUAGE_SH: ScriptLanguage
JOB_ACTION_UNSPECIFIED: JobAction
JOB_ACTION_CREATE: JobAction
JOB_ACTION_APPLY: JobAction
JOB_ACTION_REPLACE: JobAction
JOB_ACTION_PATCH: JobAction
JOB_ACTION_DELETE: JobAction
CONCURRENCY_POLICY_UNSPECIFIED: ConcurrencyPolicy
CONCURRENCY_POLICY_ALLOW: ConcurrencyPolicy
CONCURRENCY_POLICY_FORBID: ConcurrencyPolicy
CONCURRENCY_POLICY_REPLACE: ConcurrencyPolicy

class Literal(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class StepOutputRef(_message.Message):
    __slots__ = ("step", "output")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    step: str
    output: str
    def __init__(self, step: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class WorkflowParamRef(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ItemRef(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ValueSource(_message.Message):
    __slots__ = ("literal", "step_output", "workflow_param", "item")
    LITERAL_FIELD_NUMBER: _ClassVar[int]
    STEP_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_PARAM_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    literal: Literal
    step_output: StepOutputRef
    workflow_param: WorkflowParamRef
    item: ItemRef
    def __init__(self, literal: _Optional[_Union[Literal, _Mapping]] = ..., step_output: _Optional[_Union[StepOutputRef, _Mapping]] = ..., workflow_param: _Optional[_Union[WorkflowParamRef, _Mapping]] = ..., item: _Optional[_Union[ItemRef, _Mapping]] = ...) -> None: ...

class SecretRef(_message.Message):
    __slots__ = ("name", "key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class StringPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Parameter(_message.Message):
    __slots__ = ("name", "type", "default", "description", "enum")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ENUM_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: ValueType
    default: Literal
    description: str
    enum: _containers.RepeatedCompositeFieldContainer[Literal]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[ValueType, str]] = ..., default: _Optional[_Union[Literal, _Mapping]] = ..., description: _Optional[str] = ..., enum: _Optional[_Iterable[_Union[Literal, _Mapping]]] = ...) -> None: ...

class InputParameter(_message.Message):
    __slots__ = ("name", "value", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: ValueSource
    type: ValueType
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[ValueSource, _Mapping]] = ..., type: _Optional[_Union[ValueType, str]] = ...) -> None: ...

class OutputParameter(_message.Message):
    __slots__ = ("name", "source", "selector", "type", "global_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: OutputSource
    selector: str
    type: ValueType
    global_name: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[_Union[OutputSource, str]] = ..., selector: _Optional[str] = ..., type: _Optional[_Union[ValueType, str]] = ..., global_name: _Optional[str] = ...) -> None: ...

class ArtifactLocation(_message.Message):
    __slots__ = ("storage", "endpoint", "bucket", "key", "url", "revision", "insecure", "access_key", "secret_key")
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_KEY_FIELD_NUMBER: _ClassVar[int]
    storage: StorageKind
    endpoint: str
    bucket: str
    key: str
    url: str
    revision: str
    insecure: bool
    access_key: SecretRef
    secret_key: SecretRef
    def __init__(self, storage: _Optional[_Union[StorageKind, str]] = ..., endpoint: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ..., url: _Optional[str] = ..., revision: _Optional[str] = ..., insecure: _Optional[bool] = ..., access_key: _Optional[_Union[SecretRef, _Mapping]] = ..., secret_key: _Optional[_Union[SecretRef, _Mapping]] = ...) -> None: ...

class StepArtifactRef(_message.Message):
    __slots__ = ("step", "artifact")
    STEP_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    step: str
    artifact: str
    def __init__(self, step: _Optional[str] = ..., artifact: _Optional[str] = ...) -> None: ...

class InputArtifact(_message.Message):
    __slots__ = ("name", "path", "location", "step_artifact")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    STEP_ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    location: ArtifactLocation
    step_artifact: StepArtifactRef
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., location: _Optional[_Union[ArtifactLocation, _Mapping]] = ..., step_artifact: _Optional[_Union[StepArtifactRef, _Mapping]] = ...) -> None: ...

class OutputArtifact(_message.Message):
    __slots__ = ("name", "path", "location", "digest", "global_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    location: ArtifactLocation
    digest: str
    global_name: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., location: _Optional[_Union[ArtifactLocation, _Mapping]] = ..., digest: _Optional[str] = ..., global_name: _Optional[str] = ...) -> None: ...

class Dependency(_message.Message):
    __slots__ = ("step", "condition")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    step: str
    condition: EdgeCondition
    def __init__(self, step: _Optional[str] = ..., condition: _Optional[_Union[EdgeCondition, str]] = ...) -> None: ...

class DependsTerm(_message.Message):
    __slots__ = ("step", "condition")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    step: str
    condition: EdgeCondition
    def __init__(self, step: _Optional[str] = ..., condition: _Optional[_Union[EdgeCondition, str]] = ...) -> None: ...

class DependsAll(_message.Message):
    __slots__ = ("terms",)
    TERMS_FIELD_NUMBER: _ClassVar[int]
    terms: _containers.RepeatedCompositeFieldContainer[DependsExpr]
    def __init__(self, terms: _Optional[_Iterable[_Union[DependsExpr, _Mapping]]] = ...) -> None: ...

class DependsAny(_message.Message):
    __slots__ = ("terms",)
    TERMS_FIELD_NUMBER: _ClassVar[int]
    terms: _containers.RepeatedCompositeFieldContainer[DependsExpr]
    def __init__(self, terms: _Optional[_Iterable[_Union[DependsExpr, _Mapping]]] = ...) -> None: ...

class DependsNot(_message.Message):
    __slots__ = ("term",)
    TERM_FIELD_NUMBER: _ClassVar[int]
    term: DependsExpr
    def __init__(self, term: _Optional[_Union[DependsExpr, _Mapping]] = ...) -> None: ...

class DependsExpr(_message.Message):
    __slots__ = ("term", "all_of", "any_of", "negation")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ALL_OF_FIELD_NUMBER: _ClassVar[int]
    ANY_OF_FIELD_NUMBER: _ClassVar[int]
    NEGATION_FIELD_NUMBER: _ClassVar[int]
    term: DependsTerm
    all_of: DependsAll
    any_of: DependsAny
    negation: DependsNot
    def __init__(self, term: _Optional[_Union[DependsTerm, _Mapping]] = ..., all_of: _Optional[_Union[DependsAll, _Mapping]] = ..., any_of: _Optional[_Union[DependsAny, _Mapping]] = ..., negation: _Optional[_Union[DependsNot, _Mapping]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("left", "op", "right")
    LEFT_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    left: ValueSource
    op: CompareOp
    right: ValueSource
    def __init__(self, left: _Optional[_Union[ValueSource, _Mapping]] = ..., op: _Optional[_Union[CompareOp, str]] = ..., right: _Optional[_Union[ValueSource, _Mapping]] = ...) -> None: ...

class When(_message.Message):
    __slots__ = ("condition", "expect")
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    condition: Condition
    expect: bool
    def __init__(self, condition: _Optional[_Union[Condition, _Mapping]] = ..., expect: _Optional[bool] = ...) -> None: ...

class ForEach(_message.Message):
    __slots__ = ("items", "step_output", "workflow_param", "parallelism")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    STEP_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_PARAM_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Literal]
    step_output: StepOutputRef
    workflow_param: WorkflowParamRef
    parallelism: int
    def __init__(self, items: _Optional[_Iterable[_Union[Literal, _Mapping]]] = ..., step_output: _Optional[_Union[StepOutputRef, _Mapping]] = ..., workflow_param: _Optional[_Union[WorkflowParamRef, _Mapping]] = ..., parallelism: _Optional[int] = ...) -> None: ...

class Loop(_message.Message):
    __slots__ = ("condition", "max_iterations")
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    condition: Condition
    max_iterations: int
    def __init__(self, condition: _Optional[_Union[Condition, _Mapping]] = ..., max_iterations: _Optional[int] = ...) -> None: ...

class TuneParam(_message.Message):
    __slots__ = ("name", "kind", "low", "high", "step", "log", "choices")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: TuneKind
    low: float
    high: float
    step: float
    log: bool
    choices: _containers.RepeatedCompositeFieldContainer[Literal]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[TuneKind, str]] = ..., low: _Optional[float] = ..., high: _Optional[float] = ..., step: _Optional[float] = ..., log: _Optional[bool] = ..., choices: _Optional[_Iterable[_Union[Literal, _Mapping]]] = ...) -> None: ...

class Tune(_message.Message):
    __slots__ = ("space", "objective", "trials", "parallel", "direction", "sampler", "pruner", "seed", "storage", "image")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    PRUNER_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    space: _containers.RepeatedCompositeFieldContainer[TuneParam]
    objective: str
    trials: int
    parallel: int
    direction: TuneDirection
    sampler: TuneSampler
    pruner: TunePruner
    seed: int
    storage: SecretRef
    image: str
    def __init__(self, space: _Optional[_Iterable[_Union[TuneParam, _Mapping]]] = ..., objective: _Optional[str] = ..., trials: _Optional[int] = ..., parallel: _Optional[int] = ..., direction: _Optional[_Union[TuneDirection, str]] = ..., sampler: _Optional[_Union[TuneSampler, str]] = ..., pruner: _Optional[_Union[TunePruner, str]] = ..., seed: _Optional[int] = ..., storage: _Optional[_Union[SecretRef, _Mapping]] = ..., image: _Optional[str] = ...) -> None: ...

class Backoff(_message.Message):
    __slots__ = ("base_seconds", "factor", "cap_seconds")
    BASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    CAP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    base_seconds: float
    factor: float
    cap_seconds: float
    def __init__(self, base_seconds: _Optional[float] = ..., factor: _Optional[float] = ..., cap_seconds: _Optional[float] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("limit", "backoff", "on", "memory_factor", "memory_ceiling")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    ON_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CEILING_FIELD_NUMBER: _ClassVar[int]
    limit: int
    backoff: Backoff
    on: _containers.RepeatedScalarFieldContainer[FailureClass]
    memory_factor: float
    memory_ceiling: str
    def __init__(self, limit: _Optional[int] = ..., backoff: _Optional[_Union[Backoff, _Mapping]] = ..., on: _Optional[_Iterable[_Union[FailureClass, str]]] = ..., memory_factor: _Optional[float] = ..., memory_ceiling: _Optional[str] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "gpu", "gpu_resource")
    CPU_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CPU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str
    gpu: int
    gpu_resource: str
    def __init__(self, cpu_request: _Optional[str] = ..., cpu_limit: _Optional[str] = ..., memory_request: _Optional[str] = ..., memory_limit: _Optional[str] = ..., gpu: _Optional[int] = ..., gpu_resource: _Optional[str] = ...) -> None: ...

class CachePolicy(_message.Message):
    __slots__ = ("enabled", "salt", "max_age_seconds", "key", "name")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    salt: str
    max_age_seconds: int
    key: str
    name: str
    def __init__(self, enabled: _Optional[bool] = ..., salt: _Optional[str] = ..., max_age_seconds: _Optional[int] = ..., key: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Toleration(_message.Message):
    __slots__ = ("key", "operator", "value", "effect", "toleration_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    TOLERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    value: str
    effect: str
    toleration_seconds: int
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ..., toleration_seconds: _Optional[int] = ...) -> None: ...

class Volume(_message.Message):
    __slots__ = ("name", "kind", "claim_name", "size", "access_modes", "storage_class")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_CLASS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: VolumeKind
    claim_name: str
    size: str
    access_modes: _containers.RepeatedScalarFieldContainer[str]
    storage_class: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[VolumeKind, str]] = ..., claim_name: _Optional[str] = ..., size: _Optional[str] = ..., access_modes: _Optional[_Iterable[str]] = ..., storage_class: _Optional[str] = ...) -> None: ...

class VolumeMount(_message.Message):
    __slots__ = ("name", "mount_path", "read_only", "sub_path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SUB_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    mount_path: str
    read_only: bool
    sub_path: str
    def __init__(self, name: _Optional[str] = ..., mount_path: _Optional[str] = ..., read_only: _Optional[bool] = ..., sub_path: _Optional[str] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value", "secret")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    secret: SecretRef
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., secret: _Optional[_Union[SecretRef, _Mapping]] = ...) -> None: ...

class ContainerSpec(_message.Message):
    __slots__ = ("image", "command", "args", "working_dir", "image_pull_policy")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_POLICY_FIELD_NUMBER: _ClassVar[int]
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    working_dir: str
    image_pull_policy: str
    def __init__(self, image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., working_dir: _Optional[str] = ..., image_pull_policy: _Optional[str] = ...) -> None: ...

class ScriptSpec(_message.Message):
    __slots__ = ("image", "source", "language", "command", "args", "working_dir", "image_pull_policy")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_POLICY_FIELD_NUMBER: _ClassVar[int]
    image: str
    source: str
    language: ScriptLanguage
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    working_dir: str
    image_pull_policy: str
    def __init__(self, image: _Optional[str] = ..., source: _Optional[str] = ..., language: _Optional[_Union[ScriptLanguage, str]] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., working_dir: _Optional[str] = ..., image_pull_policy: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("manifest", "action", "success_condition", "failure_condition", "set_owner_reference")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_CONDITION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CONDITION_FIELD_NUMBER: _ClassVar[int]
    SET_OWNER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    manifest: str
    action: JobAction
    success_condition: str
    failure_condition: str
    set_owner_reference: bool
    def __init__(self, manifest: _Optional[str] = ..., action: _Optional[_Union[JobAction, str]] = ..., success_condition: _Optional[str] = ..., failure_condition: _Optional[str] = ..., set_owner_reference: _Optional[bool] = ...) -> None: ...

class SubWorkflowSpec(_message.Message):
    __slots__ = ("name", "steps", "digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    digest: str
    def __init__(self, name: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., digest: _Optional[str] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("name", "container", "script", "job", "subworkflow", "template", "inputs", "outputs", "input_artifacts", "output_artifacts", "env", "dependencies", "depends", "when", "foreach", "loop", "retry", "timeout_seconds", "resources", "cache", "priority", "node_selector", "tolerations", "volume_mounts", "daemon", "parallelism", "labels", "tune")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    SUBWORKFLOW_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    FOREACH_FIELD_NUMBER: _ClassVar[int]
    LOOP_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    VOLUME_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    DAEMON_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TUNE_FIELD_NUMBER: _ClassVar[int]
    name: str
    container: ContainerSpec
    script: ScriptSpec
    job: JobSpec
    subworkflow: SubWorkflowSpec
    template: str
    inputs: _containers.RepeatedCompositeFieldContainer[InputParameter]
    outputs: _containers.RepeatedCompositeFieldContainer[OutputParameter]
    input_artifacts: _containers.RepeatedCompositeFieldContainer[InputArtifact]
    output_artifacts: _containers.RepeatedCompositeFieldContainer[OutputArtifact]
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    dependencies: _containers.RepeatedCompositeFieldContainer[Dependency]
    depends: DependsExpr
    when: When
    foreach: ForEach
    loop: Loop
    retry: RetryPolicy
    timeout_seconds: int
    resources: Resources
    cache: CachePolicy
    priority: int
    node_selector: _containers.RepeatedCompositeFieldContainer[StringPair]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    volume_mounts: _containers.RepeatedCompositeFieldContainer[VolumeMount]
    daemon: bool
    parallelism: int
    labels: _containers.RepeatedCompositeFieldContainer[StringPair]
    tune: Tune
    def __init__(self, name: _Optional[str] = ..., container: _Optional[_Union[ContainerSpec, _Mapping]] = ..., script: _Optional[_Union[ScriptSpec, _Mapping]] = ..., job: _Optional[_Union[JobSpec, _Mapping]] = ..., subworkflow: _Optional[_Union[SubWorkflowSpec, _Mapping]] = ..., template: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[InputParameter, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[OutputParameter, _Mapping]]] = ..., input_artifacts: _Optional[_Iterable[_Union[InputArtifact, _Mapping]]] = ..., output_artifacts: _Optional[_Iterable[_Union[OutputArtifact, _Mapping]]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., dependencies: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ..., depends: _Optional[_Union[DependsExpr, _Mapping]] = ..., when: _Optional[_Union[When, _Mapping]] = ..., foreach: _Optional[_Union[ForEach, _Mapping]] = ..., loop: _Optional[_Union[Loop, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., timeout_seconds: _Optional[int] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., cache: _Optional[_Union[CachePolicy, _Mapping]] = ..., priority: _Optional[int] = ..., node_selector: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ..., volume_mounts: _Optional[_Iterable[_Union[VolumeMount, _Mapping]]] = ..., daemon: _Optional[bool] = ..., parallelism: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ..., tune: _Optional[_Union[Tune, _Mapping]] = ...) -> None: ...

class ExitHook(_message.Message):
    __slots__ = ("on", "steps")
    ON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    on: RunStatus
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    def __init__(self, on: _Optional[_Union[RunStatus, str]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ...) -> None: ...

class CronSchedule(_message.Message):
    __slots__ = ("schedule", "timezone", "concurrency_policy", "starting_deadline_seconds", "successful_history_limit", "failed_history_limit", "suspend")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_POLICY_FIELD_NUMBER: _ClassVar[int]
    STARTING_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUCCESSFUL_HISTORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    FAILED_HISTORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    schedule: str
    timezone: str
    concurrency_policy: ConcurrencyPolicy
    starting_deadline_seconds: int
    successful_history_limit: int
    failed_history_limit: int
    suspend: bool
    def __init__(self, schedule: _Optional[str] = ..., timezone: _Optional[str] = ..., concurrency_policy: _Optional[_Union[ConcurrencyPolicy, str]] = ..., starting_deadline_seconds: _Optional[int] = ..., successful_history_limit: _Optional[int] = ..., failed_history_limit: _Optional[int] = ..., suspend: _Optional[bool] = ...) -> None: ...

class EventTrigger(_message.Message):
    __slots__ = ("subject", "filter")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    subject: str
    filter: str
    def __init__(self, subject: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class StepDefaults(_message.Message):
    __slots__ = ("retry", "timeout_seconds", "resources", "cache", "priority")
    RETRY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    retry: RetryPolicy
    timeout_seconds: int
    resources: Resources
    cache: CachePolicy
    priority: int
    def __init__(self, retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., timeout_seconds: _Optional[int] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., cache: _Optional[_Union[CachePolicy, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class DnsConfig(_message.Message):
    __slots__ = ("policy", "nameservers", "searches", "options")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NAMESERVERS_FIELD_NUMBER: _ClassVar[int]
    SEARCHES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    nameservers: _containers.RepeatedScalarFieldContainer[str]
    searches: _containers.RepeatedScalarFieldContainer[str]
    options: _containers.RepeatedCompositeFieldContainer[StringPair]
    def __init__(self, policy: _Optional[str] = ..., nameservers: _Optional[_Iterable[str]] = ..., searches: _Optional[_Iterable[str]] = ..., options: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ...) -> None: ...

class SELinuxOptions(_message.Message):
    __slots__ = ("user", "role", "type", "level")
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    user: str
    role: str
    type: str
    level: str
    def __init__(self, user: _Optional[str] = ..., role: _Optional[str] = ..., type: _Optional[str] = ..., level: _Optional[str] = ...) -> None: ...

class SecurityContext(_message.Message):
    __slots__ = ("run_as_user", "run_as_group", "fs_group", "run_as_non_root", "se_linux_options")
    RUN_AS_USER_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_GROUP_FIELD_NUMBER: _ClassVar[int]
    FS_GROUP_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_NON_ROOT_FIELD_NUMBER: _ClassVar[int]
    SE_LINUX_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    run_as_user: int
    run_as_group: int
    fs_group: int
    run_as_non_root: bool
    se_linux_options: SELinuxOptions
    def __init__(self, run_as_user: _Optional[int] = ..., run_as_group: _Optional[int] = ..., fs_group: _Optional[int] = ..., run_as_non_root: _Optional[bool] = ..., se_linux_options: _Optional[_Union[SELinuxOptions, _Mapping]] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("name", "steps", "parameters", "exit_hooks", "schedule", "triggers", "labels", "annotations", "tenant", "defaults", "volumes", "node_selector", "tolerations", "service_account", "image_pull_secrets", "dns", "security_context", "timeout_seconds", "ttl_seconds", "parallelism")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    EXIT_HOOKS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_SECRETS_FIELD_NUMBER: _ClassVar[int]
    DNS_FIELD_NUMBER: _ClassVar[int]
    SECURITY_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    name: str
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    parameters: _containers.RepeatedCompositeFieldContainer[Parameter]
    exit_hooks: _containers.RepeatedCompositeFieldContainer[ExitHook]
    schedule: CronSchedule
    triggers: _containers.RepeatedCompositeFieldContainer[EventTrigger]
    labels: _containers.RepeatedCompositeFieldContainer[StringPair]
    annotations: _containers.RepeatedCompositeFieldContainer[StringPair]
    tenant: str
    defaults: StepDefaults
    volumes: _containers.RepeatedCompositeFieldContainer[Volume]
    node_selector: _containers.RepeatedCompositeFieldContainer[StringPair]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    service_account: str
    image_pull_secrets: _containers.RepeatedScalarFieldContainer[str]
    dns: DnsConfig
    security_context: SecurityContext
    timeout_seconds: int
    ttl_seconds: int
    parallelism: int
    def __init__(self, name: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., parameters: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ..., exit_hooks: _Optional[_Iterable[_Union[ExitHook, _Mapping]]] = ..., schedule: _Optional[_Union[CronSchedule, _Mapping]] = ..., triggers: _Optional[_Iterable[_Union[EventTrigger, _Mapping]]] = ..., labels: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ..., annotations: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ..., tenant: _Optional[str] = ..., defaults: _Optional[_Union[StepDefaults, _Mapping]] = ..., volumes: _Optional[_Iterable[_Union[Volume, _Mapping]]] = ..., node_selector: _Optional[_Iterable[_Union[StringPair, _Mapping]]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ..., service_account: _Optional[str] = ..., image_pull_secrets: _Optional[_Iterable[str]] = ..., dns: _Optional[_Union[DnsConfig, _Mapping]] = ..., security_context: _Optional[_Union[SecurityContext, _Mapping]] = ..., timeout_seconds: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., parallelism: _Optional[int] = ...) -> None: ...
