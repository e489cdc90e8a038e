from couler.v1 import common_pb2 as _common_pb2
from couler.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("workflow", "text", "template", "workflow_ref", "engine", "parameters", "idempotency_key", "dry_run", "no_cache", "constraints", "objectives", "tenant")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_REF_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    NO_CACHE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    workflow: _workflow_pb2.Workflow
    text: str
    template: str
    workflow_ref: _common_pb2.BlobRef
    engine: str
    parameters: _containers.ScalarMap[str, str]
    idempotency_key: str
    dry_run: bool
    no_cache: bool
    constraints: _containers.RepeatedScalarFieldContainer[str]
    objectives: _containers.RepeatedScalarFieldContainer[_common_pb2.Objective]
    tenant: str
    def __init__(self, workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., text: _Optional[str] = ..., template: _Optional[str] = ..., workflow_ref: _Optional[_Union[_common_pb2.BlobRef, _Mapping]] = ..., engine: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., dry_run: _Optional[bool] = ..., no_cache: _Optional[bool] = ..., constraints: _Optional[_Iterable[str]] = ..., objectives: _Optional[_Iterable[_Union[_common_pb2.Objective, str]]] = ..., tenant: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("run_id", "created", "schedule")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created: bool
    schedule: str
    def __init__(self, run_id: _Optional[str] = ..., created: _Optional[bool] = ..., schedule: _Optional[str] = ...) -> None: ...

class UploadWorkflowRequest(_message.Message):
    __slots__ = ("data", "size_bytes", "digest")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    size_bytes: int
    digest: str
    def __init__(self, data: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "step_page_size", "step_page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_page_size: int
    step_page_token: str
    def __init__(self, run_id: _Optional[str] = ..., step_page_size: _Optional[int] = ..., step_page_token: _Optional[str] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id", "step_page_size")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_page_size: int
    def __init__(self, run_id: _Optional[str] = ..., step_page_size: _Optional[int] = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ("run", "more")
    RUN_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    more: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., more: _Optional[bool] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetryRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("workflow", "states", "page_size", "page_token")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.RunState]
    page_size: int
    page_token: str
    def __init__(self, workflow: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.RunState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_common_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RegisterTemplateRequest(_message.Message):
    __slots__ = ("name", "workflow", "workflow_ref", "engine")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_REF_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    workflow: _workflow_pb2.Workflow
    workflow_ref: _common_pb2.BlobRef
    engine: str
    def __init__(self, name: _Optional[str] = ..., workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., workflow_ref: _Optional[_Union[_common_pb2.BlobRef, _Mapping]] = ..., engine: _Optional[str] = ...) -> None: ...

class ListTemplatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTemplatesResponse(_message.Message):
    __slots__ = ("templates",)
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    templates: _containers.RepeatedCompositeFieldContainer[_common_pb2.Template]
    def __init__(self, templates: _Optional[_Iterable[_Union[_common_pb2.Template, _Mapping]]] = ...) -> None: ...

class StepLogsRequest(_message.Message):
    __slots__ = ("run_id", "step", "key", "max_bytes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: str
    key: str
    max_bytes: int
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[str] = ..., key: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class StepLogsResponse(_message.Message):
    __slots__ = ("text", "truncated")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    text: str
    truncated: bool
    def __init__(self, text: _Optional[str] = ..., truncated: _Optional[bool] = ...) -> None: ...

class DownloadBlobRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: _common_pb2.BlobRef
    def __init__(self, ref: _Optional[_Union[_common_pb2.BlobRef, _Mapping]] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "cron", "timezone", "concurrency_policy", "starting_deadline_seconds", "suspended", "paused", "next_tick_at", "last_tick_at", "last_outcome", "last_run_id", "last_reason", "engine")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_POLICY_FIELD_NUMBER: _ClassVar[int]
    STARTING_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TICK_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_TICK_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    timezone: str
    concurrency_policy: str
    starting_deadline_seconds: int
    suspended: bool
    paused: bool
    next_tick_at: float
    last_tick_at: float
    last_outcome: str
    last_run_id: str
    last_reason: str
    engine: str
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., timezone: _Optional[str] = ..., concurrency_policy: _Optional[str] = ..., starting_deadline_seconds: _Optional[int] = ..., suspended: _Optional[bool] = ..., paused: _Optional[bool] = ..., next_tick_at: _Optional[float] = ..., last_tick_at: _Optional[float] = ..., last_outcome: _Optional[str] = ..., last_run_id: _Optional[str] = ..., last_reason: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...
