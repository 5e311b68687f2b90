from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("key", "value", "deleted", "trie", "clock", "inflate", "timestamp", "expires_at", "forget")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    TRIE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    INFLATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    deleted: bool
    trie: bytes
    clock: _containers.RepeatedScalarFieldContainer[int]
    inflate: int
    timestamp: int
    expires_at: int
    forget: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., deleted: _Optional[bool] = ..., trie: _Optional[bytes] = ..., clock: _Optional[_Iterable[int]] = ..., inflate: _Optional[int] = ..., timestamp: _Optional[int] = ..., expires_at: _Optional[int] = ..., forget: _Optional[bool] = ...) -> None: ...

class InflatedEntry(_message.Message):
    __slots__ = ("key", "value", "deleted", "trie", "clock", "inflate", "feeds", "contentFeed", "timestamp", "expires_at", "forget")
    class Feed(_message.Message):
        __slots__ = ("key",)
        KEY_FIELD_NUMBER: _ClassVar[int]
        key: bytes
        def __init__(self, key: _Optional[bytes] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    TRIE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    INFLATE_FIELD_NUMBER: _ClassVar[int]
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    CONTENTFEED_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    deleted: bool
    trie: bytes
    clock: _containers.RepeatedScalarFieldContainer[int]
    inflate: int
    feeds: _containers.RepeatedCompositeFieldContainer[InflatedEntry.Feed]
    contentFeed: bytes
    timestamp: int
    expires_at: int
    forget: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., deleted: _Optional[bool] = ..., trie: _Optional[bytes] = ..., clock: _Optional[_Iterable[int]] = ..., inflate: _Optional[int] = ..., feeds: _Optional[_Iterable[_Union[InflatedEntry.Feed, _Mapping]]] = ..., contentFeed: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., expires_at: _Optional[int] = ..., forget: _Optional[bool] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("protocol",)
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    def __init__(self, protocol: _Optional[str] = ...) -> None: ...
