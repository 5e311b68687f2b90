"""Staged commits: `_delta_log/_commits/<version>.<uuid>.json`, what a writer proposes to the owner.

Naming, the cheap parse the owner does of a staged file (only the actions that
decide ownership and the ICT), and the two pieces of housekeeping every party
shares: deleting the staged files of backfilled versions, and finding the data
files that staged commits name (which an aborting job must not delete).
"""

from __future__ import annotations

import json
import re
import uuid

from ...errors import FeedlogError, InvalidArgument, NotFound
from ..actions import CommitInfo, Metadata, Protocol
from ..committer import LOG_DIR
from ..storage import Storage

COMMITS_DIR = f"{LOG_DIR}/_commits"

#: a line of a commit file that holds commitInfo, protocol or metaData (the writer's line format:
#: the action's key first, maybe after spaces)
_HEAD_ACTION = re.compile(rb'^[ \t]*\{[ \t]*"(?:commitInfo|protocol|metaData)"', re.MULTILINE)
_STAGED = re.compile(r"(\d{20})\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.json", re.ASCII)


def staged_name(version: int) -> str:
    return f"{version:020d}.{uuid.uuid4()}.json"


def staged_version(name: str) -> int | None:
    """The version of a staged commit file name, None if the name is not one."""
    m = _STAGED.fullmatch(name)
    return int(m.group(1)) if m else None


def check_staged_name(name: str, version: int) -> None:
    if staged_version(name) != version:
        raise InvalidArgument(
            f"staged commit file {name!r} is not named <version>.<uuid>.json for version {version} "
            f"(20-digit version, lowercase UUID)"
        )


def staged_actions(data: bytes) -> tuple[CommitInfo | None, Protocol | None, Metadata | None]:
    """The commitInfo, protocol and metaData of a commit file, without parsing its add/remove lines."""
    info = protocol = metadata = None
    # only the lines that start with one of these actions, found by a scan in C: a file of millions
    # of short lines must cost neither a list of them nor a Python loop over them
    for m in _HEAD_ACTION.finditer(data):
        start = m.start()
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        try:
            obj = json.loads(data[start:end])
        except ValueError as e:  # not JSON or not UTF-8, or an integer longer than Python converts
            raise InvalidArgument(f"staged commit is not newline-delimited JSON: {e}") from None
        except RecursionError:
            raise InvalidArgument("staged commit has a line nested too deeply to be an action") from None
        try:
            if "commitInfo" in obj and info is None:
                info = CommitInfo.from_json(obj["commitInfo"])
            elif "protocol" in obj:
                protocol = Protocol.from_json(obj["protocol"])
            elif "metaData" in obj:
                metadata = Metadata.from_json(obj["metaData"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidArgument(f"staged commit has a malformed action: {e!r}") from None
    return info, protocol, metadata


def clean_staged(storage: Storage, through: int) -> list[str]:
    """Delete the staged files of versions <= `through` (backfilled: each is a copy of what was ratified,
    or a loser that never will be); returns the deleted paths."""
    doomed = []
    for info in storage.list(COMMITS_DIR, stat=False):
        v = staged_version(info.path.rsplit("/", 1)[-1])
        if v is not None and v <= through:
            storage.delete(info.path)
            doomed.append(info.path)
    return doomed


def staged_data_paths(storage: Storage) -> set[str] | None:
    """The data files staged commits (ratified or not yet) add; None if one cannot be read or
    parsed, or is empty, so it may name anything. A writer may be writing one in place right now
    (`storage.put_new`): read then, it is empty, cut inside a line (None), or cut at a line's end,
    naming fewer files than it will. A commit whose file is still being written is not yet asked
    of its owner, so the race is the one a hidden temp file had: staged after this answer."""
    out: set[str] = set()
    for info in storage.list(COMMITS_DIR, stat=False):
        if staged_version(info.path.rsplit("/", 1)[-1]) is None:
            continue
        try:
            data = storage.read(info.path)
        except NotFound:
            continue  # backfilled and cleaned up meanwhile: its adds are in the log
        except FeedlogError:
            return None
        if not data:
            return None
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                add = json.loads(line).get("add")
            except (ValueError, AttributeError):
                return None
            if isinstance(add, dict) and isinstance(add.get("path"), str):
                out.add(add["path"])
    return out
