"""`feedlog table create|history|version-at|checkpoint|cleanup|vacuum|optimize|enable-ict|info|backfill|convert PATH`.

Every command works on managed tables too: the table's metadata names its
commit owner, reads ask it for un-backfilled commits, and writes present the
table's token: `--token-file FILE`, $FEEDLOG_OWNER_TOKEN, or the file `table create`
wrote it to (`<table>/_feedlog/owner-token` by default, mode 0600). The token is
never printed: a command line and a terminal are seen by others (ps, scrollback,
CI logs), a mode-0600 file is not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..errors import AlreadyExists, Conflict, InvalidArgument, Unavailable
from ..log.timestamps import format_duration, parse_duration
from .args import (
    Handler,
    Parser,
    Subcommands,
    add_command,
    given_token,
    read_token_file,
    storage_option_args,
    storage_options_of,
)
from .fmt import Json, emit, fmt_size, fmt_ts, plural
from .remote import tls_args, tls_of

if TYPE_CHECKING:  # Delta and pyarrow load when a table command runs, not for every `feedlog` command
    import pyarrow as pa

    from ..delta import DeltaTable

#: feedlog.delta.managed's OWNER_ENV and TOKEN_ENV (tests/test_cli_output.py checks): importing it
#: here would load Delta and pyarrow (about a second) for every command, `feedlog get` too
OWNER_ENV = "FEEDLOG_OWNER"
TOKEN_ENV = "FEEDLOG_OWNER_TOKEN"


def _types() -> dict[str, pa.DataType]:
    import pyarrow as pa

    return {
        "long": pa.int64(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "integer": pa.int32(),
        "short": pa.int16(),
        "byte": pa.int8(),
        "string": pa.string(),
        "binary": pa.binary(),
        "boolean": pa.bool_(),
        "double": pa.float64(),
        "float": pa.float32(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }


def parse_schema(text: str) -> pa.Schema:
    """'id:long, name:string' -> an Arrow schema (Delta's primitive type names)."""
    import pyarrow as pa

    types = _types()
    fields = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, kind = part.partition(":")
        if not name.strip() or kind.strip().lower() not in types:
            raise InvalidArgument(
                f"bad column {part!r}: expected NAME:TYPE with TYPE one of {', '.join(sorted(types))}"
            )
        fields.append(pa.field(name.strip(), types[kind.strip().lower()]))
    if not fields:
        raise InvalidArgument("the schema needs at least one column, e.g. --schema 'id:long,name:string'")
    return pa.schema(fields)


#: where `table create` keeps a generated token, inside the table (readers skip `_` directories);
#: the Spark sink keeps its embedded owner's token in the same file (feedlog.lake.sink.TOKEN_FILE)
TOKEN_FILE = os.path.join("_feedlog", "owner-token")


def token_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"a file holding a managed table's owner token (default: ${TOKEN_ENV}, else <TABLE>/{TOKEN_FILE})",
    )
    g.add_argument(
        "--token",
        help="the token itself (visible to other users in ps: prefer --token-file; one starting with '-' goes "
        "as --token=TOKEN)",
    )


def token_of(ns: argparse.Namespace, table: str | None = None) -> str | None:
    """--token-file, --token (warned about), $FEEDLOG_OWNER_TOKEN, then `table`'s own token file."""
    token = given_token(ns, TOKEN_ENV)
    if token is None and table is not None and os.path.isfile(os.path.join(table, TOKEN_FILE)):
        return read_token_file(os.path.join(table, TOKEN_FILE))
    return token


def write_token_file(path: str, token: str) -> str:
    """Write a new token to `path` with mode 0600 (atomically: a reader never sees half of it)."""
    path = os.path.abspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InvalidArgument(f"cannot write the owner token to {path}: {e.strerror}") from None
    return path


def open_table(ns: argparse.Namespace) -> DeltaTable:
    from ..delta import DeltaTable

    # --owner: the commit owner to trust (default $FEEDLOG_OWNER); a table's own conf is not enough
    return DeltaTable.open(
        ns.path,
        owner_token=token_of(ns, ns.path),
        owner_tls=tls_of(ns),
        owner=getattr(ns, "owner", None),
        storage_options=storage_options_of(ns),
    )


