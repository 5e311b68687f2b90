from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeedId(_message.Message):
    __slots__ = ("key", "discovery_key")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    discovery_key: bytes
    def __init__(self, key: _Optional[bytes] = ..., discovery_key: _Optional[bytes] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("index", "hash", "size")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    index: int
    hash: bytes
    size: int
    def __init__(self, index: _Optional[int] = ..., hash: _Optional[bytes] = ..., size: _Optional[int] = ...) -> None: ...

class SignedState(_message.Message):
    __slots__ = ("length", "fork", "tree_hash", "signature")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    TREE_HASH_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    length: int
    fork: int
    tree_hash: bytes
    signature: bytes
    def __init__(self, length: _Optional[int] = ..., fork: _Optional[int] = ..., tree_hash: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ("feed", "consistency_from")
    FEED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FROM_FIELD_NUMBER: _ClassVar[int]
    feed: FeedId
    consistency_from: int
    def __init__(self, feed: _Optional[_Union[FeedId, _Mapping]] = ..., consistency_from: _Optional[int] = ...) -> None: ...

class ConsistencyProof(_message.Message):
    __slots__ = ("old_length", "new_length", "old_roots", "nodes")
    OLD_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NEW_LENGTH_FIELD_NUMBER: _ClassVar[int]
    OLD_ROOTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    old_length: int
    new_length: int
    old_roots: _containers.RepeatedCompositeFieldContainer[Node]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, old_length: _Optional[int] = ..., new_length: _Optional[int] = ..., old_roots: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class ForkProof(_message.Message):
    __slots__ = ("key", "a", "b", "consistency")
    KEY_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    a: SignedState
    b: SignedState
    consistency: ConsistencyProof
    def __init__(self, key: _Optional[bytes] = ..., a: _Optional[_Union[SignedState, _Mapping]] = ..., b: _Optional[_Union[SignedState, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencyProof, _Mapping]] = ...) -> None: ...

class FeedInfo(_message.Message):
    __slots__ = ("key", "discovery_key", "state", "byte_length", "content_type", "writable", "min_timestamp", "max_timestamp", "header", "timestamps", "ttl", "compact_every_ms", "consistency", "fork_proof")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    MIN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    COMPACT_EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    FORK_PROOF_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    discovery_key: bytes
    state: SignedState
    byte_length: int
    content_type: str
    writable: bool
    min_timestamp: int
    max_timestamp: int
    header: bytes
    timestamps: str
    ttl: str
    compact_every_ms: int
    consistency: ConsistencyProof
    fork_proof: ForkProof
    def __init__(self, key: _Optional[bytes] = ..., discovery_key: _Optional[bytes] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ..., byte_length: _Optional[int] = ..., content_type: _Optional[str] = ..., writable: _Optional[bool] = ..., min_timestamp: _Optional[int] = ..., max_timestamp: _Optional[int] = ..., header: _Optional[bytes] = ..., timestamps: _Optional[str] = ..., ttl: _Optional[str] = ..., compact_every_ms: _Optional[int] = ..., consistency: _Optional[_Union[ConsistencyProof, _Mapping]] = ..., fork_proof: _Optional[_Union[ForkProof, _Mapping]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("key", "expected_length", "blocks", "signature", "fork", "timestamps", "ttl")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    expected_length: int
    blocks: _containers.RepeatedScalarFieldContainer[bytes]
    signature: bytes
    fork: int
    timestamps: str
    ttl: str
    def __init__(self, key: _Optional[bytes] = ..., expected_length: _Optional[int] = ..., blocks: _Optional[_Iterable[bytes]] = ..., signature: _Optional[bytes] = ..., fork: _Optional[int] = ..., timestamps: _Optional[str] = ..., ttl: _Optional[str] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: SignedState
    def __init__(self, state: _Optional[_Union[SignedState, _Mapping]] = ...) -> None: ...

class Put(_message.Message):
    __slots__ = ("key", "value", "deleted", "ttl_ms", "timestamps", "stat", "forget", "exact_expiry")
    class StatEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    STAT_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    EXACT_EXPIRY_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    deleted: bool
    ttl_ms: int
    timestamps: str
    stat: _containers.ScalarMap[str, int]
    forget: bool
    exact_expiry: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., deleted: _Optional[bool] = ..., ttl_ms: _Optional[int] = ..., timestamps: _Optional[str] = ..., stat: _Optional[_Mapping[str, int]] = ..., forget: _Optional[bool] = ..., exact_expiry: _Optional[bool] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("feed", "entries")
    FEED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    feed: bytes
    entries: _containers.RepeatedCompositeFieldContainer[Put]
    def __init__(self, feed: _Optional[bytes] = ..., entries: _Optional[_Iterable[_Union[Put, _Mapping]]] = ...) -> None: ...

class Appended(_message.Message):
    __slots__ = ("seq", "timestamp", "expires_at")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp: int
    expires_at: int
    def __init__(self, seq: _Optional[int] = ..., timestamp: _Optional[int] = ..., expires_at: _Optional[int] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("appended", "state")
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    appended: _containers.RepeatedCompositeFieldContainer[Appended]
    state: SignedState
    def __init__(self, appended: _Optional[_Iterable[_Union[Appended, _Mapping]]] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("content_type", "timestamps", "ttl")
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    content_type: str
    timestamps: str
    ttl: str
    def __init__(self, content_type: _Optional[str] = ..., timestamps: _Optional[str] = ..., ttl: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("feed", "start", "end", "with_roots", "max_message_bytes")
    FEED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    WITH_ROOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    feed: FeedId
    start: int
    end: int
    with_roots: bool
    max_message_bytes: int
    def __init__(self, feed: _Optional[_Union[FeedId, _Mapping]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., with_roots: _Optional[bool] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("feed", "start", "with_roots", "max_message_bytes")
    FEED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    WITH_ROOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    feed: FeedId
    start: int
    with_roots: bool
    max_message_bytes: int
    def __init__(self, feed: _Optional[_Union[FeedId, _Mapping]] = ..., start: _Optional[int] = ..., with_roots: _Optional[bool] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("start", "blocks", "cleared", "state")
    START_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    start: int
    blocks: _containers.RepeatedScalarFieldContainer[bytes]
    cleared: _containers.RepeatedCompositeFieldContainer[Node]
    state: SignedState
    def __init__(self, start: _Optional[int] = ..., blocks: _Optional[_Iterable[bytes]] = ..., cleared: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("roots", "segments")
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    roots: _containers.RepeatedCompositeFieldContainer[Node]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    def __init__(self, roots: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ...) -> None: ...

class ProofRequest(_message.Message):
    __slots__ = ("feed", "seq")
    FEED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    feed: FeedId
    seq: int
    def __init__(self, feed: _Optional[_Union[FeedId, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class ProofResponse(_message.Message):
    __slots__ = ("seq", "block", "path", "roots", "state")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    block: bytes
    path: _containers.RepeatedCompositeFieldContainer[Node]
    roots: _containers.RepeatedCompositeFieldContainer[Node]
    state: SignedState
    def __init__(self, seq: _Optional[int] = ..., block: _Optional[bytes] = ..., path: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., roots: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ...) -> None: ...

class GossipState(_message.Message):
    __slots__ = ("key", "state", "fork_proof")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FORK_PROOF_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    state: SignedState
    fork_proof: ForkProof
    def __init__(self, key: _Optional[bytes] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ..., fork_proof: _Optional[_Union[ForkProof, _Mapping]] = ...) -> None: ...

class GossipRequest(_message.Message):
    __slots__ = ("feeds",)
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    feeds: _containers.RepeatedCompositeFieldContainer[GossipState]
    def __init__(self, feeds: _Optional[_Iterable[_Union[GossipState, _Mapping]]] = ...) -> None: ...

class GossipReply(_message.Message):
    __slots__ = ("key", "state", "consistency", "fork_proof")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    FORK_PROOF_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    state: SignedState
    consistency: ConsistencyProof
    fork_proof: ForkProof
    def __init__(self, key: _Optional[bytes] = ..., state: _Optional[_Union[SignedState, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencyProof, _Mapping]] = ..., fork_proof: _Optional[_Union[ForkProof, _Mapping]] = ...) -> None: ...

class GossipResponse(_message.Message):
    __slots__ = ("feeds",)
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    feeds: _containers.RepeatedCompositeFieldContainer[GossipReply]
    def __init__(self, feeds: _Optional[_Iterable[_Union[GossipReply, _Mapping]]] = ...) -> None: ...
