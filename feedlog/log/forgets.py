"""Withdrawn keys (issue 37): which payloads a forget entry clears, and the mark that makes it crash-safe.

A forget entry (`entries.forgets_in`) tells every copy of a feed to clear the
payloads of all earlier entries of its key. Every path that stores a signed
batch (a local append, a key holder's remote append, a replica's stored
batch) goes through `Core._commit`, whose `before_commit` hook a `Feed` points
at `Forgetting.before_commit`: once the batch has verified, and before its new
length is visible to any reader, the earlier entries of each forgotten key are
cleared (`Core.clear`), and those of the batch itself before the forget are
stored already flagged as cleared (their bytes zeroed right after the batch's
record is written). So no copy ever serves a forget entry beside a payload it
withdraws.

Crash safety: before clearing anything, the hook writes `forgets.json`, "forget
entries from seq P on may not be applied yet"; the path that stored the batch
removes it once done. Reopening a feed that still has one (killed in between)
applies every forget entry in [P, length) again. Applying is idempotent:
already-cleared entries are skipped.

What is cleared is decided here from the batch and the candidates the key
index proposes (`victims`, a pure function of its inputs); the feed does the
clearing.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..errors import Corruption
from . import entries, storage
from .entries import Record

PENDING_FILE = "forgets.json"

#: (seq, key) of a forget entry
Forget = tuple[int, str]


def victims(
    forgets: Sequence[Forget],
    earlier: Callable[[str], Iterable[Record]],
    batch: Callable[[int], Record | None],
    start: int,
) -> tuple[list[int], list[int]]:
    """(stored seqs, batch seqs) whose payloads the forget entries `forgets` withdraw.

    `earlier(key)`: the live entries of `key` stored before the batch (a key
    index's candidates, decoded); `batch(seq)`: the entry at `seq` in the batch
    that starts at `start` (None: not a valid entry). An entry is withdrawn by a
    forget of its key at a later seq, forget entries included (a key's name is
    data too); the newest forget of a key withdraws everything before it.
    """
    newest: dict[str, int] = {}
    for seq, key in forgets:
        newest[key] = max(seq, newest.get(key, 0))
    stored: set[int] = set()
    inside: set[int] = set()
    for key, upto in newest.items():
        stored.update(r.seq for r in earlier(key) if r.seq < min(upto, start))
    if any(seq > start for seq in newest.values()):
        for seq in range(start, max(newest.values())):
            r = batch(seq)
            if r is not None and r.key in newest and seq < newest[r.key]:
                inside.add(seq)
    return sorted(stored), sorted(inside)


class PendingMark:
    """`forgets.json` in a feed directory: the first seq whose forget entries may be unapplied."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / PENDING_FILE
        self._set: int | None = None
        #: a path failed after marking: the mark stays for the next open to finish
        self._stuck = False

    def load(self) -> int | None:
        """The persisted mark, or None (nothing pending). `Corruption` if the file is unreadable."""
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise Corruption(f"{self.path}: {e}") from None
        start = raw.get("from") if isinstance(raw, dict) else None
        if not isinstance(start, int) or start < 0:
            raise Corruption(f"{self.path}: no forget mark in it")
        self._set = start
        return start

    def mark(self, start: int) -> None:
        """Persist "forgets from `start` on may be unapplied" (kept at an earlier mark if one is set)."""
        if self._set is not None and self._set <= start:
            return
        storage.atomic_write(self.path, json.dumps({"from": start}).encode())
        self._set = start

    def done(self, ok: bool) -> None:
        """The path that marked is over: drop the mark if it finished (`ok`) and no earlier one failed."""
        if self._set is None:
            return
        if not ok:
            self._stuck = True
            return
        if self._stuck:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        storage.fsync_dir(self.path.parent)
        self._set = None

    def cleared(self) -> None:
        """An open finished every pending forget: the mark goes, whatever failed before."""
        self._stuck = False
        self.done(True)


def forgets_in_feed(content_type: str, blocks: Iterable[tuple[int, bytes | None]]) -> list[Forget]:
    """The forget entries among stored `(seq, block)` pairs (a scan of a pending range on open)."""
    out: list[Forget] = []
    for seq, block in blocks:
        out += entries.forgets_in(content_type, seq, [block])
    return out