def _new_token_file(ns: argparse.Namespace) -> tuple[str, str]:
    """A fresh token for a table becoming managed, already in its file (so it is never only on screen)."""
    from ..delta.managed import new_token
    from ..delta.objectstore import scheme_of

    if not ns.token_out and scheme_of(ns.path) is not None:
        raise InvalidArgument(f"{ns.path} is not a local directory: give --token-out FILE for the new owner token")
    return (token := new_token()), write_token_file(ns.token_out or os.path.join(ns.path, TOKEN_FILE), token)


def _say_token_file(ns: argparse.Namespace, where: str | None) -> None:
    if where is not None and not getattr(ns, "json", False):
        print(f"owner token written to {where} (mode 0600): writers give --token-file {where} or set {TOKEN_ENV}")


def cmd_create(ns: argparse.Namespace) -> None:
    from ..delta import DeltaTable
    from ..delta.managed import Binding
    from ..delta.objectstore import scheme_of

    props = {}
    for item in ns.property or ():
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidArgument(f"bad --property {item!r}: expected KEY=VALUE")
        props[key] = value
    owner = Binding.parse(ns.owner, ns.batch_size) if ns.owner else None
    if ns.batch_size is not None and owner is None:
        raise InvalidArgument("--batch-size is for managed tables: give --owner too")
    if ns.token_out and owner is None:
        raise InvalidArgument("--token-out is for managed tables: give --owner too")
    schema = parse_schema(ns.schema)  # bad input fails before a token file is written
    options = storage_options_of(ns)  # bad input fails before a token file is written
    if owner is not None:
        _check_owner_answers(owner.config.get("endpoint"))  # an unreachable owner: refused, nothing created
    local = scheme_of(ns.path) is None
    before = {d: os.path.exists(os.path.join(ns.path, d)) for d in ("", "_delta_log", "_feedlog")} if local else {}
    token, where = token_of(ns), None
    if owner is not None and token is None:
        token, where = _new_token_file(ns)
    try:
        DeltaTable.create(
            ns.path,
            schema,
            partition_by=[c.strip() for c in (ns.partition_by or "").split(",") if c.strip()],
            properties=props,
            in_commit_timestamps=not ns.no_ict,
            owner=owner,
            owner_token=token,
            owner_tls=tls_of(ns),
            storage_options=options,
        )
    except BaseException as e:
        if where is not None:  # the token guards nothing: do not leave it behind
            with contextlib.suppress(OSError):
                os.unlink(where)
        # a refused create leaves nothing behind; but an owner that did not answer may have committed
        # version 0 (the error says so): then its staged commit must stay; and a table someone else
        # created meanwhile (AlreadyExists) is theirs
        if local and not isinstance(e, Unavailable | AlreadyExists | Conflict):
            _remove_new(ns.path, before)
        raise
    _say_token_file(ns, where)
    emit(ns, {"version": 0, "managed": owner is not None, "token_file": where}, f"created {ns.path} (version 0)")


def _remove_new(path: str, before: dict[str, bool]) -> None:
    """Remove what a failed `table create` made in the local directory `path` (what was there before stays)."""
    if not before[""]:
        shutil.rmtree(path, ignore_errors=True)
        return
    for d in ("_delta_log", "_feedlog"):
        if not before[d]:
            shutil.rmtree(os.path.join(path, d), ignore_errors=True)


#: seconds a new managed table waits for its commit owner to accept a connection
OWNER_CONNECT_TIMEOUT = 5.0


def _check_owner_answers(endpoint: str | None) -> None:
    """Refuse to create a table managed by a gRPC commit owner none of whose endpoints accepts a connection.

    A plain TCP connect: a refused or unroutable owner fails at once, before any
    file exists (the commit itself cannot tell "not committed" from "no answer").
    """
    if not endpoint:
        return  # an owner database: opened in-process
    from ..delta.managed.protocol import owner_endpoints
    from ..rpc import Address

    for url in owner_endpoints(endpoint):
        host, _, port = Address.parse(url).target.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=OWNER_CONNECT_TIMEOUT).close()
            return
        except OSError:
            continue
    raise Unavailable(f"the commit owner {endpoint} does not answer: nothing was created; start it or check --owner")


