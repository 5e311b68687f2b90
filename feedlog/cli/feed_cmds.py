"""`feedlog create|put|del|forget|append|get|history|cat|info|timestamp|verify|compact`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO

from ..errors import Corruption, InvalidArgument, NotFound, PermissionDenied, printable
from ..log import forks
from ..log.core import MAX_BATCH_BYTES
from ..log.crypto import discovery_key
from ..log.entries import DRIVE_EVENT, PROTOCOLS, decode_header
from ..log.feed import DEFAULT_TIMESTAMPS, Feed, Write
from ..log.retention import forgetting
from ..log.timestamps import TimestampPolicy, parse_duration
from ..replication import wire
from ..replication.verify import signed_state
from .args import Handler, Parser, Subcommands, add_command, seq_number
from .fmt import (
    Json,
    Progress,
    appended_json,
    emit,
    error_line,
    fmt_ts,
    interrupted_line,
    json_line,
    plural,
    progress_flag,
    progress_wanted,
    record_json,
    record_line,
    writes_to_file,
)
from .remote import client_for, is_remote, signed_type, tls_args

DEFAULT_BATCH = 1000


@contextmanager
def opened(path: str, writable: bool = False) -> Iterator[Feed]:
    feed = Feed.open(path, writable=writable)
    try:
        yield feed
    finally:
        feed.close()


@contextmanager
def appending(path: str) -> Iterator[Feed]:
    """A local feed opened to append to; refused (Fork, exit 5) while it keeps a fork proof (issue 40):
    its key signed two histories, and a third continuation would only deepen the split."""
    held = forks.load(path)
    if held is not None:
        raise forks.fork_error(held, path, os.path.join(path, forks.FORK_FILE))
    with opened(path, writable=True) as feed:
        yield feed


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
    with appending(ns.path) as feed:
        a = feed.put(
            ns.key,
            parse_value(feed.content_type, ns.value, ns.hex),
            ttl=ns.ttl,
            timestamps=ns.timestamps,
            exact_expiry=ns.exact_expiry,
        )
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def cmd_del(ns: argparse.Namespace) -> None:
    if is_remote(ns.path):
        return remote_put(ns, deleted=True)
    with appending(ns.path) as feed:
        a = feed.delete(ns.key, timestamps=ns.timestamps)
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def cmd_forget(ns: argparse.Namespace) -> None:
    if is_remote(ns.path):
        return remote_put(ns, deleted=True, forget=True)
    with appending(ns.path) as feed:
        a = feed.forget(ns.key, timestamps=ns.timestamps)
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def parse_jsonl_line(feed: Feed, line: str, lineno: int) -> Write:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise InvalidArgument(f"line {lineno}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("key"), str):
        raise InvalidArgument(f'line {lineno}: expected an object with a string "key"')
    known = {"key", "value", "value_hex", "stat", "deleted", "forget", "ttl", "timestamps"}
    extra = set(obj) - known
    if extra:
        fields = "field" if len(extra) == 1 else "fields"
        raise InvalidArgument(f"line {lineno}: unknown {fields} {', '.join(sorted(extra))}")
    try:
        forget = obj.get("forget", False) is True
        if forget and set(obj) - {"key", "forget", "deleted", "timestamps"}:
            raise InvalidArgument('a "forget" line takes only "key" (and "timestamps")')
        deleted = bool(obj.get("deleted", False)) or forget
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
    return Write(obj["key"], value, deleted, ttl, policy, forget=forget)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Let a SIGINT that arrives inside the block take effect only when it ends (then KeyboardInterrupt).

    Around one signed batch's append: it lands whole or not at all, so an
    interrupted `append` can say exactly which input lines are in the feed.
    Outside the main thread (where Python delivers signals) there is nothing to defer.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def open_jsonl(name: str) -> tuple[IO[bytes], int | None]:
    """The input of `append --jsonl` as bytes, and its size if known (a regular file): for progress."""
    if name == "-":
        src = sys.stdin.buffer
    else:
        try:
            src = open(name, "rb")  # noqa: SIM115 -- closed by the caller
        except FileNotFoundError:
            raise NotFound(f"--jsonl {name}: no such file") from None
        except IsADirectoryError:
            raise InvalidArgument(f"--jsonl {name}: is a directory, not a file of JSON lines") from None
        except PermissionError:
            raise PermissionDenied(f"--jsonl {name}: permission denied") from None
    try:
        st = os.fstat(src.fileno())
        size = st.st_size - src.tell() if stat.S_ISREG(st.st_mode) else None
    except (OSError, ValueError):
        size = None
    return src, size


def resume_hint(ns: argparse.Namespace, lines: int) -> str:
    """The command that continues an interrupted append after its first `lines` input lines."""
    args = ["feedlog", "append", ns.path, "--jsonl", ns.jsonl, "--skip", str(lines)]
    if ns.batch != DEFAULT_BATCH:
        args += ["--batch", str(ns.batch)]
    return shlex.join(args) + (" (with the same input on stdin)" if ns.jsonl == "-" else "")


def cmd_append(ns: argparse.Namespace) -> int:
    if ns.batch < 1:
        raise InvalidArgument("--batch must be at least 1")
    if ns.skip < 0:
        raise InvalidArgument("--skip must be 0 or more")
    src, size = open_jsonl(ns.jsonl)
    seqs: list[int] = []  # first and last seq appended
    done = 0  # entries appended (whole signed batches)
    lines_in = ns.skip  # input lines (blank ones too) whose entries are all in the feed
    read = 0  # bytes of input read, for progress
    length = 0
    try:
        with (
            appending(ns.path) as feed,
            Progress("append", total=size, unit="bytes", enabled=progress_wanted(ns)) as progress,
        ):
            length = feed.length
            batch: list[Write] = []
            weight = 0
            last_line = lineno = ns.skip  # the input line of the batch's last entry; the line read

            def flush() -> None:
                nonlocal batch, done, weight, lines_in, length
                with sigint_deferred():  # the batch lands whole or not at all: the counts below are exact
                    out = feed.append(batch)
                    done += len(batch)
                    lines_in, length = last_line, feed.length
                    seqs[:] = [seqs[0] if seqs else out[0].seq, out[-1].seq]
                batch, weight = [], 0
                progress.update(read, plural(done, "entry", "entries"))

            try:
                for lineno, raw in enumerate(src, 1):
                    read += len(raw)
                    if lineno <= ns.skip:
                        continue
                    if lineno == ns.skip + 1 and ns.skip:
                        progress.rebase(read - len(raw))
                    line = decode_line(raw, lineno, done)
                    if not line.strip():
                        continue
                    try:
                        write = parse_jsonl_line(feed, line, lineno)
                    except InvalidArgument as e:
                        raise InvalidArgument(
                            f"{e} ({plural(done, 'entry', 'entries')} before it were appended)"
                        ) from None
                    if (
                        batch and weight + write.weight() > MAX_BATCH_BYTES
                    ):  # large values: a batch no reader could take
                        flush()
                    batch.append(write)
                    weight += write.weight()
                    last_line = lineno
                    if len(batch) >= ns.batch:
                        flush()
                if batch:
                    flush()
            except KeyboardInterrupt:
                progress.close()
                if done:
                    how = "durably appended" if feed.core.fsync else "appended (not fsynced: a --no-fsync feed)"
                    landed = f"{plural(done, 'entry', 'entries')} {how} (seq {seqs[0]}..{seqs[1]})"
                    if lines_in:
                        landed += f", input lines 1..{lines_in:,} are in the feed"
                else:
                    landed = "no entries appended"
                print(interrupted_line(f"{landed}; to resume: {resume_hint(ns, lines_in)}"), file=sys.stderr)
                return 130
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    first, last = seqs if seqs else (None, None)
    emit(
        ns,
        {"appended": done, "first_seq": first, "last_seq": last, "length": length},
        f"appended {plural(done, 'entry', 'entries')} (seq {first}..{last}), length {length}"
        if done
        else "nothing appended",
    )
    return 0


def decode_line(raw: bytes, lineno: int, done: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"line {lineno}: not UTF-8 ({e.reason} at byte {e.start}) "
            f"({plural(done, 'entry', 'entries')} before it were appended)"
        ) from None


def cmd_get(ns: argparse.Namespace) -> int:
    with opened(ns.path) as feed:
        r = feed.get(ns.key)
        now = feed.clock.now_ms()
        forgotten = feed.forgotten(ns.key) if r is None else None
    if r is None:
        emit(ns, None, None)
        if not ns.json:
            why = "never written, deleted or expired"
            if forgotten is not None:
                why = f"forgotten at seq {forgotten}: the payloads of its earlier entries were cleared"
            print(error_line(f"{ns.key!r} not found ({why})"), file=sys.stderr)
        return 3
    if ns.json:
        emit(ns, record_json(r, now))
    elif r.stat is not None:
        print(json_line(r.stat))
    else:
        # the value's bytes as they are, then a newline as every line of text ends (`$(feedlog get ...)`
        # drops it); --raw: the bytes alone, for binary values and byte-exact copies
        out = sys.stdout.buffer
        out.write(r.value or b"")
        if not ns.raw:
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


def header_json(seq: int, block: bytes | None) -> dict[str, Json]:
    """Block 0, the feed header: a hyperdb `Header` protobuf naming the feed's content type."""
    out: dict[str, Json] = {"seq": seq, "header": True}
    if block is None:
        out["cleared"] = True
        return out
    try:
        out["type"] = decode_header(block)
    except Corruption as e:
        out["invalid"] = str(e)
    out["block"] = block.hex()
    return out


