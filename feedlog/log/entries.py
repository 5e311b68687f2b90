"""What the blocks of a feed mean: a hyperdb `Header` at seq 0, then entries.

Two content types, declared by the header's `protocol`:
  entry        hyperdb `Entry` blocks (key, value, deleted, + timestamp/expires_at)
  drive-event  the same `Entry` envelope, keyed by file path, whose value is a
               `DriveEvent` carrying hyperdrive's `Stat` and the writer timestamp;
               no `stat` means the file was deleted.
In both, an entry with `forget` set (field 11, issue 37) is a deletion that
withdraws its key: every copy clears the payloads of all earlier entries of
the key. It is written with `deleted = true` (and, in drive feeds, a
`DriveEvent` without `stat`), so a hyperdb reader sees an ordinary deletion.
Blocks are decoded as `InflatedEntry`, a superset of `Entry`, so hyperdb's
inflated blocks read too and every block re-encodes to its original bytes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from types import ModuleType
from typing import Any, cast

from google.protobuf.message import DecodeError, EncodeError, Message

from ..errors import Corruption, InvalidArgument
from ..pb import drive_pb2, hyperdb_pb2

ENTRY = "entry"
DRIVE_EVENT = "drive-event"
PROTOCOLS = {ENTRY: "hyperdb", DRIVE_EVENT: "feedlog/drive-event"}
CONTENT_TYPES = {v: k for k, v in PROTOCOLS.items()}
STAT_FIELDS = tuple(f.name for f in drive_pb2.Stat.DESCRIPTOR.fields)

#: `entry_scan`'s writer-shape test in C (`_blake2batch.writer_shape`) where setup.py built it
_native: ModuleType | None
try:
    from . import _blake2batch as _native
except ImportError:  # a machine without a C compiler
    _native = None


def encode_header(content_type: str) -> bytes:
    if content_type not in PROTOCOLS:
        raise InvalidArgument(f"unknown feed type {content_type!r}: use one of {', '.join(PROTOCOLS)}")
    return bytes(hyperdb_pb2.Header(protocol=PROTOCOLS[content_type]).SerializeToString())


def decode_header(block: bytes) -> str:
    h = hyperdb_pb2.Header()
    try:
        h.ParseFromString(block)
    except DecodeError as e:
        raise Corruption(f"block 0 is not a feed header: {e}") from None
    if h.protocol not in CONTENT_TYPES:
        raise Corruption(f"block 0 declares unknown protocol {h.protocol!r}")
    return CONTENT_TYPES[h.protocol]


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded entry. `value` is the raw value bytes (a DriveEvent's, in drive feeds)."""

    seq: int
    key: str
    value: bytes | None
    deleted: bool
    timestamp: int | None
    expires_at: int | None
    stat: dict[str, int] | None = None
    cleared: bool = False
    block: bytes | None = field(default=None, repr=False)
    #: why the block is not a valid entry (its author signed it anyway); None for a valid one
    invalid: str | None = None
    #: a withdrawal of `key` (always `deleted` too): earlier entries of the key are cleared on every copy
    forget: bool = False

    def expired(self, now_ms: int) -> bool:
        return self.expires_at is not None and now_ms > self.expires_at


def record_json(r: Record, now_ms: int, raw: bool = False) -> dict[str, Any]:
    """`r` as `feedlog cat --json` prints it (binary as hex); the console shows the same fields."""
    out: dict[str, Any] = {"seq": r.seq}
    if r.cleared:
        out["cleared"] = True
        return out
    if r.invalid is not None:  # signed by the author but not an entry: shown raw, never decoded
        out.update(invalid=r.invalid, block=(r.block or b"").hex())
        return out
    out.update(
        key=r.key,
        value=None if r.value is None else r.value.hex(),
        deleted=r.deleted,
        timestamp=r.timestamp,
        expires_at=r.expires_at,
        expired=r.expired(now_ms),
    )
    if r.forget:
        out["forget"] = True
    if r.stat is not None:
        out["stat"] = r.stat
    if raw and r.block is not None:
        out["block"] = r.block.hex()
    return out


def cleared_record(seq: int) -> Record:
    return Record(seq, "", None, False, None, None, cleared=True)


