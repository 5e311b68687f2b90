"""`feedlog create|put|del|append|get|history|cat|info|timestamp|verify|compact`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO

from ..errors import InvalidArgument
from ..log.core import MAX_BATCH_BYTES
from ..log.entries import DRIVE_EVENT, PROTOCOLS
from ..log.feed import DEFAULT_TIMESTAMPS, Feed, Write
from ..log.timestamps import TimestampPolicy, parse_duration
from ..replication import wire
from .args import Handler, Parser, Subcommands, add_command
from .fmt import Json, appended_json, emit, fmt_ts, record_json, record_line
from .remote import client_for, is_remote, tls_args

DEFAULT_BATCH = 1000


@contextmanager
def opened(path: str, writable: bool = False) -> Iterator[Feed]:
    feed = Feed.open(path, writable=writable)
    try:
        yield feed
    finally:
        feed.close()


def policy_arg(text: str) -> TimestampPolicy:
    return TimestampPolicy.parse(text)


# ---- handlers ----------------------------------------------------------------------------


def cmd_create(ns: argparse.Namespace) -> None:
    if is_remote(ns.path):
        return remote_create(ns)
    feed = Feed.create(ns.path, content_type=ns.type, timestamps=ns.timestamps, ttl=ns.ttl, fsync=not ns.no_fsync)
    info = feed.info()
    feed.close()
    emit(ns, info, f"created {ns.path}\nkey {info['key']}")


def parse_value(content_type: str, raw: str, is_hex: bool) -> bytes | dict[str, object]:
    if content_type == DRIVE_EVENT:
        try:
            stat = json.loads(raw)
        except ValueError:
            stat = None
        if not isinstance(stat, dict):
            raise InvalidArgument('a drive-event feed takes a JSON stat as VALUE, e.g. \'{"mode": 33188, "size": 5}\'')
        return stat
    if is_hex:
        try:
            return bytes.fromhex(raw)
        except ValueError:
            raise InvalidArgument(f"--hex given but VALUE is not hex: {raw!r}") from None
    return raw.encode("utf-8")


def cmd_put(ns: argparse.Namespace) -> None:
    if is_remote(ns.path):
        return remote_put(ns, deleted=False)
    with opened(ns.path, writable=True) as feed:
        a = feed.put(ns.key, parse_value(feed.content_type, ns.value, ns.hex), ttl=ns.ttl, timestamps=ns.timestamps)
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def cmd_del(ns: argparse.Namespace) -> None:
    if is_remote(ns.path):
        return remote_put(ns, deleted=True)
    with opened(ns.path, writable=True) as feed:
        a = feed.delete(ns.key, timestamps=ns.timestamps)
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def parse_jsonl_line(feed: Feed, line: str, lineno: int) -> Write:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise InvalidArgument(f"line {lineno}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("key"), str):
        raise InvalidArgument(f'line {lineno}: expected an object with a string "key"')
    known = {"key", "value", "value_hex", "stat", "deleted", "ttl", "timestamps"}
    extra = set(obj) - known
    if extra:
        raise InvalidArgument(f"line {lineno}: unknown field(s) {', '.join(sorted(extra))}")
    try:
        deleted = bool(obj.get("deleted", False))
        value: bytes | dict[str, object] | None = None
        if not deleted:
            if feed.content_type == DRIVE_EVENT:
                value = obj.get("stat")
                if not isinstance(value, dict):
                    raise InvalidArgument('a drive-event line needs "stat" (or "deleted": true)')
            elif "value_hex" in obj:
                value = bytes.fromhex(obj["value_hex"])
            elif isinstance(obj.get("value"), str):
                value = obj["value"].encode("utf-8")
            else:
                raise InvalidArgument('needs "value" (a string) or "value_hex"')
        ttl = parse_duration(obj["ttl"]) if obj.get("ttl") else None
        policy = TimestampPolicy.parse(obj["timestamps"]) if obj.get("timestamps") else None
    except (InvalidArgument, ValueError, TypeError) as e:
        raise InvalidArgument(f"line {lineno}: {e}") from None
    return Write(obj["key"], value, deleted, ttl, policy)


class Progress:
    """A one-line progress display on a terminal (silent otherwise)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.on = stream.isatty()
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.on or (not final and now - self.last < 0.1):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        self.stream.write(f"\rappended {done:,} entries ({rate:,.0f}/s)" + ("\n" if final else ""))
        self.stream.flush()