def header_line(block: bytes | None) -> str:
    h = header_json(0, block)
    if block is None:
        return "0\t(header, cleared)"
    what = f"type {h['type']}" if "type" in h else f"invalid: {h['invalid']}"
    return f"0\t(header: {what})\t0x{block.hex()}"


def cmd_cat(ns: argparse.Namespace) -> None:
    if ns.to is not None and ns.to < ns.from_:
        raise InvalidArgument(f"--from {ns.from_} --to {ns.to}: the range is empty (--to is at least --from)")
    with opened(ns.path) as feed:
        now = feed.clock.now_ms()
        end = feed.length if ns.to is None else min(ns.to + 1, feed.length)
        if ns.from_ > feed.length:  # == length: nothing yet, as a reader polling for new entries expects
            raise NotFound(f"--from {ns.from_} is past the end: the feed has seqs 0..{feed.length - 1}")
        long_output = writes_to_file(sys.stdout) and progress_wanted(ns)
        with Progress("cat", total=max(end - ns.from_, 0), unit="entries", enabled=long_output) as progress:
            if ns.from_ == 0 and end > 0:
                header = feed.core.get(0)
                if ns.json:
                    print(json_line(header_json(0, header)))
                elif ns.raw:
                    print("0\t" + ("(cleared)" if header is None else header.hex()))
                else:
                    print(header_line(header))
            for n, r in enumerate(feed.records(max(ns.from_, 1), end), 1):
                if ns.json:
                    print(json_line(record_json(r, now, raw=ns.raw)))
                elif ns.raw:
                    print(f"{r.seq}\t" + ("(cleared)" if r.block is None else r.block.hex()))
                else:
                    print(record_line(r, now))
                if n % 4096 == 0:
                    progress.update(n)


