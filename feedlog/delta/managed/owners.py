"""Which commit owners a process talks to, and how (the managed-commits client's configuration).

Trust (see `protocol.py`): a table's metadata names its owner, and whoever can
write a table can make it name any database file or endpoint. So a process
talks only to owners it was told to trust (`owner=`, $FEEDLOG_OWNER, the CLI's
--owner), plus, for writers, the table's own embedded owner. `Owners` holds
that configuration for one table handle (the trusted owners, the table's token,
TLS for gRPC owners), hands out one `ManagedCommitter` per (owner, table), and
answers the reader's question "which ratified commits are there beyond the
backfilled log?" without ever contacting an owner it does not trust.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from ...errors import Unavailable
from ...rpc import Tls
from ..actions import Metadata, Protocol
from ..storage import FileInfo, Storage
from .committer import ManagedCommitter, Router, resolve_owner
from .protocol import (
    OWNER_ENV,
    Auth,
    Binding,
    OwnerNotConsulted,
    OwnerNotTrusted,
    TableRef,
    default_token,
    is_embedded,
    is_trusted,
    new_token,
    trusted_owners,
)
from .sqlite import LocalOwner
from .staged import COMMITS_DIR, staged_version


class Owners:
    def __init__(
        self,
        owner: Binding | str | Sequence[Binding | str] | None = None,
        token: str | None = None,
        tls: Tls | None = None,
    ) -> None:
        #: the commit owners this handle may talk to (default $FEEDLOG_OWNER)
        self.trusted: list[Binding] = list(trusted_owners(owner))
        #: the managed table's token (default $FEEDLOG_OWNER_TOKEN); registering a table without one
        #: makes a new one here, which writers then need
        self.token = token if token is not None else default_token()
        self.tls = tls
        self._committers: dict[tuple[Binding, str], ManagedCommitter] = {}
        self._warned: set[tuple[Binding, str]] = set()

    def trust(self, binding: Binding) -> None:
        """Trust `binding` from now on (the owner a table is created with or handed to)."""
        self.trusted.append(binding)

    def trusts(self, binding: Binding, location: str, write: bool) -> bool:
        """May this handle talk to `binding`? Writers also trust the table's own embedded owner."""
        if is_trusted(binding, self.trusted):
            return True
        return write and is_embedded(binding, location)

    def committer(
        self, binding: Binding, table_id: str, storage: Storage, registering: bool = False
    ) -> ManagedCommitter:
        """The committer of table `table_id` in `storage` through owner `binding`; OwnerNotTrusted
        if this handle may not talk to it. Registering a table without a token makes one."""
        location = storage.location
        if not self.trusts(binding, location, write=True):
            raise OwnerNotTrusted(
                f"{location} is managed by commit owner {binding.describe()}, which is not one "
                f"this process trusts: writing needs it; pass owner={binding.describe()!r} "
                f"(CLI: --owner, or ${OWNER_ENV}) if it is the table's owner"
            )
        if registering and self.token is None:
            self.token = new_token()
        key = (binding, table_id)
        committer = self._committers.get(key)
        if committer is None:
            ref = TableRef(table_id, location)
            owner = resolve_owner(binding, self.tls)
            if isinstance(owner, LocalOwner):
                owner.adopt(storage)  # the in-process owner reaches the table as this process does
            committer = ManagedCommitter(owner, ref, Auth(self.token))
            self._committers[key] = committer
        elif registering:
            committer.auth = Auth(self.token)
        return committer

    def router(self, storage: Storage, protocol: Protocol | None, metadata: Metadata | None) -> Router:
        """The committer of a table at `storage` whose latest protocol and metadata are these."""
        return Router(
            protocol,
            metadata,
            lambda b, table_id, registering: self.committer(b, table_id, storage, registering),
        )

    def ratified(
        self, storage: Storage, protocol: Protocol | None, metadata: Metadata | None, start: int, write: bool
    ) -> list[tuple[int, FileInfo]]:
        """Commits >= start the table's owner ratified and has not backfilled.

        A reader asks only an owner it trusts and reads without one when it is untrusted or
        unreachable (an `OwnerNotConsulted` warning says so, if that can hide anything); a writer
        needs the owner (OwnerNotTrusted, Unavailable).
        """
        binding = Binding.of(protocol, metadata)
        if binding is None or metadata is None:
            return []
        if not write and not self.trusts(binding, storage.location, write=False):
            if staged_from(storage, start):
                self._warn(storage, binding, "untrusted")
            return []
        committer = self.committer(binding, metadata.id, storage)
        if write:
            return committer.ratified_commits(storage, start)
        try:
            return committer.ratified_commits(storage, start)
        except Unavailable as e:
            if staged_from(storage, start):
                self._warn(storage, binding, f"unreachable ({e})")
            return []

    def _warn(self, storage: Storage, binding: Binding, why: str) -> None:
        key = (binding, why.split(" ", 1)[0])
        if key in self._warned:
            return
        self._warned.add(key)
        if why == "untrusted":
            reason = (
                f"it is not one this process trusts (pass owner=, --owner or ${OWNER_ENV} to ask it); "
                "nothing a table names is opened without that"
            )
        else:
            reason = f"it is {why}"
        warnings.warn(
            f"{storage.location}: reading the backfilled log only, without commit owner "
            f"{binding.describe()}: {reason}; commits it ratified but has not backfilled are not seen",
            OwnerNotConsulted,
            stacklevel=5,
        )


def staged_from(storage: Storage, start: int) -> bool:
    """Whether a staged commit of version >= start exists. Without one the owner cannot hold a
    ratified, unbackfilled commit (a writer stages before the owner ratifies), so a reader that
    skips the owner misses nothing and need not be warned."""
    names = (f.path.rpartition("/")[2] for f in storage.list(COMMITS_DIR, stat=False))
    return any(v is not None and v >= start for v in map(staged_version, names))
