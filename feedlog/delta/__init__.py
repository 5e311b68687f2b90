"""The Delta Lake transaction log, implemented from the protocol (PROTOCOL.md + the ICT RFC).

Pure protocol logic (`actions`, `replay`, `schema`, `stats`, `checkpoint` encoding)
is separate from I/O, which goes only through `storage.Storage`. The commit
path runs one way: `DeltaTable` (a façade) reads a `Snapshot` (`log`), opens a
`Transaction` on it with a `committer.Committer` (put-if-absent for filesystem
tables; `managed.Router` to the commit owner for managed ones), and the
transaction plans, commits and rebases by itself. `maintenance` works on a
storage and a listing. `managed/` holds everything about commit owners.
"""

from .committer import CommitConflict, Committed, Committer, FilesystemCommitter
from .log import TableNotFound
from .schema import SchemaMismatch
from .snapshot import Snapshot
from .storage import FileInfo, LocalStorage, MemoryStorage, Storage
from .table import DeltaTable
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
    "MemoryStorage",
    "SchemaMismatch",
    "Snapshot",
    "Storage",
    "TableNotFound",
    "Transaction",
]
