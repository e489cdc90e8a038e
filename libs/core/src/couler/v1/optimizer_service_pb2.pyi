from couler.v1 import common_pb2 as _common_pb2
from couler.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OptimizeRequest(_message.Message):
    __slots__ = ("workflow", "workflow_ref", "engine", "objectives", "no_cache", "parameters", "run_id")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_REF_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    NO_CACHE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    workflow: _workflow_pb2.Workflow
    workflow_ref: _common_pb2.BlobRef
    engine: str
    objectives: _containers.RepeatedScalarFieldContainer[_common_pb2.Objective]
    no_cache: bool
    parameters: _containers.ScalarMap[str, str]
    run_id: str
    def __init__(self, workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., workflow_ref: _Optional[_Union[_common_pb2.BlobRef, _Mapping]] = ..., engine: _Optional[str] = ..., objectives: _Optional[_Iterable[_Union[_common_pb2.Objective, str]]] = ..., no_cache: _Optional[bool] = ..., parameters: _Optional[_Mapping[str, str]] = ..., run_id: _Optional[str] = ...) -> None: ...