def cmd_append(ns: argparse.Namespace) -> None:
    if ns.batch < 1:
        raise InvalidArgument("--batch must be at least 1")
    src: IO[str] = sys.stdin if ns.jsonl == "-" else open(ns.jsonl, encoding="utf-8")  # noqa: SIM115
    seqs: list[int] = []  # first and last seq appended
    done = 0
    progress = Progress(sys.stderr)
    try:
        with opened(ns.path, writable=True) as feed:
            batch: list[Write] = []
            weight = 0

            def flush() -> None:
                nonlocal batch, done, weight
                out = feed.append(batch)
                seqs[:] = [seqs[0] if seqs else out[0].seq, out[-1].seq]
                done += len(batch)
                batch, weight = [], 0
                progress.update(done)

            for lineno, line in enumerate(src, 1):
                if not line.strip():
                    continue
                try:
                    write = parse_jsonl_line(feed, line, lineno)
                except InvalidArgument as e:
                    raise InvalidArgument(f"{e} ({done} entries before it were appended)") from None
                if batch and weight + write.weight() > MAX_BATCH_BYTES:  # large values: a batch no reader could take
                    flush()
                batch.append(write)
                weight += write.weight()
                if len(batch) >= ns.batch:
                    flush()
            if batch:
                flush()
            progress.update(done, final=True)
            length = feed.length
    finally:
        if src is not sys.stdin:
            src.close()
    first, last = seqs if seqs else (None, None)
    emit(
        ns,
        {"appended": done, "first_seq": first, "last_seq": last, "length": length},
        f"appended {done} entries (seq {first}..{last}), length {length}" if done else "nothing appended",
    )


def cmd_get(ns: argparse.Namespace) -> int:
    with opened(ns.path) as feed:
        r = feed.get(ns.key)
        now = feed.clock.now_ms()
    if r is None:
        emit(ns, None, None)
        if not ns.json:
            print(f"feedlog: {ns.key!r} not found (never written, deleted or expired)", file=sys.stderr)
        return 3
    if ns.json:
        emit(ns, record_json(r, now))
    elif r.stat is not None:
        print(json.dumps(r.stat))
    else:
        out = sys.stdout.buffer
        out.write(r.value or b"")
        if sys.stdout.isatty():
            out.write(b"\n")
        out.flush()
    return 0


def cmd_history(ns: argparse.Namespace) -> None:
    with opened(ns.path) as feed:
        rows = feed.history(ns.key)
        now = feed.clock.now_ms()
    if ns.json:
        emit(ns, [record_json(r, now) for r in rows])
    else:
        for r in rows:
            print(record_line(r, now))


def cmd_cat(ns: argparse.Namespace) -> None:
    with opened(ns.path) as feed:
        now = feed.clock.now_ms()
        start = max(ns.from_, 1)
        end = feed.length if ns.to is None else min(ns.to + 1, feed.length)
        for r in feed.records(start, end):
            if ns.json:
                print(json.dumps(record_json(r, now, raw=ns.raw)))
            elif ns.raw:
                print(f"{r.seq}\t" + ("(cleared)" if r.block is None else r.block.hex()))
            else:
                print(record_line(r, now))


def cmd_info(ns: argparse.Namespace) -> None:
    info: Mapping[str, Json]
    if is_remote(ns.path):
        info = remote_info(ns)
    else:
        with opened(ns.path) as feed:
            info = feed.info()

    def human() -> None:
        for k, v in info.items():
            if k.endswith("timestamp") and isinstance(v, int):
                v = f"{v} ({fmt_ts(v)})"
            print(f"{k:<16}{'-' if v is None else v}")

    emit(ns, info, human)


def cmd_timestamp(ns: argparse.Namespace) -> int:
    with opened(ns.path) as feed:
        ts = feed.timestamp(ns.seq)
    emit(
        ns,
        {"seq": ns.seq, "timestamp": ts, "iso": None if ts is None else fmt_ts(ts)},
        f"{ts}\t{fmt_ts(ts)}" if ts is not None else "no timestamp",
    )
    return 0


def cmd_verify(ns: argparse.Namespace) -> None:
    with opened(ns.path) as feed:
        rep = feed.verify()
        key = feed.key.hex()
    data: dict[str, Json] = {
        "ok": True,
        "key": key,
        "length": rep.length,
        "byte_length": rep.byte_length,
        "cleared": rep.cleared,
        "tree_hash": rep.tree_hash.hex(),
    }
    emit(
        ns,
        data,
        f"ok: {rep.length} blocks ({rep.byte_length} bytes, {rep.cleared} cleared) verify against the signed root",
    )


def cmd_compact(ns: argparse.Namespace) -> None:
    with opened(ns.path, writable=True) as feed:
        rep = feed.compact(overwritten=ns.overwritten)
    emit(
        ns,
        {"cleared": rep.cleared, "bytes_cleared": rep.bytes_cleared},
        f"cleared {rep.cleared} blocks ({rep.bytes_cleared} bytes); Merkle nodes kept",
    )