def stat_message(stat: Mapping[str, Any]) -> drive_pb2.Stat:
    unknown = set(stat) - set(STAT_FIELDS)
    if unknown:
        raise InvalidArgument(f"unknown stat field(s) {', '.join(sorted(unknown))}; known: {', '.join(STAT_FIELDS)}")
    if "mode" not in stat:
        raise InvalidArgument("a stat needs at least `mode`")
    try:
        return drive_pb2.Stat(**{k: int(v) for k, v in stat.items()})
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"bad stat: {e}") from None


def encode_entry(
    content_type: str,
    key: str,
    value: bytes | Mapping[str, Any] | None,
    *,
    deleted: bool,
    timestamp: int | None,
    expires_at: int | None,
    forget: bool = False,
) -> bytes:
    """One entry block. `forget` withdraws `key` (a deletion, so `deleted` must be set too)."""
    if forget and not deleted:
        raise InvalidArgument("a forget entry is a deletion")
    e = hyperdb_pb2.Entry(key=key, trie=b"")
    if deleted:
        e.deleted = True
    if forget:
        e.forget = True
    if expires_at is not None:
        e.expires_at = expires_at
    if content_type == DRIVE_EVENT:
        ev = drive_pb2.DriveEvent()
        if not deleted:
            if not isinstance(value, Mapping):
                raise InvalidArgument('a drive-event feed takes a stat (e.g. {"mode": 33188, "size": 12})')
            ev.stat.CopyFrom(stat_message(value))
        if timestamp is not None:
            ev.timestamp = timestamp
        e.value = ev.SerializeToString()
    else:
        if value is not None and not deleted:
            if not isinstance(value, bytes | bytearray):
                raise InvalidArgument("an entry feed takes bytes values")
            e.value = bytes(value)
        if timestamp is not None:
            e.timestamp = timestamp
    try:
        return bytes(e.SerializeToString())
    except (EncodeError, ValueError) as err:
        raise InvalidArgument(f"cannot encode entry: {err}") from None


def _missing(msg: Message) -> str:
    """The required fields `msg` lacks (a runtime method of every message; the stubs omit it)."""
    return ", ".join(cast(Any, msg).FindInitializationErrors())


def _parse(content_type: str, seq: int, block: bytes) -> tuple[hyperdb_pb2.InflatedEntry, drive_pb2.DriveEvent | None]:
    """The block's `InflatedEntry` (and `DriveEvent`, in drive feeds); `Corruption` says why it is none.

    The one definition of a valid entry block, for writers (`scan_blocks`) and
    readers (`decode_entry`) alike. upb's parser neither enforces proto2
    `required` fields nor UTF-8 in proto2 strings (an invalid `key` comes back
    as bytes), so both are checked here.
    """
    e = hyperdb_pb2.InflatedEntry()
    try:
        e.ParseFromString(block)
    except DecodeError as err:
        raise Corruption(f"block {seq} is not an entry: {err}") from None
    if not e.IsInitialized():
        raise Corruption(f"block {seq} is not an entry (missing {_missing(e)})")
    if not isinstance(e.key, str):
        raise Corruption(f"block {seq} has a key that is not UTF-8 ({bytes(e.key)[:32].hex()})")
    if content_type != DRIVE_EVENT:
        return e, None
    ev = drive_pb2.DriveEvent()
    try:
        ev.ParseFromString(e.value)
    except DecodeError as err:
        raise Corruption(f"block {seq} holds no DriveEvent: {err}") from None
    if not ev.IsInitialized():
        raise Corruption(f"block {seq} holds an incomplete DriveEvent (missing {_missing(ev)})")
    return e, ev


def decode_entry(content_type: str, seq: int, block: bytes) -> Record:
    """The entry in `block`; `Corruption` if it is not a valid one (see `decode_record` for readers)."""
    e, ev = _parse(content_type, seq, block)
    value = e.value if e.HasField("value") else None
    ts = e.timestamp if e.HasField("timestamp") else None
    stat: dict[str, int] | None = None
    deleted = e.deleted
    if ev is not None:
        if ev.HasField("timestamp"):
            ts = ev.timestamp
        if ev.HasField("stat"):
            stat = {f.name: v for f, v in ev.stat.ListFields()}
        else:
            deleted = True
    forget = e.forget and _FORGET_TAG in block  # as `forgets_in` reads it, on every copy alike
    return Record(
        seq,
        e.key,
        value,
        deleted,  # as encoded (a forget `encode_entry` writes is a deletion; readers treat any as one)
        ts,
        e.expires_at if e.HasField("expires_at") else None,
        stat,
        block=block,
        forget=forget,
    )


