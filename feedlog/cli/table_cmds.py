"""`feedlog table history|version-at|checkpoint|cleanup|enable-ict|info PATH`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from ..delta import DeltaTable
from ..errors import InvalidArgument
from ..log.timestamps import parse_duration
from . import emit
from .feed_cmds import fmt_ts


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
    entries = DeltaTable.open(ns.path).history(ns.limit)
    rows = [
        {
            "version": e.version,
            "timestamp": e.timestamp,
            "in_commit_timestamp": e.in_commit_timestamp,
            "operation": e.operation,
            "operation_parameters": e.operation_parameters,
        }
        for e in entries
    ]

    def human() -> None:
        for e in entries:
            source = "ict " if e.in_commit_timestamp is not None else "file"
            print(f"{e.version:>8}  {fmt_ts(e.timestamp)} ({source})  {e.operation or '-'}")

    emit(ns, rows, human)


def cmd_version_at(ns: argparse.Namespace) -> None:
    ts = parse_timestamp(ns.timestamp)
    version = DeltaTable.open(ns.path).version_at(ts)
    emit(ns, {"timestamp": ts, "version": version}, str(version))


def cmd_checkpoint(ns: argparse.Namespace) -> None:
    version = DeltaTable.open(ns.path).checkpoint(ns.version)
    emit(ns, {"checkpoint": version}, f"checkpoint written at version {version}")


def cmd_cleanup(ns: argparse.Namespace) -> None:
    retain = None if ns.retain is None else parse_duration(ns.retain)
    deleted = DeltaTable.open(ns.path).cleanup(retain)
    emit(ns, {"deleted": deleted}, f"deleted {len(deleted)} log file(s)")


def cmd_enable_ict(ns: argparse.Namespace) -> None:
    result = DeltaTable.open(ns.path).enable_ict()
    if result.skipped:
        emit(ns, {"enabled": True, "version": None}, "in-commit timestamps were already enabled")
    else:
        emit(
            ns,
            {"enabled": True, "version": result.version, "in_commit_timestamp": result.in_commit_timestamp},
            f"in-commit timestamps enabled at version {result.version} ({fmt_ts(result.in_commit_timestamp)})",
        )


def cmd_info(ns: argparse.Namespace) -> None:
    info = DeltaTable.open(ns.path).info()

    def human() -> None:
        p = info["protocol"]
        print(f"location    {info['location']}")
        print(f"version     {info['version']}")
        print(f"protocol    reader {p['minReaderVersion']}, writer {p['minWriterVersion']}")
        print(f"features    {', '.join(info['features']) or '-'}")
        print(f"files       {info['files']}")
        print(f"rows        {'unknown' if info['rows'] is None else info['rows']}")
        print(f"partitions  {', '.join(info['partition_columns']) or '-'}")
        for k, v in sorted(info["properties"].items()):
            print(f"property    {k}={v}")

    emit(ns, info, human)


def register(sub: Any) -> None:
    table = sub.add_parser("table", help="inspect and maintain Delta tables", description="Delta table commands")
    tsub = table.add_subparsers(dest="table_command", metavar="COMMAND", parser_class=type(table))
    tsub.required = True

    def add(name: str, handler: Any, help_: str, json_out: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = tsub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        p.add_argument("path", help="the table's directory")
        if json_out:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

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
    add("enable-ict", cmd_enable_ict, "turn on in-commit timestamps for an existing table")
    add("info", cmd_info, "version, protocol, features, properties, file and row counts")
