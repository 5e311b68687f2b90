"""The Delta Lake transaction log, implemented from the protocol (PROTOCOL.md + the ICT RFC).

Pure protocol logic (`actions`, `replay`, `schema`, `stats`, `checkpoint` encoding)
is separate from I/O, which goes only through `storage.Storage`; commits go
through a `committer.Committer` (the filesystem here, a commit owner for
managed tables). `DeltaTable` is the entry point.
"""

from .committer import CommitConflict, Committed, Committer, FilesystemCommitter
from .log import TableNotFound
from .schema import SchemaMismatch
from .storage import FileInfo, LocalStorage, Storage
from .table import DeltaTable, Snapshot
from .timeline import HistoryEntry
from .transaction import CommitResult, ConcurrentModification, Transaction

__all__ = [
    "CommitConflict",
    "CommitResult",
    "Committed",
    "Committer",
    "ConcurrentModification",
    "DeltaTable",
    "FileInfo",
    "FilesystemCommitter",
    "HistoryEntry",
    "LocalStorage",
    "SchemaMismatch",
    "Snapshot",
    "Storage",
    "TableNotFound",
    "Transaction",
]
