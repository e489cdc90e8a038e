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

class UtilizationRequest(_message.Message):
    __slots__ = ("run_id", "workflow", "step", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    step: str
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class UtilizationResponse(_message.Message):
    __slots__ = ("samples", "peaks", "rollups")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PEAKS_FIELD_NUMBER: _ClassVar[int]
    ROLLUPS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.UtilizationSample]
    peaks: _containers.RepeatedCompositeFieldContainer[_common_pb2.StepPeak]
    rollups: _containers.RepeatedCompositeFieldContainer[UtilizationRollup]
    def __init__(self, samples: _Optional[_Iterable[_Union[_common_pb2.UtilizationSample, _Mapping]]] = ..., peaks: _Optional[_Iterable[_Union[_common_pb2.StepPeak, _Mapping]]] = ..., rollups: _Optional[_Iterable[_Union[UtilizationRollup, _Mapping]]] = ...) -> None: ...

class UtilizationRollup(_message.Message):
    __slots__ = ("run_id", "workflow", "step", "key", "attempt", "start", "cpu_mean", "cpu_max", "memory_max_bytes", "samples")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CPU_MEAN_FIELD_NUMBER: _ClassVar[int]
    CPU_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    step: str
    key: str
    attempt: int
    start: _timestamp_pb2.Timestamp
    cpu_mean: float
    cpu_max: float
    memory_max_bytes: int
    samples: int
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[str] = ..., key: _Optional[str] = ..., attempt: _Optional[int] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cpu_mean: _Optional[float] = ..., cpu_max: _Optional[float] = ..., memory_max_bytes: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class RecommendationsRequest(_message.Message):
    __slots__ = ("workflow", "step")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    step: str
    def __init__(self, workflow: _Optional[str] = ..., step: _Optional[str] = ...) -> None: ...

class RecommendationsResponse(_message.Message):
    __slots__ = ("recommendations", "requested")
    RECOMMENDATIONS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    recommendations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Recommendation]
    requested: _containers.RepeatedCompositeFieldContainer[StepRequests]
    def __init__(self, recommendations: _Optional[_Iterable[_Union[_common_pb2.Recommendation, _Mapping]]] = ..., requested: _Optional[_Iterable[_Union[StepRequests, _Mapping]]] = ...) -> None: ...

class StepRequests(_message.Message):
    __slots__ = ("step", "resources", "run_id", "at")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    step: str
    resources: _workflow_pb2.Resources
    run_id: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, step: _Optional[str] = ..., resources: _Optional[_Union[_workflow_pb2.Resources, _Mapping]] = ..., run_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