def cmd_info(ns: argparse.Namespace) -> None:
    info: Mapping[str, Json]
    if is_remote(ns.path):
        info = remote_info(ns)
    else:
        with opened(ns.path) as feed:
            info = {**feed.info(), "forgetting": forgetting(None, peer=False)}
            held = forks.load(feed.core.path)  # issue 40: a fork proof kept beside the feed is named
            if held is not None:
                info = {**info, "fork_proof": f"{held.describe()} (fork point {held.fork_point})"}

    def human() -> None:
        for k, v in info.items():
            if k.endswith("timestamp") and isinstance(v, int):
                v = f"{v} ({fmt_ts(v)})"
            print(f"{k:<16}{'-' if v is None else printable(str(v))}")  # a peer's strings stay one line each

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


def cmd_verify(ns: argparse.Namespace) -> int:
    with opened(ns.path) as feed:
        key = feed.key.hex()
        checked = 0
        with Progress("verify", total=feed.length, unit="blocks", enabled=progress_wanted(ns)) as progress:

            def on_progress(n: int) -> None:
                nonlocal checked
                checked = n
                progress.update(n)

            try:
                rep = feed.verify(on_progress=on_progress)
            except KeyboardInterrupt:
                progress.close()
                print(
                    interrupted_line(
                        f"blocks 0..{checked - 1:,} of {feed.length:,} re-hashed and match the stored tree "
                        "(the signed root is checked at the end: not yet)"
                        if checked
                        else "nothing verified yet"
                    ),
                    file=sys.stderr,
                )
                return 130
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
        f"ok: {plural(rep.length, 'block')} ({plural(rep.byte_length, 'byte')}, {rep.cleared:,} cleared) "
        "verify against the signed root",
    )
    return 0


