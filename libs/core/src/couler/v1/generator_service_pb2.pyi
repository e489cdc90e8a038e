from couler.v1 import common_pb2 as _common_pb2
from couler.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("text", "constraints", "engine", "name")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    text: str
    constraints: _containers.RepeatedScalarFieldContainer[str]
    engine: str
    name: str
    def __init__(self, text: _Optional[str] = ..., constraints: _Optional[_Iterable[str]] = ..., engine: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("workflow", "report")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    workflow: _workflow_pb2.Workflow
    report: _common_pb2.GenerationReport
    def __init__(self, workflow: _Optional[_Union[_workflow_pb2.Workflow, _Mapping]] = ..., report: _Optional[_Union[_common_pb2.GenerationReport, _Mapping]] = ...) -> None: ...
