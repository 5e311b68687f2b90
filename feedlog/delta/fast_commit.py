"""A commit file decoded by msgspec into the actions `actions.decode_commit` makes, or None.

A log replay without a checkpoint decodes every commit file, and the standard library's JSON
parser plus a dict per action was most of it (10,000 small commits: ~55% of the snapshot load).
msgspec decodes each line straight into typed fields and skips what replay does not keep (the
commitInfo of every commit but the last) without building it.

This is a fast path, not a second definition of the format: it takes only the commits whose every
line it can decode exactly as `actions.decode_commit` would (one known action per line, each
field of the type the reference expects, no field it does not name), and answers None for
anything else, for which the caller uses the reference, which also words every error. The tests
compare the two on generated commits.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import astuple

from .actions import Action, Add, CommitInfo, DomainMetadata, Metadata, Protocol, Remove, Txn

_Long = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Add(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    size: _Long
    modificationTime: _Long
    partitionValues: dict[str, str | None] | None = None
    # the reference reads `bool(d.get("dataChange", True))`: absent is True, null is False
    dataChange: bool | None = True
    stats: str | None = None
    tags: dict[str, str] | None = None
    # the fields the protocol defines beyond those Add models: kept in `extra`, as the reference does
    deletionVector: Any = None
    baseRowId: Any = None
    defaultRowCommitVersion: Any = None
    clusteringProvider: Any = None


class _Remove(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    deletionTimestamp: Any = None
    dataChange: bool | None = True
    extendedFileMetadata: Any = None
    partitionValues: Any = None
    size: Any = None
    stats: Any = None
    tags: Any = None
    deletionVector: Any = None
    baseRowId: Any = None
    defaultRowCommitVersion: Any = None


class _Ict(msgspec.Struct):
    """A commitInfo before the last commit: its in-commit timestamp alone (the rest is skipped)."""

    inCommitTimestamp: Any = None


_Object = dict[str, Any]


class _Line(msgspec.Struct):
    """One line of a commit; keys that are no action of the protocol's are skipped, as the
    reference ignores them. UNSET: the key is absent (None: it is null, which the reference refuses)."""

    add: _Add | UnsetType | None = UNSET
    remove: _Remove | UnsetType | None = UNSET
    commitInfo: _Object | UnsetType | None = UNSET
    txn: _Object | UnsetType | None = UNSET
    protocol: _Object | UnsetType | None = UNSET
    metaData: _Object | UnsetType | None = UNSET
    domainMetadata: _Object | UnsetType | None = UNSET
    cdc: Any = UNSET  # change data files: no snapshot holds them (skipped whatever they hold)


class _IctLine(_Line):
    commitInfo: _Ict | UnsetType | None = UNSET  # type: ignore[assignment]


#: a line's fields absent when it holds one action
_ONE = len(_Line.__struct_fields__) - 1
_FULL = msgspec.json.Decoder(_Line)
_ICT_ONLY = msgspec.json.Decoder(_IctLine)

_ADD_EXTRA = ("deletionVector", "baseRowId", "defaultRowCommitVersion", "clusteringProvider")
_REMOVE_EXTRA = ("deletionVector", "baseRowId", "defaultRowCommitVersion")


def decode(data: bytes, ict_only: bool = False) -> list[Action] | None:
    """The actions of commit file `data` as `decode_commit(data, v, ict_only)` gives them, or None
    where this path cannot tell (a blank line, a line that is not exactly one known action, a field
    of another type, a field no action here names, bytes that are not UTF-8 JSON): then the caller
    decodes it with the reference, which also raises its errors."""
    if not data.isascii():
        try:  # msgspec does not look inside what it skips: the reference refuses any bad UTF-8
            data.decode()
        except UnicodeDecodeError:
            return None
    raw = data.rstrip(b"\r\n").split(b"\n")
    limit = sys.get_int_max_str_digits()
    if limit and len(data) > limit and any(len(line) > limit and _long_run(limit).search(line) for line in raw):
        return None  # an integer the reference cannot convert, perhaps where msgspec only skips
    decoder = _ICT_ONLY if ict_only else _FULL
    try:  # line by line, as the reference reads them: a value never spans lines
        lines = [decoder.decode(line) for line in raw]
    except (ValueError, RecursionError):  # msgspec's errors (a blank line too), nesting too deep
        return None
    out: list[Action] = []
    append = out.append
    for line in lines:
        fields = astuple(line)
        if fields.count(UNSET) != _ONE:  # no action, or more than one
            return None
        add, remove, info, *_ = fields
        if add is not UNSET:
            if add is None:
                return None
            append(_to_add(add))
        elif info is not UNSET:
            if info is None:
                return None
            if isinstance(info, _Ict):
                ict = info.inCommitTimestamp
                append(CommitInfo(ict if isinstance(ict, int) and not isinstance(ict, bool) else None, None))
            else:
                try:
                    append(CommitInfo.from_json(info))
                except (TypeError, ValueError, OverflowError):
                    return None  # the reference says what is wrong
        elif remove is not UNSET:
            if remove is None:
                return None
            append(_to_remove(remove))
        elif line.cdc is not UNSET:
            continue
        else:
            action = _other(line)
            if action is None:
                return None
            append(action)
    return out


@functools.cache
def _long_run(limit: int) -> re.Pattern[bytes]:
    """More digits in a row than Python converts from a string (`sys.get_int_max_str_digits`)."""
    return re.compile(rb"[0-9]{%d}" % (limit + 1))


def _to_add(a: _Add) -> Add:
    extra = {}
    if a.deletionVector is not None or a.baseRowId is not None or a.defaultRowCommitVersion is not None:
        extra = {k: v for k in _ADD_EXTRA if (v := getattr(a, k)) is not None}
    elif a.clusteringProvider is not None:
        extra = {"clusteringProvider": a.clusteringProvider}
    return Add(
        a.path,
        a.partitionValues or {},
        a.size,
        a.modificationTime,
        bool(a.dataChange),
        a.stats,
        a.tags,
        extra,
    )


def _to_remove(r: _Remove) -> Remove:
    return Remove(
        r.path,
        r.deletionTimestamp,
        bool(r.dataChange),
        r.extendedFileMetadata,
        r.partitionValues,
        r.size,
        r.stats,
        r.tags,
        {k: v for k in _REMOVE_EXTRA if (v := getattr(r, k)) is not None},
    )


def _other(line: _Line) -> Action | None:
    """The line's one rarer action (txn, protocol, metaData, domainMetadata) through the reference's
    own parser; None where the reference would refuse it."""
    for parse, body in (
        (Txn.from_json, line.txn),
        (Protocol.from_json, line.protocol),
        (Metadata.from_json, line.metaData),
        (DomainMetadata.from_json, line.domainMetadata),
    ):
        if body is UNSET:
            continue
        if body is None:
            return None
        try:
            return parse(body)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None  # the reference says what is wrong
    return None
