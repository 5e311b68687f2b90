"""Managed commits (the managed-commits RFC), in one package.

With `managedCommits` the filesystem holds what a commit says and the commit
owner decides whether it happened. A writer stages version v as
`_delta_log/_commits/<v>.<uuid>.json`, then asks the owner to ratify it; the
owner backfills ratified commits to `_delta_log/<v>.json` in order and forgets
them. Readers that know the owner add its un-backfilled commits to the listing.

- `protocol`: the types every party shares (`Binding`: the owner a table names;
  `TableRef`, `Auth`, the `CommitOwner` interface) and the trust rules.
- `staged`: staged-commit names, their cheap parse, and their housekeeping.
- `rules`: the owner's decisions as pure functions (ratify: gap, taken,
  released, the ICT must increase; which call an ownership change is).
- `sqlite`: the owner itself (`LocalOwner`: the in-process owner and the engine
  behind the gRPC service), its SQL written once for two databases:
  `database` (what both share), SQLite (embedded) and `postgres` (several owner
  processes on several hosts sharing one PostgreSQL database).
- `client`: `GrpcOwner`, the `CommitOwner` interface over gRPC, failing over
  along an endpoint list (`grpc://h1:7070,h2:7070`).
- `committer`: `ManagedCommitter` (stage, ask, resolve a lost answer) and
  `Router`, the `Committer` a table commits through.
"""

from .client import GrpcOwner
from .committer import ManagedCommitter, resolve_owner
from .protocol import (
    DEFAULT_BATCH_SIZE,
    FEEDLOG_OWNER,
    OWNER_ENV,
    TOKEN_ENV,
    Auth,
    Binding,
    CommitOwner,
    Commits,
    OwnerNotConsulted,
    OwnerNotTrusted,
    RatifiedCommit,
    TableRef,
    TableStatus,
    default_token,
    new_token,
    trusted_owners,
)
from .sqlite import LocalOwner
from .staged import COMMITS_DIR, clean_staged, staged_actions, staged_data_paths, staged_name, staged_version

__all__ = [
    "COMMITS_DIR",
    "DEFAULT_BATCH_SIZE",
    "FEEDLOG_OWNER",
    "OWNER_ENV",
    "TOKEN_ENV",
    "Auth",
    "Binding",
    "CommitOwner",
    "Commits",
    "GrpcOwner",
    "LocalOwner",
    "ManagedCommitter",
    "OwnerNotConsulted",
    "OwnerNotTrusted",
    "RatifiedCommit",
    "TableRef",
    "TableStatus",
    "clean_staged",
    "default_token",
    "new_token",
    "resolve_owner",
    "staged_actions",
    "staged_data_paths",
    "staged_name",
    "staged_version",
    "trusted_owners",
]
