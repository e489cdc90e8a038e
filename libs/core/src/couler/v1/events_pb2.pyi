import datetime

from couler.v1 import common_pb2 as _common_pb2
from couler.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunOptions(_message.Message):
    __slots__ = ("engine", "parameters", "dry_run", "no_cache", "constraints", "objectives", "tenant")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    NO_CACHE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    engine: str
    parameters: _containers.ScalarMap[str, str]
    dry_run: bool
    no_cache: bool
    constraints: _containers.RepeatedScalarFieldContainer[str]
    objectives: _containers.RepeatedScalarFieldContainer[_common_pb2.Objective]
    tenant: str
    def __init__(self, engine: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., dry_run: _Optional[bool] = ..., no_cache: _Optional[bool] = ..., constraints: _Optional[_Iterable[str]] = ..., objectives: _Optional[_Iterable[_Union[_common_pb2.Objective, str]]] = ..., tenant: _Optional[str] = ...) -> None: ...

class WorkflowRequested(_message.Message):
    __slots__ = ("run_id", "workflow", "text", "options", "template")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: _workflow_pb2.Workflow
    text: str
    options: RunOptions
    template: str
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., text: _Optional[str] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ..., template: _Optional[str] = ...) -> None: ...

class WorkflowGenerated(_message.Message):
    __slots__ = ("run_id", "workflow", "report", "options")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: _workflow_pb2.Workflow
    report: _common_pb2.GenerationReport
    options: RunOptions
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., report: _Optional[_Union[_common_pb2.GenerationReport, _Mapping]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ...) -> None: ...

class WorkflowOptimized(_message.Message):
    __slots__ = ("run_id", "plan", "options")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    plan: _common_pb2.Plan
    options: RunOptions
    def __init__(self, run_id: _Optional[str] = ..., plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ...) -> None: ...

class WorkflowRejected(_message.Message):
    __slots__ = ("run_id", "stage", "reason", "issues")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ISSUES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    stage: str
    reason: str
    issues: _containers.RepeatedCompositeFieldContainer[_common_pb2.Issue]
    def __init__(self, run_id: _Optional[str] = ..., stage: _Optional[str] = ..., reason: _Optional[str] = ..., issues: _Optional[_Iterable[_Union[_common_pb2.Issue, _Mapping]]] = ...) -> None: ...

class DocumentRefused(_message.Message):
    __slots__ = ("run_id", "workflow", "engine", "size_bytes", "reason", "at", "attempt", "revision", "request", "sent_bytes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    engine: str
    size_bytes: int
    reason: str
    at: _timestamp_pb2.Timestamp
    attempt: int
    revision: int
    request: WorkflowRequested
    sent_bytes: int
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., engine: _Optional[str] = ..., size_bytes: _Optional[int] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., revision: _Optional[int] = ..., request: _Optional[_Union[WorkflowRequested, _Mapping]] = ..., sent_bytes: _Optional[int] = ...) -> None: ...

class WorkflowSubmitted(_message.Message):
    __slots__ = ("run_id", "workflow", "engine", "engine_run_id", "at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    engine: str
    engine_run_id: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., engine: _Optional[str] = ..., engine_run_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkflowFinished(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class StepEvent(_message.Message):
    __slots__ = ("run_id", "workflow", "engine", "step", "at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    engine: str
    step: _common_pb2.StepRecord
    at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., engine: _Optional[str] = ..., step: _Optional[_Union[_common_pb2.StepRecord, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("template", "parameters", "idempotency_key", "engine", "tenant")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    template: str
    parameters: _containers.ScalarMap[str, str]
    idempotency_key: str
    engine: str
    tenant: str
    def __init__(self, template: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., engine: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class CacheCommitted(_message.Message):
    __slots__ = ("key", "workflow", "step", "size_bytes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    key: str
    workflow: str
    step: str
    size_bytes: int
    def __init__(self, key: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class CacheEvicted(_message.Message):
    __slots__ = ("keys", "freed_bytes", "reason")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    freed_bytes: int
    reason: str
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., freed_bytes: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("durable", "subject", "stream_sequence", "delivery_count", "reason", "headers", "payload", "authenticated", "run_id", "at")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    STREAM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    durable: str
    subject: str
    stream_sequence: int
    delivery_count: int
    reason: str
    headers: _containers.ScalarMap[str, str]
    payload: bytes
    authenticated: bool
    run_id: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, durable: _Optional[str] = ..., subject: _Optional[str] = ..., stream_sequence: _Optional[int] = ..., delivery_count: _Optional[int] = ..., reason: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., payload: _Optional[bytes] = ..., authenticated: _Optional[bool] = ..., run_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UtilizationBatch(_message.Message):
    __slots__ = ("run_id", "samples")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.UtilizationSample]
    def __init__(self, run_id: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[_common_pb2.UtilizationSample, _Mapping]]] = ...) -> None: ...