def cmd_compact(ns: argparse.Namespace) -> None:
    with opened(ns.path, writable=True) as feed:
        rep = feed.compact(overwritten=ns.overwritten)
    emit(
        ns,
        {"cleared": rep.cleared, "bytes_cleared": rep.bytes_cleared},
        f"cleared {plural(rep.cleared, 'block')} ({plural(rep.bytes_cleared, 'byte')}); Merkle nodes kept",
    )


def cmd_demo(ns: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(ns.dir, keep=ns.keep)


# ---- the remote forms (grpc://HOST:PORT[/KEY]): the same commands on a feed a peer holds --------------


def remote_create(ns: argparse.Namespace) -> None:
    _address, client = client_for(ns, ns.path, need_feed=False, write=True)
    with client:
        info = wire.info_json(client.create(ns.type, str(ns.timestamps), ns.ttl or ""))
    emit(ns, info, f"created on {ns.path}\nkey {info['key']}")


def remote_put(ns: argparse.Namespace, deleted: bool, forget: bool = False) -> None:
    address, client = client_for(ns, ns.path, write=True)
    with client:
        key = address.key
        value = None if deleted else parse_value(client.info(key).content_type, ns.value, ns.hex)
        ttl = parse_duration(ns.ttl) if getattr(ns, "ttl", None) else None
        a = client.put(
            key,
            [Write(ns.key, value, deleted, ttl, ns.timestamps, getattr(ns, "exact_expiry", False), forget=forget)],
        )[0]
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def remote_info(ns: argparse.Namespace) -> Mapping[str, Json]:
    address, client = client_for(ns, ns.path)
    with client:
        info = client.info(address.key)
        # shown only once checked: the feed asked for, a state the key holder signed, the type its
        # signed header says (the writer's settings the peer reports stay its word: shown, escaped)
        if info.key != address.key or info.discovery_key != discovery_key(address.key):
            raise Corruption(f"{address.target}: answered for another feed than {address.key.hex()}")
        if info.state.length:
            signed_state(address.key, info.state, address.target)
            info.content_type = signed_type(client, address.key, address.target)
    return wire.info_json(info)


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
        type=policy_arg,
        default=DEFAULT_TIMESTAMPS,
        metavar="POLICY",
        help=f"off | exact | truncate:<n><unit> | fuzz:<n><unit>, unit s, m, h or d (default {DEFAULT_TIMESTAMPS})",
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
    p.add_argument(
        "--exact-expiry",
        action="store_true",
        help="expire at exactly write time + TTL (reveals the write time to the ms, whatever the policy)",
    )
    p.add_argument("--timestamps", type=policy_arg, metavar="POLICY", help="override the feed's policy")
    tls_args(p, write=True)
    json_flag(p)

    p = add("del", cmd_del, "append a timestamped deletion of a key")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY of a feed the peer owns")
    p.add_argument("key")
    p.add_argument("--timestamps", type=policy_arg, metavar="POLICY", help="override the feed's policy")
    tls_args(p, write=True)
    json_flag(p)

    p = add("forget", cmd_forget, "withdraw a key: every copy clears the payloads of its earlier entries")
    p.description = (
        "Withdraw KEY: append one signed forget entry (a deletion to hyperdb readers) that tells every "
        "copy of the feed to clear the payloads of all earlier entries of KEY. This feed clears them at "
        "once, a peer or follower before it serves the forget entry, `feedlog ingest` in the table "
        "(rows become tombstones). Merkle nodes stay, so the feed and audits still verify. Needs the "
        "feed's secret key (here, or on the peer that owns it): exit 7 where it is not, nothing changed."
    )
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
        '(or "value_hex", "deleted": true, "forget": true, "stat": {...}, "timestamps": POLICY)',
    )
    p.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help=f"entries per signed batch (default {DEFAULT_BATCH})"
    )
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="skip the first N input lines: resumes an interrupted append (it prints the command with N)",
    )
    progress_flag(p)
    json_flag(p)

    p = add("get", cmd_get, "print the latest live value of a key (and a newline)")
    p.add_argument("path")
    p.add_argument("key")
    p.add_argument("--raw", action="store_true", help="the value's bytes alone, without the newline")
    json_flag(p)

    p = add("history", cmd_history, "every entry ever written for a key")
    p.add_argument("path")
    p.add_argument("key")
    json_flag(p)

    p = add_command(
        sub,
        "cat",
        cmd_cat,
        "print entries: seq, writer timestamp (UTC), key, value",
    )
    p.description = (
        "Print entries: seq, writer timestamp (UTC), key, value. Block 0 is the feed header, shown with "
        "--from 0: a hyperdb Header protobuf naming the content type, printed as `0<TAB>(header: type "
        'entry)<TAB>0x<HEX>`, with --json {"seq":0,"header":true,"type":"entry","block":"HEX"}. '
        "`cat --from 0 --raw` prints SEQ<TAB>HEX of every signed block, header included, so the signed "
        "tree (`info`: tree_hash, signature) can be re-derived from the CLI alone; a cleared block prints (cleared)."
    )
    p.add_argument("path")
    p.add_argument(
        "--from", dest="from_", type=seq_number, default=1, metavar="N", help="first seq (default 1; 0: the header too)"
    )
    p.add_argument("--to", type=seq_number, metavar="M", help="last seq, inclusive (default: the end)")
    p.add_argument("--raw", action="store_true", help="the block bytes as hex")
    progress_flag(p)
    json_flag(p)

    p = add("info", cmd_info, "key, length, signed tree hash, timestamp policy and range")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY")
    tls_args(p)
    json_flag(p)

    p = add("timestamp", cmd_timestamp, "the writer timestamp of one seq")
    p.add_argument("path")
    p.add_argument("seq", type=seq_number)
    json_flag(p)

    p = add("verify", cmd_verify, "re-hash every block and check the signed root")
    p.add_argument("path")
    progress_flag(p)
    json_flag(p)

    p = add("compact", cmd_compact, "clear payloads of expired entries, keeping Merkle nodes")
    p.add_argument("path")
    p.add_argument("--overwritten", action="store_true", help="also clear entries superseded by a newer write")
    json_flag(p)

    p = add("demo", cmd_demo, "run the end-to-end demo on embedded defaults")
    p.add_argument("--dir", help="work directory, kept afterwards (default: a new temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (feeds, table, activity.png)")