def cmd_backfill(ns: argparse.Namespace) -> None:
    done = open_table(ns).backfill(ns.version)
    emit(ns, {"backfilled": done}, f"backfilled through version {done}")


def cmd_convert(ns: argparse.Namespace) -> None:
    table = open_table(ns)
    if ns.to_filesystem:
        r = table.convert_to_filesystem()
        emit(ns, {"version": r.version, "managed": False}, f"now a filesystem table (version {r.version})")
        return
    from ..delta.managed import Binding

    binding = Binding.parse(ns.to_managed, ns.batch_size)
    where = None
    if table.owner_token is None:
        table.owner_token, where = _new_token_file(ns)
    try:
        r = table.convert_to_managed(binding)
    except BaseException:
        if where is not None:
            with contextlib.suppress(OSError):
                os.unlink(where)
        raise
    _say_token_file(ns, where)
    emit(ns, {"version": r.version, "managed": True, "token_file": where}, f"now a managed table (version {r.version})")


def parse_timestamp(text: str) -> int:
    """ISO 8601 (a naive time is UTC) or integer ms since the epoch -> ms."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"bad timestamp {text!r}: use ISO 8601 (2026-11-21T10:00:00Z) or milliseconds since the epoch"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def cmd_history(ns: argparse.Namespace) -> None:
    if ns.limit is not None and ns.limit < 1:
        raise InvalidArgument("--limit must be >= 1")
    entries = open_table(ns).history(ns.limit)
    rows = [e.to_json() for e in entries]

    def human() -> None:
        for e in entries:
            source = "(ict)" if e.in_commit_timestamp is not None else "(file)"
            print(f"{e.version:>8}  {fmt_ts(e.timestamp)} {source:<6}  {e.operation or '-'}")

    emit(ns, rows, human)


def cmd_version_at(ns: argparse.Namespace) -> None:
    ts = parse_timestamp(ns.timestamp)
    version = open_table(ns).version_at(ts)
    emit(ns, {"timestamp": ts, "version": version}, str(version))


def cmd_checkpoint(ns: argparse.Namespace) -> None:
    version = open_table(ns).checkpoint(ns.version)
    emit(ns, {"checkpoint": version}, f"checkpoint written at version {version}")


def cmd_cleanup(ns: argparse.Namespace) -> None:
    retain = None if ns.retain is None else parse_duration(ns.retain)
    deleted = open_table(ns).cleanup(retain)
    emit(ns, {"deleted": deleted}, f"deleted {plural(len(deleted), 'log file')}")


def parse_retention(text: str) -> int:
    """`--retain`: a duration such as 7d, 12h or 0s (zero allowed here, unlike `parse_duration`)."""
    if text.strip().startswith("-"):
        raise InvalidArgument(f"bad retention {text!r}: must not be negative")
    if re.fullmatch(r"\s*0+\s*(ms|s|m|h|d)\s*", text):
        return 0
    return parse_duration(text)


def cmd_vacuum(ns: argparse.Namespace) -> None:
    retain = None if ns.retain is None else parse_retention(ns.retain)
    r = open_table(ns).vacuum(retain, dry_run=ns.dry_run, enforce_retention=not ns.force)
    doc: dict[str, Json] = {
        "dry_run": r.dry_run,
        "files": list(r.files),
        "size": r.size,
        "directories": r.directories,
        "directories_deleted": r.directories_deleted,
        "retention_ms": r.retention_ms,
        "cutoff": r.cutoff_ms,
        "start_version": r.start_version,
        "end_version": r.end_version,
    }

    def human() -> None:
        verb = "would delete" if r.dry_run else "deleted"
        for path in r.files if r.dry_run else ():
            print(path)
        versions = "" if r.dry_run else f" (versions {r.start_version} and {r.end_version})"
        left = plural(r.directories_deleted, "directory", "directories")
        dirs = f", and {left} left empty" if r.directories_deleted else ""
        print(
            f"{verb} {plural(len(r.files), 'file')} ({r.size} bytes) unreferenced since before "
            f"{fmt_ts(r.cutoff_ms)}{dirs}{versions}"
        )

    emit(ns, doc, human)


def cmd_optimize(ns: argparse.Namespace) -> None:
    from ..delta.optimize import parse_size

    size = None if ns.target_size is None else parse_size(ns.target_size)  # bad input: before opening
    r = open_table(ns).optimize(size)
    doc: dict[str, Json] = {
        "version": r.version,
        "target_size": r.target_size,
        "files_before": r.files_before,
        "files_after": r.files_after,
        "files_removed": r.files_removed,
        "files_added": r.files_added,
        "bytes_removed": r.bytes_removed,
        "bytes_added": r.bytes_added,
        "partitions_optimized": r.partitions_optimized,
        "seconds": round(r.seconds, 3),
        "metrics": dict(r.metrics),
    }

    def human() -> None:
        if r.version is None:
            print(f"nothing to compact: {plural(r.files_before, 'live file')} (target {fmt_size(r.target_size)})")
            return
        print(
            f"compacted {plural(r.files_removed, 'file')} ({fmt_size(r.bytes_removed)}) into "
            f"{plural(r.files_added, 'file')} ({fmt_size(r.bytes_added)}) in {r.seconds:.1f} s: "
            f"{r.files_before:,} -> {plural(r.files_after, 'live file')} (version {r.version}, "
            f"target {fmt_size(r.target_size)})"
        )

    emit(ns, doc, human)


def cmd_enable_ict(ns: argparse.Namespace) -> None:
    result = open_table(ns).enable_ict()
    if result.skipped:
        emit(ns, {"enabled": True, "version": None}, "in-commit timestamps were already enabled")
    else:
        emit(
            ns,
            {"enabled": True, "version": result.version, "in_commit_timestamp": result.in_commit_timestamp},
            f"in-commit timestamps enabled at version {result.version} ({fmt_ts(result.in_commit_timestamp)})",
        )


def cmd_info(ns: argparse.Namespace) -> None:
    info = open_table(ns).info()

    def human() -> None:
        p = info["protocol"]
        print(f"location    {info['location']}")
        print(f"version     {info['version']}")
        print(f"protocol    reader {p['minReaderVersion']}, writer {p['minWriterVersion']}")
        print(f"features    {', '.join(info['features']) or '-'}")
        print(f"files       {info['files']}")
        print(f"rows        {'unknown' if info['rows'] is None else info['rows']}")
        print(f"partitions  {', '.join(info['partition_columns']) or '-'}")
        print(f"backfilled  {info['backfilled_version']}")
        owner = info["commit_owner"]
        print(f"owner       {' '.join(f'{k}={v}' for k, v in sorted(owner.items())) if owner else '-'}")
        for k, v in sorted(info["properties"].items()):
            print(f"property    {k}={v}")
        r = info["retention"]
        files, log = format_duration(r["deleted_file_retention_ms"]), format_duration(r["log_retention_ms"])
        print("forgetting  a row made a tombstone (TTL compaction, a forget rewrite: `feedlog maintain`) leaves")
        print(f"            the data files {files} later (delta.deletedFileRetentionDuration; vacuum) and")
        print(f"            the log's file stats {log} later (delta.logRetentionDuration; cleanup after a checkpoint)")
        print(f"horizon     {fmt_ts(r['time_travel_horizon_ms'])}: older versions that read removed files are refused")
        oldest = r["oldest_version"]
        print(f"oldest      version {oldest}{' (older log entries were cleaned up)' if oldest else ''}")

    emit(ns, info, human)


def register(sub: Subcommands) -> None:
    table = sub.add_parser("table", help="inspect and maintain Delta tables", description="Delta table commands")
    tsub = table.add_subparsers(dest="table_command", metavar="COMMAND", parser_class=Parser)
    tsub.required = True

    def add(name: str, handler: Handler, help_: str, json_out: bool = True) -> Parser:
        p = add_command(tsub, name, handler, help_)
        p.add_argument("path", help="the table's directory or object-store URL (s3://, gs://, az://, file://)")
        storage_option_args(p)
        if json_out:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        token_args(p)
        if name != "create":  # create's --owner names the new table's owner (trusted too)
            p.add_argument(
                "--owner",
                metavar="OWNER",
                help="the commit owner to trust, grpc://HOST:PORT, an owner database file or postgresql://USER@HOST/DB "
                f"(default: ${OWNER_ENV}); "
                "without it a managed table is read from its backfilled log and cannot be written",
            )
        tls_args(p)
        return p

    p = add("create", cmd_create, "create a table (managed by a commit owner with --owner)")
    p.add_argument("--schema", required=True, help="columns, e.g. 'id:long,name:string'")
    p.add_argument("--partition-by", metavar="COLS", help="comma-separated partition columns")
    p.add_argument("--property", action="append", metavar="KEY=VALUE", help="a table property (repeatable)")
    p.add_argument("--no-ict", action="store_true", help="without in-commit timestamps (not for managed tables)")
    p.add_argument(
        "--owner",
        metavar="OWNER",
        help="grpc://HOST:PORT of a commit owner, an owner database file, or postgresql://USER@HOST/DB (no password)",
    )
    p.add_argument("--batch-size", type=int, metavar="N", help="the owner backfills every N commits (default 1)")
    p.add_argument(
        "--token-out", metavar="FILE", help=f"where to write a generated token (default <TABLE>/{TOKEN_FILE})"
    )

    p = add("history", cmd_history, "commits, newest first, with their time (in-commit timestamp or file time)")
    p.add_argument("--limit", type=int, metavar="N", help="only the newest N commits")
    p = add("version-at", cmd_version_at, "the table version as of a time (ISO 8601 or ms since the epoch)")
    p.add_argument("timestamp")
    p = add("checkpoint", cmd_checkpoint, "write a Parquet checkpoint (and _last_checkpoint)")
    p.add_argument("--version", type=int, metavar="V", help="checkpoint this version (default: latest)")
    p = add("cleanup", cmd_cleanup, "delete log files older than the retention, keeping what time travel needs")
    p.add_argument(
        "--retain", metavar="DURATION", help="keep this much history, e.g. 7d (default: delta.logRetentionDuration)"
    )
    p = add("vacuum", cmd_vacuum, "delete data files no version inside the retention needs (VACUUM)")
    p.add_argument(
        "--retain",
        metavar="DURATION",
        help="keep files removed within this long, e.g. 7d or 0s (default: delta.deletedFileRetentionDuration, 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete and commit nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help="allow a --retain shorter than the table's delta.deletedFileRetentionDuration (delta's "
        "retentionDurationCheck off): readers of old versions and running writers may lose files",
    )
    p = add("optimize", cmd_optimize, "compact small data files into files near a target size (OPTIMIZE)")
    p.add_argument(
        "--target-size",
        metavar="SIZE",
        help="bytes per file, e.g. 128MiB, 1GB or 1048576 (units are powers of 1024, as in Spark; "
        "default: the table's delta.targetFileSize, else 100MiB)",
    )
    add("enable-ict", cmd_enable_ict, "turn on in-commit timestamps for an existing table")
    add("info", cmd_info, "version, protocol, features, properties, file and row counts")
    p = add("backfill", cmd_backfill, "have a managed table's owner copy ratified commits into _delta_log")
    p.add_argument("--version", type=int, metavar="V", help="backfill through this version (default: all)")
    p = add("convert", cmd_convert, "hand the table to a commit owner, or take it back to the filesystem")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--to-managed", metavar="OWNER", help="grpc://HOST:PORT or an owner database file")
    g.add_argument("--to-filesystem", action="store_true", help="remove the commit owner")
    p.add_argument("--batch-size", type=int, metavar="N", help="the owner backfills every N commits (default 1)")
    p.add_argument(
        "--token-out", metavar="FILE", help=f"where to write a generated token (default <TABLE>/{TOKEN_FILE})"
    )
