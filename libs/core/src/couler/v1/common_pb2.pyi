import datetime

from couler.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_ACCEPTED: _ClassVar[RunState]
    RUN_STATE_PLANNING: _ClassVar[RunState]
    RUN_STATE_PENDING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]

class StepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATE_UNSPECIFIED: _ClassVar[StepState]
    STEP_STATE_PENDING: _ClassVar[StepState]
    STEP_STATE_RUNNING: _ClassVar[StepState]
    STEP_STATE_SUCCEEDED: _ClassVar[StepState]
    STEP_STATE_FAILED: _ClassVar[StepState]
    STEP_STATE_SKIPPED: _ClassVar[StepState]
    STEP_STATE_CACHED: _ClassVar[StepState]
    STEP_STATE_RETRYING: _ClassVar[StepState]
    STEP_STATE_CANCELLED: _ClassVar[StepState]
    STEP_STATE_PRUNED: _ClassVar[StepState]

class Objective(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECTIVE_UNSPECIFIED: _ClassVar[Objective]
    OBJECTIVE_LATENCY: _ClassVar[Objective]
    OBJECTIVE_COST: _ClassVar[Objective]
    OBJECTIVE_RELIABILITY: _ClassVar[Objective]

class RecommendationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECOMMENDATION_KIND_UNSPECIFIED: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_MEMORY_REQUEST: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_CPU_REQUEST: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_RETRY: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_TIMEOUT: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_MEMORY_LIMIT: _ClassVar[RecommendationKind]
    RECOMMENDATION_KIND_RETRY_BACKOFF: _ClassVar[RecommendationKind]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_ACCEPTED: RunState
RUN_STATE_PLANNING: RunState
RUN_STATE_PENDING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_CANCELLED: RunState
STEP_STATE_UNSPECIFIED: StepState
STEP_STATE_PENDING: StepState
STEP_STATE_RUNNING: StepState
STEP_STATE_SUCCEEDED: StepState
STEP_STATE_FAILED: StepState
STEP_STATE_SKIPPED: StepState
STEP_STATE_CACHED: StepState
STEP_STATE_RETRYING: StepState
STEP_STATE_CANCELLED: StepState
STEP_STATE_PRUNED: StepState
OBJECTIVE_UNSPECIFIED: Objective
OBJECTIVE_LATENCY: Objective
OBJECTIVE_COST: Objective
OBJECTIVE_RELIABILITY: Objective
RECOMMENDATION_KIND_UNSPECIFIED: RecommendationKind
RECOMMENDATION_KIND_MEMORY_REQUEST: RecommendationKind
RECOMMENDATION_KIND_CPU_REQUEST: RecommendationKind
RECOMMENDATION_KIND_RETRY: RecommendationKind
RECOMMENDATION_KIND_TIMEOUT: RecommendationKind
RECOMMENDATION_KIND_MEMORY_LIMIT: RecommendationKind
RECOMMENDATION_KIND_RETRY_BACKOFF: RecommendationKind

class StepRecord(_message.Message):
    __slots__ = ("name", "key", "state", "attempts", "exit_code", "started_at", "finished_at", "peak_cpu", "peak_memory_bytes", "outputs", "cache_key", "cached", "message", "failure_class", "artifacts", "cache_lineage", "cache_saved_seconds", "failure_reason")
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ArtifactsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StoredArtifact
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StoredArtifact, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PEAK_CPU_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_SAVED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    state: StepState
    attempts: int
    exit_code: int
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    peak_cpu: float
    peak_memory_bytes: int
    outputs: _containers.ScalarMap[str, str]
    cache_key: str
    cached: bool
    message: str
    failure_class: _workflow_pb2.FailureClass
    artifacts: _containers.MessageMap[str, StoredArtifact]
    cache_lineage: _containers.RepeatedScalarFieldContainer[str]
    cache_saved_seconds: float
    failure_reason: str
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., state: _Optional[_Union[StepState, str]] = ..., attempts: _Optional[int] = ..., exit_code: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., peak_cpu: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., outputs: _Optional[_Mapping[str, str]] = ..., cache_key: _Optional[str] = ..., cached: _Optional[bool] = ..., message: _Optional[str] = ..., failure_class: _Optional[_Union[_workflow_pb2.FailureClass, str]] = ..., artifacts: _Optional[_Mapping[str, StoredArtifact]] = ..., cache_lineage: _Optional[_Iterable[str]] = ..., cache_saved_seconds: _Optional[float] = ..., failure_reason: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "workflow", "state", "engine", "engine_run_id", "steps", "created_at", "started_at", "finished_at", "message", "passes", "idempotency_key", "parameters", "workflow_digest", "template", "dry_run", "revision", "retries", "step_count", "cached_step_count", "next_step_page_token")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNT_FIELD_NUMBER: _ClassVar[int]
    CACHED_STEP_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    state: RunState
    engine: str
    engine_run_id: str
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    message: str
    passes: _containers.RepeatedCompositeFieldContainer[PassReport]
    idempotency_key: str
    parameters: _containers.ScalarMap[str, str]
    workflow_digest: str
    template: str
    dry_run: bool
    revision: int
    retries: int
    step_count: int
    cached_step_count: int
    next_step_page_token: str
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., engine: _Optional[str] = ..., engine_run_id: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ..., passes: _Optional[_Iterable[_Union[PassReport, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., workflow_digest: _Optional[str] = ..., template: _Optional[str] = ..., dry_run: _Optional[bool] = ..., revision: _Optional[int] = ..., retries: _Optional[int] = ..., step_count: _Optional[int] = ..., cached_step_count: _Optional[int] = ..., next_step_page_token: _Optional[str] = ...) -> None: ...

class Template(_message.Message):
    __slots__ = ("name", "workflow", "engine", "workflow_digest", "registered_at", "workflow_ref")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_REF_FIELD_NUMBER: _ClassVar[int]
    name: str
    workflow: _workflow_pb2.Workflow
    engine: str
    workflow_digest: str
    registered_at: _timestamp_pb2.Timestamp
    workflow_ref: BlobRef
    def __init__(self, name: _Optional[str] = ..., workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., engine: _Optional[str] = ..., workflow_digest: _Optional[str] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workflow_ref: _Optional[_Union[BlobRef, _Mapping]] = ...) -> None: ...

class BlobRef(_message.Message):
    __slots__ = ("digest", "size_bytes")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class StoredArtifact(_message.Message):
    __slots__ = ("digest", "size_bytes", "uri")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    uri: str
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class CacheEntry(_message.Message):
    __slots__ = ("key", "workflow", "step", "outputs", "artifacts", "size_bytes", "created_at", "last_used_at", "hits", "cost_seconds", "lineage", "pinned")
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ArtifactsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StoredArtifact
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StoredArtifact, _Mapping]] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    COST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    key: str
    workflow: str
    step: str
    outputs: _containers.ScalarMap[str, str]
    artifacts: _containers.MessageMap[str, StoredArtifact]
    size_bytes: int
    created_at: _timestamp_pb2.Timestamp
    last_used_at: _timestamp_pb2.Timestamp
    hits: int
    cost_seconds: float
    lineage: _containers.RepeatedScalarFieldContainer[str]
    pinned: bool
    def __init__(self, key: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., outputs: _Optional[_Mapping[str, str]] = ..., artifacts: _Optional[_Mapping[str, StoredArtifact]] = ..., size_bytes: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_used_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hits: _Optional[int] = ..., cost_seconds: _Optional[float] = ..., lineage: _Optional[_Iterable[str]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class GenerationReport(_message.Message):
    __slots__ = ("planner", "model", "subtasks", "catalog_steps", "rounds", "repairs", "notes")
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SUBTASKS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    planner: str
    model: str
    subtasks: _containers.RepeatedScalarFieldContainer[str]
    catalog_steps: _containers.RepeatedScalarFieldContainer[str]
    rounds: int
    repairs: _containers.RepeatedScalarFieldContainer[str]
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, planner: _Optional[str] = ..., model: _Optional[str] = ..., subtasks: _Optional[_Iterable[str]] = ..., catalog_steps: _Optional[_Iterable[str]] = ..., rounds: _Optional[int] = ..., repairs: _Optional[_Iterable[str]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class PassReport(_message.Message):
    __slots__ = ("name", "changed", "notes", "duration_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    changed: bool
    notes: _containers.RepeatedScalarFieldContainer[str]
    duration_ms: float
    def __init__(self, name: _Optional[str] = ..., changed: _Optional[bool] = ..., notes: _Optional[_Iterable[str]] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("name", "steps", "depends_on", "workflow", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    steps: _containers.RepeatedScalarFieldContainer[str]
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    workflow: _workflow_pb2.Workflow
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., steps: _Optional[_Iterable[str]] = ..., depends_on: _Optional[_Iterable[str]] = ..., workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("workflow", "engine", "compiled", "cached", "passes", "chunks", "workflow_digest", "stored", "unneeded", "step_keys", "nothing_to_run")
    class CachedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CacheEntry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CacheEntry, _Mapping]] = ...) -> None: ...
    class StepKeysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_DIGEST_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    UNNEEDED_FIELD_NUMBER: _ClassVar[int]
    STEP_KEYS_FIELD_NUMBER: _ClassVar[int]
    NOTHING_TO_RUN_FIELD_NUMBER: _ClassVar[int]
    workflow: _workflow_pb2.Workflow
    engine: str
    compiled: str
    cached: _containers.MessageMap[str, CacheEntry]
    passes: _containers.RepeatedCompositeFieldContainer[PassReport]
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    workflow_digest: str
    stored: BlobRef
    unneeded: _containers.RepeatedScalarFieldContainer[str]
    step_keys: _containers.ScalarMap[str, str]
    nothing_to_run: bool
    def __init__(self, workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., engine: _Optional[str] = ..., compiled: _Optional[str] = ..., cached: _Optional[_Mapping[str, CacheEntry]] = ..., passes: _Optional[_Iterable[_Union[PassReport, _Mapping]]] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., workflow_digest: _Optional[str] = ..., stored: _Optional[_Union[BlobRef, _Mapping]] = ..., unneeded: _Optional[_Iterable[str]] = ..., step_keys: _Optional[_Mapping[str, str]] = ..., nothing_to_run: _Optional[bool] = ...) -> None: ...

class UtilizationSample(_message.Message):
    __slots__ = ("run_id", "workflow", "step", "key", "attempt", "at", "cpu", "memory_bytes", "interval_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    step: str
    key: str
    attempt: int
    at: _timestamp_pb2.Timestamp
    cpu: float
    memory_bytes: int
    interval_seconds: float
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., key: _Optional[str] = ..., attempt: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cpu: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., interval_seconds: _Optional[float] = ...) -> None: ...

class StepPeak(_message.Message):
    __slots__ = ("run_id", "workflow", "step", "key", "peak_cpu", "peak_memory_bytes", "samples")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PEAK_CPU_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    step: str
    key: str
    peak_cpu: float
    peak_memory_bytes: int
    samples: int
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., key: _Optional[str] = ..., peak_cpu: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class Recommendation(_message.Message):
    __slots__ = ("workflow", "step", "kind", "value", "reason", "based_on_samples", "created_at", "failure_class", "id", "target", "lower_bound", "upper_bound", "percentile", "runs", "samples", "span_seconds")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BASED_ON_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LOWER_BOUND_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SPAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    step: str
    kind: RecommendationKind
    value: str
    reason: str
    based_on_samples: int
    created_at: _timestamp_pb2.Timestamp
    failure_class: _workflow_pb2.FailureClass
    id: str
    target: str
    lower_bound: str
    upper_bound: str
    percentile: float
    runs: int
    samples: int
    span_seconds: float
    def __init__(self, workflow: _Optional[str] = ..., step: _Optional[str] = ..., kind: _Optional[_Union[RecommendationKind, str]] = ..., value: _Optional[str] = ..., reason: _Optional[str] = ..., based_on_samples: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_class: _Optional[_Union[_workflow_pb2.FailureClass, str]] = ..., id: _Optional[str] = ..., target: _Optional[str] = ..., lower_bound: _Optional[str] = ..., upper_bound: _Optional[str] = ..., percentile: _Optional[float] = ..., runs: _Optional[int] = ..., samples: _Optional[int] = ..., span_seconds: _Optional[float] = ...) -> None: ...

class Issue(_message.Message):
    __slots__ = ("workflow", "step", "field", "message")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    step: str
    field: str
    message: str
    def __init__(self, workflow: _Optional[str] = ..., step: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("kind", "issues", "engine", "workflow", "step", "feature")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ISSUES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    issues: _containers.RepeatedCompositeFieldContainer[Issue]
    engine: str
    workflow: str
    step: str
    feature: str
    def __init__(self, kind: _Optional[str] = ..., issues: _Optional[_Iterable[_Union[Issue, _Mapping]]] = ..., engine: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., feature: _Optional[str] = ...) -> None: ...