def cmd_demo(ns: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(ns.dir)


# ---- the remote forms (grpc://HOST:PORT[/KEY]): the same commands on a feed a peer holds --------------


def remote_create(ns: argparse.Namespace) -> None:
    _address, client = client_for(ns, ns.path, need_feed=False, write=True)
    with client:
        info = wire.info_json(client.create(ns.type, str(ns.timestamps), ns.ttl or ""))
    emit(ns, info, f"created on {ns.path}\nkey {info['key']}")


def remote_put(ns: argparse.Namespace, deleted: bool) -> None:
    address, client = client_for(ns, ns.path, write=True)
    with client:
        key = address.key
        value = None if deleted else parse_value(client.info(key).content_type, ns.value, ns.hex)
        ttl = parse_duration(ns.ttl) if getattr(ns, "ttl", None) else None
        a = client.put(key, [Write(ns.key, value, deleted, ttl, ns.timestamps)])[0]
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def remote_info(ns: argparse.Namespace) -> Mapping[str, Json]:
    address, client = client_for(ns, ns.path)
    with client:
        return wire.info_json(client.info(address.key))


# ---- registration ------------------------------------------------------------------------


def register(sub: Subcommands) -> None:
    def add(name: str, handler: Handler, help_: str) -> Parser:
        return add_command(sub, name, handler, help_)

    def json_flag(p: Parser) -> None:
        p.add_argument("--json", action="store_true", help="machine-readable output (hex for binary)")

    p = add("create", cmd_create, "create a new feed (generates its Ed25519 key pair)")
    p.add_argument("path", help="a directory, or grpc://HOST:PORT to have a peer create (and own) it")
    p.add_argument(
        "--timestamps",
        default=DEFAULT_TIMESTAMPS,
        metavar="POLICY",
        help=f"off | exact | truncate:<unit> | fuzz:<max> (default {DEFAULT_TIMESTAMPS})",
    )
    p.add_argument("--ttl", metavar="DURATION", help="default time-to-live of entries, e.g. 7d")
    p.add_argument("--type", default="entry", choices=list(PROTOCOLS), help="content type (default entry)")
    p.add_argument(
        "--no-fsync", action="store_true", help="do not fsync appends (faster, loses the tail on power loss)"
    )
    tls_args(p, write=True)
    json_flag(p)

    p = add("put", cmd_put, "append one entry (key = value)")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY of a feed the peer owns")
    p.add_argument("key")
    p.add_argument("value", help="text; hex with --hex; a JSON stat for drive-event feeds")
    p.add_argument("--hex", action="store_true", help="VALUE is hex-encoded bytes")
    p.add_argument("--ttl", metavar="DURATION", help="time-to-live of this entry (default: the feed's)")
    p.add_argument("--timestamps", type=policy_arg, metavar="POLICY", help="override the feed's policy")
    tls_args(p, write=True)
    json_flag(p)

    p = add("del", cmd_del, "append a timestamped deletion of a key")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY of a feed the peer owns")
    p.add_argument("key")
    p.add_argument("--timestamps", type=policy_arg, metavar="POLICY", help="override the feed's policy")
    tls_args(p, write=True)
    json_flag(p)

    p = add("append", cmd_append, "bulk-append JSON lines, one signed batch per --batch lines")
    p.add_argument("path")
    p.add_argument(
        "--jsonl",
        required=True,
        metavar="FILE",
        help='file or - for stdin; lines like {"key": "k", "value": "v", "ttl": "1h"} '
        '(or "value_hex", "deleted": true, "stat": {...}, "timestamps": POLICY)',
    )
    p.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help=f"entries per signed batch (default {DEFAULT_BATCH})"
    )
    json_flag(p)

    p = add("get", cmd_get, "print the latest live value of a key")
    p.add_argument("path")
    p.add_argument("key")
    json_flag(p)

    p = add("history", cmd_history, "every entry ever written for a key")
    p.add_argument("path")
    p.add_argument("key")
    json_flag(p)

    p = add("cat", cmd_cat, "print entries: seq, writer timestamp (UTC), key, value")
    p.add_argument("path")
    p.add_argument("--from", dest="from_", type=int, default=1, metavar="N", help="first seq (default 1)")
    p.add_argument("--to", type=int, metavar="M", help="last seq, inclusive (default: the end)")
    p.add_argument("--raw", action="store_true", help="the block bytes as hex")
    json_flag(p)

    p = add("info", cmd_info, "key, length, signed tree hash, timestamp policy and range")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY")
    tls_args(p)
    json_flag(p)

    p = add("timestamp", cmd_timestamp, "the writer timestamp of one seq")
    p.add_argument("path")
    p.add_argument("seq", type=int)
    json_flag(p)

    p = add("verify", cmd_verify, "re-hash every block and check the signed root")
    p.add_argument("path")
    json_flag(p)

    p = add("compact", cmd_compact, "clear payloads of expired entries, keeping Merkle nodes")
    p.add_argument("path")
    p.add_argument("--overwritten", action="store_true", help="also clear entries superseded by a newer write")
    json_flag(p)

    p = add("demo", cmd_demo, "run the end-to-end demo on embedded defaults")
    p.add_argument("--dir", help="work directory (default: a new temporary one)")