def decode_record(content_type: str, seq: int, block: bytes) -> Record:
    """The entry in `block`, or a record marked `invalid` (with the raw block) if it holds none.

    For readers of a whole feed: a signed block is part of the log whatever it
    holds (a replica stores what its author signed), so one bad block must not
    make the others unreadable.
    """
    try:
        return decode_entry(content_type, seq, block)
    except Corruption as e:
        return Record(seq, "", None, False, None, None, block=block, invalid=str(e))


#: field 11 (`forget`), varint, true: the bytes `encode_entry` writes for it, which any forget
#: entry written by feedlog holds (a cheap test before parsing a whole batch)
_FORGET_TAG = bytes([11 << 3 | 0, 1])


def _maybe_forgets(blocks: Sequence[bytes | None]) -> Iterator[int]:
    """Positions of the blocks that may hold `forget = true`, ascending (a superset; none missed).

    In C where setup.py built it: a block laid out as `encode_entry` writes an entry without
    `forget` (`entry_scan`'s writer shape: fields 1-4, 9, 10 in order, nothing after) holds no
    field 11, and nearly every block is one (some 0.03 us a block). Otherwise, one search for
    the field's bytes over the whole batch (some 0.2 us a block)."""
    if _native is not None and None not in blocks:
        ok = _native.writer_shape(blocks)[0]
        at = ok.find(0)
        while at >= 0:
            yield at
            at = ok.find(0, at + 1)
        return
    data = b"".join([b or b"" for b in blocks])
    at = data.find(_FORGET_TAG)
    if at < 0:
        return
    ends = list(accumulate(len(b or b"") for b in blocks))
    last = -1
    while at >= 0:
        n = bisect_right(ends, at)  # the block the bytes start in
        if n != last:
            yield n
            last = n
        at = data.find(_FORGET_TAG, at + 1)


def forgets_in(content_type: str, start: int, blocks: Sequence[bytes | None]) -> list[tuple[int, str]]:
    """(seq, key) of the forget entries among `blocks` (seqs `start...`; block 0 is the header).

    Only the few blocks `_maybe_forgets` names are parsed: a replica stores a signed
    batch of ordinary entries without a parse per block. A forget is field 11
    encoded as `encode_entry` (and any protobuf encoder) writes it, the minimal
    varint 1; a block that sets it otherwise (a padded varint) withdraws nothing,
    on every copy alike (`decode_entry` agrees).
    """
    out: list[tuple[int, str]] = []
    for n in _maybe_forgets(blocks):
        block = blocks[n]
        if start + n == 0 or block is None or _FORGET_TAG not in block:
            continue
        try:
            e, _ev = _parse(content_type, start + n, block)
        except Corruption:
            continue  # not an entry: data to a replica, withdraws nothing
        if e.forget and e.key:
            out.append((start + n, e.key))
    return out


def scan_blocks(content_type: str, start: int, blocks: Sequence[bytes | None], *, strict: bool) -> tuple[int, int]:
    """(min, max) writer timestamp of blocks `start...` (0, 0: none), for a batch signed elsewhere.

    Block 0 is the header. `strict` (a writer's append: locally, or a key
    holder's `Append` to a peer) raises `InvalidArgument` for a block that is
    not a valid entry of `content_type` (`_parse`), or whose key is empty, as
    `Feed.append` refuses; otherwise (a replicated batch, already signed by its
    author) such a block is just data, shown as invalid to readers.
    """
    lo = hi = 0
    for n, block in enumerate(blocks):
        seq = start + n
        if block is None:
            continue
        ts: int | None = None
        try:
            if seq == 0:
                if decode_header(block) != content_type:
                    raise Corruption(f"block 0 declares a {decode_header(block)} feed, not {content_type}")
                continue
            e, ev = _parse(content_type, seq, block)
            if strict and not e.key:
                raise Corruption(f"block {seq} has an empty key")
            if ev is not None:
                ts = ev.timestamp if ev.HasField("timestamp") else None
            elif e.HasField("timestamp"):
                ts = e.timestamp
        except Corruption as err:
            if strict:
                raise InvalidArgument(f"block {seq} is not a valid {content_type}: {err}") from None
            continue
        if ts is not None:
            lo = ts if not lo or ts < lo else lo
            hi = max(hi, ts)
    return lo, hi
