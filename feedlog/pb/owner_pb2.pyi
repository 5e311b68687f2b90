from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TableRef(_message.Message):
    __slots__ = ("table_id", "path")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    path: str
    def __init__(self, table_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class StagedCommit(_message.Message):
    __slots__ = ("table", "version", "file", "in_commit_timestamp", "turn", "base", "accepts_pending")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    IN_COMMIT_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    version: int
    file: str
    in_commit_timestamp: int
    turn: bytes
    base: str
    accepts_pending: bool
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., version: _Optional[int] = ..., file: _Optional[str] = ..., in_commit_timestamp: _Optional[int] = ..., turn: _Optional[bytes] = ..., base: _Optional[str] = ..., accepts_pending: _Optional[bool] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("commit", "batch_size")
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    commit: StagedCommit
    batch_size: int
    def __init__(self, commit: _Optional[_Union[StagedCommit, _Mapping]] = ..., batch_size: _Optional[int] = ...) -> None: ...

class CommitOutcome(_message.Message):
    __slots__ = ("committed", "version", "retryable", "reason", "winners", "turn", "pending")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WINNERS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    version: int
    retryable: bool
    reason: str
    winners: _containers.RepeatedCompositeFieldContainer[Commit]
    turn: bool
    pending: int
    def __init__(self, committed: _Optional[bool] = ..., version: _Optional[int] = ..., retryable: _Optional[bool] = ..., reason: _Optional[str] = ..., winners: _Optional[_Iterable[_Union[Commit, _Mapping]]] = ..., turn: _Optional[bool] = ..., pending: _Optional[int] = ...) -> None: ...

class GetCommitsRequest(_message.Message):
    __slots__ = ("table", "start_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    START_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    start_version: int
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., start_version: _Optional[int] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("version", "file", "in_commit_timestamp")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    IN_COMMIT_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    version: int
    file: str
    in_commit_timestamp: int
    def __init__(self, version: _Optional[int] = ..., file: _Optional[str] = ..., in_commit_timestamp: _Optional[int] = ...) -> None: ...

class GetCommitsResponse(_message.Message):
    __slots__ = ("commits", "latest")
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    commits: _containers.RepeatedCompositeFieldContainer[Commit]
    latest: int
    def __init__(self, commits: _Optional[_Iterable[_Union[Commit, _Mapping]]] = ..., latest: _Optional[int] = ...) -> None: ...

class BackfillRequest(_message.Message):
    __slots__ = ("table", "version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    version: int
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class BackfillResponse(_message.Message):
    __slots__ = ("backfilled",)
    BACKFILLED_FIELD_NUMBER: _ClassVar[int]
    backfilled: int
    def __init__(self, backfilled: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("table_id",)
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    def __init__(self, table_id: _Optional[str] = ...) -> None: ...

class TableStatus(_message.Message):
    __slots__ = ("table_id", "path", "state", "latest", "backfilled", "batch_size", "tracked")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    BACKFILLED_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRACKED_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    path: str
    state: str
    latest: int
    backfilled: int
    batch_size: int
    tracked: int
    def __init__(self, table_id: _Optional[str] = ..., path: _Optional[str] = ..., state: _Optional[str] = ..., latest: _Optional[int] = ..., backfilled: _Optional[int] = ..., batch_size: _Optional[int] = ..., tracked: _Optional[int] = ...) -> None: ...

class EndTurnRequest(_message.Message):
    __slots__ = ("table", "turn")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    turn: bytes
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., turn: _Optional[bytes] = ...) -> None: ...

class EndTurnResponse(_message.Message):
    __slots__ = ("held",)
    HELD_FIELD_NUMBER: _ClassVar[int]
    held: bool
    def __init__(self, held: _Optional[bool] = ...) -> None: ...
