from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stat(_message.Message):
    __slots__ = ("mode", "uid", "gid", "size", "blocks", "offset", "byteOffset", "mtime", "ctime")
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTEOFFSET_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    mode: int
    uid: int
    gid: int
    size: int
    blocks: int
    offset: int
    byteOffset: int
    mtime: int
    ctime: int
    def __init__(self, mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., blocks: _Optional[int] = ..., offset: _Optional[int] = ..., byteOffset: _Optional[int] = ..., mtime: _Optional[int] = ..., ctime: _Optional[int] = ...) -> None: ...

class DriveEvent(_message.Message):
    __slots__ = ("stat", "timestamp")
    STAT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    stat: Stat
    timestamp: int
    def __init__(self, stat: _Optional[_Union[Stat, _Mapping]] = ..., timestamp: _Optional[int] = ...) -> None: ...
