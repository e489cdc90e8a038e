from couler.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_ORDER_UNSPECIFIED: _ClassVar[CacheOrder]
    CACHE_ORDER_VICTIM: _ClassVar[CacheOrder]
    CACHE_ORDER_RECENT: _ClassVar[CacheOrder]
    CACHE_ORDER_SIZE: _ClassVar[CacheOrder]
    CACHE_ORDER_COST: _ClassVar[CacheOrder]
CACHE_ORDER_UNSPECIFIED: CacheOrder
CACHE_ORDER_VICTIM: CacheOrder
CACHE_ORDER_RECENT: CacheOrder
CACHE_ORDER_SIZE: CacheOrder
CACHE_ORDER_COST: CacheOrder

class LookupRequest(_message.Message):
    __slots__ = ("keys", "max_age_seconds", "peek")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEEK_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    max_age_seconds: int
    peek: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., max_age_seconds: _Optional[int] = ..., peek: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("entries", "missing")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheEntry]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.CacheEntry, _Mapping]]] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: _common_pb2.CacheEntry
    def __init__(self, entry: _Optional[_Union[_common_pb2.CacheEntry, _Mapping]] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("created", "evicted")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    evicted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, created: _Optional[bool] = ..., evicted: _Optional[_Iterable[str]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("entries", "bytes", "hits", "misses", "evictions", "budget_bytes")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    budget_bytes: int
    def __init__(self, entries: _Optional[int] = ..., bytes: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("keys", "free_bytes")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    free_bytes: int
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., free_bytes: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("evicted", "freed_bytes")
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[str]
    freed_bytes: int
    def __init__(self, evicted: _Optional[_Iterable[str]] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("keys", "pinned")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    pinned: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("keys", "missing")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class ListEntriesRequest(_message.Message):
    __slots__ = ("workflow", "step", "order", "page_size", "page_token")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    step: str
    order: CacheOrder
    page_size: int
    page_token: str
    def __init__(self, workflow: _Optional[str] = ..., step: _Optional[str] = ..., order: _Optional[_Union[CacheOrder, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListedEntry(_message.Message):
    __slots__ = ("entry", "priority", "evicted_at")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EVICTED_AT_FIELD_NUMBER: _ClassVar[int]
    entry: _common_pb2.CacheEntry
    priority: float
    evicted_at: float
    def __init__(self, entry: _Optional[_Union[_common_pb2.CacheEntry, _Mapping]] = ..., priority: _Optional[float] = ..., evicted_at: _Optional[float] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token", "policy")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ListedEntry]
    next_page_token: str
    policy: str
    def __init__(self, entries: _Optional[_Iterable[_Union[ListedEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class ShowEntryRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ShowEntryResponse(_message.Message):
    __slots__ = ("entry", "policy")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    entry: ListedEntry
    policy: str
    def __init__(self, entry: _Optional[_Union[ListedEntry, _Mapping]] = ..., policy: _Optional[str] = ...) -> None: ...
