"""`Snapshot`: the table at one version, read-only and self-contained (delta-kernel-rs `snapshot/`)."""

from __future__ import annotations

import pyarrow as pa

from .actions import Add, Metadata, Protocol
from .replay import TableState, ict_enabled
from .scan import ScanContext, column_mapping_mode, logical_num_records, read_file
from .schema import from_schema_string
from .storage import Storage
from .writer import WriteOptions


class Snapshot:
    """The table at one version: read-only, self-contained."""

    def __init__(self, storage: Storage, state: TableState) -> None:
        assert state.protocol is not None and state.metadata is not None
        self.storage = storage
        self.state = state
        self.protocol: Protocol = state.protocol
        self.metadata: Metadata = state.metadata
        self.schema: pa.Schema = from_schema_string(state.metadata.schema_string)

    @property
    def version(self) -> int:
        return self.state.version

    def write_options(self) -> WriteOptions:
        """How new data files of this table are written: its properties, and the column mapping mode
        only where the protocol supports column mapping (PROTOCOL.md)."""
        mode = column_mapping_mode(self.protocol, self.metadata)
        return WriteOptions.from_properties(self.metadata.configuration, column_mapping=mode)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.metadata.configuration)

    @property
    def in_commit_timestamp(self) -> int | None:
        return self.state.ict

    @property
    def ict_enabled(self) -> bool:
        return ict_enabled(self.protocol, self.metadata)

    def files(self) -> list[Add]:
        return sorted(self.state.files.values(), key=lambda a: a.path)

    def num_records(self) -> int | None:
        """Total rows from file stats (less deletion vectors' rows); None if a file has no numRecords."""
        total = 0
        for a in self.state.files.values():
            n = logical_num_records(a)
            if n is None:
                return None
            total += n
        return total

    def domain_metadata(self) -> dict[str, str]:
        """Each live metadata domain's configuration (feedlog keeps them; it interprets none)."""
        return {d: m.configuration for d, m in sorted(self.state.domains.items())}

    def txn_version(self, app_id: str) -> int | None:
        """The last committed `txn` version of `app_id` (exactly-once bookkeeping), None if never."""
        t = self.state.txns.get(app_id)
        return None if t is None else t.version

    def to_arrow(self) -> pa.Table:
        """All rows of this version, partition columns restored, deletion vectors applied, in schema order."""
        ctx = ScanContext.of(self.storage, self.schema, self.protocol, self.metadata)
        tables = [read_file(ctx, add) for add in self.files()]
        return pa.concat_tables(tables) if tables else self.schema.empty_table()
