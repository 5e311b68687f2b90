"""Fuzz a real commit owner with mutated requests on every RPC of the CommitOwner service (issue 13 evidence).

Starts `feedlog owner serve` as its own process on 127.0.0.1 with two managed
tables under its `--root` (one backfilled at every commit, one holding
un-backfilled commits), stages a valid commit for each plus hostile staged
files (a FIFO, a link out of the root), builds a valid serialized request
for every RPC, and sends mutated copies through raw channel calls with
identity serializers: byte edits (bit flips, truncations, insertions,
duplicated or overwritten runs, a huge varint) and structure-aware edits (a
field anywhere set to an edge value: 0, 2^64-1, -1, empty, `..`, NUL, other
tables' paths and ids, a --root itself, 100 KB strings), each with the
table's token, another table's, a wrong one or none. It checks, and the exit
status says:

- no crash: the owner process is alive throughout and answers at the end;
- no INTERNAL or UNKNOWN status (each would be an unhandled error in the owner);
- no DEADLINE_EXCEEDED (every owner call is short; a stall is what item 5 was about), no
  RESOURCE_EXHAUSTED or UNAVAILABLE (an error message too big to send, as item 15 found);
- every table reads the same rows afterwards, through the owner and from its
  backfilled `_delta_log` alone (a mutated request may legitimately ratify the
  staged commitInfo-only commit, which adds a version but no rows).

    python tools/fuzz_owner.py                      # 10,000 requests, at most 10 minutes
    python tools/fuzz_owner.py -n 300 --seed 7      # what the test runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from feedlog.delta import DeltaTable
from feedlog.delta.managed import COMMITS_DIR, Auth, Binding, TableRef, staged_name
from feedlog.delta.managed.client import GrpcOwner
from feedlog.pb import owner_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["CommitOwner"]
#: INTERNAL/UNKNOWN: an unhandled error; DEADLINE_EXCEEDED: a stall (item 5); RESOURCE_EXHAUSTED or
#: UNAVAILABLE: an answer too big to send (item 15's echoed 100 KB id) or a worker pool run dry;
#: the fuzzer's few concurrent calls are far below the owner's limits, so none is legitimate here
BAD = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
}
TIMEOUT = 10.0
SCHEMA = pa.schema([("id", pa.int64())])
OUTSIDE = "FROM-OUTSIDE-THE-ROOT"  # the operation of a commit planted outside --root


@dataclass
class Report:
    requests: int = 0
    seconds: float = 0.0
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad: list[tuple[str, str, str, str]] = field(default_factory=list)  # rpc, code, details, request hex
    crashed: str | None = None
    tables_checked: int = 0
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.requests > 0 and not self.bad and self.crashed is None and not self.changed

    def summary(self) -> dict[str, Any]:
        by_code: Counter[str] = Counter()
        by_rpc: dict[str, dict[str, int]] = {}
        for (rpc, code), n in sorted(self.codes.items()):
            by_rpc.setdefault(rpc, {})[code] = n
            by_code[code] += n
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 1),
            "by_status": dict(by_code.most_common()),
            "by_rpc": by_rpc,
            "bad": [list(b[:3]) for b in self.bad[:20]],
            "crashed": self.crashed,
            "tables_checked": self.tables_checked,
            "changed": self.changed,
            "ok": self.ok,
        }


@dataclass
class Table:
    path: Path
    table_id: str
    token: str
    staged: str  # a valid staged commit (commitInfo only) for the next version
    version: int
    ict: int
    rows: list[int]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commit_info(ict: int, operation: str = "WRITE") -> bytes:
    line = {"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": operation}}
    return (json.dumps(line) + "\n").encode()


def _rows(path: Path, owner: str | None) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading without the owner warns that it reads the backfilled log
        t = DeltaTable.open(path, owner=owner) if owner else DeltaTable.open(path)
        return sorted(t.to_arrow().column("id").to_pylist())


def _setup(root: Path, endpoint: str) -> list[Table]:
    tables = []
    for name, batch_size, ids in (("a", 1, [[1, 2], [3]]), ("b", 100, [[10], [11, 12], [13]])):
        t = DeltaTable.create(root / name, SCHEMA, owner=Binding.feedlog(endpoint=endpoint, batch_size=batch_size))
        for chunk in ids:
            t.append(pa.table({"id": pa.array(chunk, pa.int64())}))
        s = t.snapshot()
        assert t.owner_token is not None and s.in_commit_timestamp is not None
        version, ict = s.version + 1, s.in_commit_timestamp + 1000
        staged = staged_name(version)
        t.storage.put_if_absent(f"{COMMITS_DIR}/{staged}", _commit_info(ict))
        tables.append(
            Table(root / name, s.metadata.id, t.owner_token, staged, version, ict, _rows(root / name, endpoint))
        )
    # hostile staged files next to the valid one (item 5): the owner must refuse them, quickly
    a = tables[0]
    commits = a.path / COMMITS_DIR
    os.mkfifo(commits / staged_name(a.version))
    secret = root.parent / "outside.json"
    secret.write_bytes(_commit_info(a.ict, OUTSIDE))
    os.symlink(secret, commits / staged_name(a.version))
    return tables


def _templates(tables: list[Table], root: Path) -> list[tuple[str, Message, Table]]:
    out: list[tuple[str, Message, Table]] = []
    for t in tables:
        ref = pb.TableRef(table_id=t.table_id, path=str(t.path))
        staged = pb.StagedCommit(table=ref, version=t.version, file=t.staged, in_commit_timestamp=t.ict)
        turned = pb.StagedCommit(table=ref, version=t.version, file=t.staged, in_commit_timestamp=t.ict, turn=b"t" * 16)
        fresh = pb.StagedCommit(
            table=pb.TableRef(table_id="new-" + t.table_id, path=str(root / "new")),
            version=0,
            file=staged_name(0),
            in_commit_timestamp=t.ict,
        )
        out += [
            ("Register", pb.RegisterRequest(commit=fresh, batch_size=1), t),
            ("Register", pb.RegisterRequest(commit=staged, batch_size=1), t),
            ("Commit", staged, t),
            ("Commit", turned, t),
            ("GetCommits", pb.GetCommitsRequest(table=ref, start_version=0), t),
            ("Backfill", pb.BackfillRequest(table=ref, version=-1), t),
            ("Release", staged, t),
            ("Status", pb.StatusRequest(table_id=t.table_id), t),
            ("EndTurn", pb.EndTurnRequest(table=ref, turn=b"t" * 16), t),
        ]
    return out


class Mutator:
    def __init__(self, rng: random.Random, tables: list[Table], root: Path) -> None:
        self.rng = rng
        a = tables[0]
        self.strings = [
            "",
            "/",
            ".",
            "..",
            "../../../etc/passwd",
            "/etc/passwd",
            str(root),
            str(root) + "/",
            str(root) + "/../",
            str(root / "a" / ".."),
            str(root / "nope"),
            "relative/path",
            "\x00",
            str(root / "a") + "\x00",
            "é" * 300,
            "x" * 100_000,
            "/" + "d/" * 3000,
            staged_name(0),
            staged_name(a.version),
            staged_name(a.version + 1),
            f"{a.version:020d}.json",
            "../" + a.staged,
            a.staged.upper(),
            COMMITS_DIR,
            *(t.table_id for t in tables),
            *(str(t.path) for t in tables),
            *(t.staged for t in tables),
            *(name for name in os.listdir(a.path / COMMITS_DIR) if not name.startswith(".")),
        ]

    def bytes_edit(self, data: bytes) -> bytes:
        rng, b = self.rng, bytearray(data)
        op = rng.randrange(7)
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            del b[rng.randrange(len(b)) :]
        elif op == 2:
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randrange(1, 16))
        elif op == 3 and b:
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randrange(1, 32))
            b[i:i] = b[i:j] * rng.randrange(1, 8)
        elif op == 4 and b:
            i = rng.randrange(len(b))
            b[i : i + rng.randrange(1, 8)] = b"\xff" * rng.randrange(1, 8)
        elif op == 5:  # a field with a huge or endless varint
            b += bytes([rng.randrange(1, 16) << 3]) + b"\xff" * rng.randrange(9, 12) + b"\x01"
        else:  # an unknown length-delimited field claiming more bytes than there are
            b += bytes([(rng.randrange(5, 30) << 3) | 2]) + b"\xff\xff\xff\x7f" + rng.randbytes(4)
        return bytes(b)

    def _leaves(self, m: Message) -> list[tuple[Message, Any]]:
        """Every scalar field, nested messages included (request messages have no repeated fields)."""
        out: list[tuple[Message, Any]] = []
        for f in m.DESCRIPTOR.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                out += self._leaves(getattr(m, f.name))
            else:
                out.append((m, f))
        return out

    def field_edit(self, m: Message) -> bytes:
        rng = self.rng
        for _ in range(rng.randrange(1, 4)):
            leaves = self._leaves(m)
            holder, f = rng.choice(leaves)
            if f.type == FieldDescriptor.TYPE_STRING:
                value: Any = rng.choice(self.strings)
            elif f.type == FieldDescriptor.TYPE_UINT64:
                value = rng.choice([0, 1, 2, 2**62, 2**63 - 1, 2**63, 2**64 - 1, rng.randrange(2**64)])
            elif f.type == FieldDescriptor.TYPE_INT64:
                value = rng.choice([-1, -2, 0, 1, -(2**63), 2**63 - 1, 2**62])
            elif f.type == FieldDescriptor.TYPE_UINT32:
                value = rng.choice([0, 1, 2**31, 2**32 - 1])
            elif f.type == FieldDescriptor.TYPE_BYTES:  # StagedCommit.turn
                value = rng.choice([b"", b"\x00", b"t" * 16, b"t" * 64, b"t" * 65, rng.randbytes(100_000)])
            else:
                continue
            setattr(holder, f.name, value)
        return bytes(m.SerializeToString())

    def request(self, template: Message) -> bytes:
        m = type(template)()
        m.CopyFrom(template)
        if self.rng.random() < 0.5:
            return self.field_edit(m)
        data = bytes(m.SerializeToString())
        for _ in range(self.rng.randrange(1, 4)):
            data = self.bytes_edit(data)
        return data

    def token(self, table: Table, tables: list[Table]) -> str | None:
        return self.rng.choice(
            [table.token, table.token, rng_other(self.rng, table, tables), None, "wrong", " ", "x" * 500]
        )


def rng_other(rng: random.Random, table: Table, tables: list[Table]) -> str:
    return rng.choice([t.token for t in tables if t is not table] or [table.token + "x"])


def _start_owner(workdir: Path, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    log = open(workdir / "owner.log", "wb")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "feedlog", "owner", "serve", "--db", str(workdir / "owner.db")),
            *("--listen", f"127.0.0.1:{port}", "--root", str(root)),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(address) as ch:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the owner exited with {proc.returncode}: {(workdir / 'owner.log').read_text()}")
            try:
                grpc.channel_ready_future(ch).result(timeout=1)
                break
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError("the owner did not start listening within 60 s") from None
    return proc, address


def run(
    n: int = 10_000, *, seed: int = 1, seconds: float = 600.0, workers: int = 8, keep: Path | None = None
) -> Report:
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="fuzz-owner-", dir=keep))
    root = workdir / "tables"
    root.mkdir()
    report = Report()
    proc, address = _start_owner(workdir, root)
    endpoint = f"grpc://{address}"
    try:
        tables = _setup(root, endpoint)
        templates = _templates(tables, root)
        mutator = Mutator(rng, tables, root)
        plan = []
        for i in range(n):
            rpc, template, table = templates[i % len(templates)] if i < len(templates) else rng.choice(templates)
            token = mutator.token(table, tables)
            md = (("authorization", f"Bearer {token}"),) if token is not None else ()
            plan.append((rpc, mutator.request(template), md))
        channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 8 << 20)])
        calls: dict[str, Callable[..., Any]] = {
            m.name: channel.unary_unary(f"/{SERVICE.full_name}/{m.name}") for m in SERVICE.methods
        }
        started = time.monotonic()
        stop_at = started + seconds

        def send(item: tuple[str, bytes, tuple[tuple[str, str], ...]]) -> tuple[str, str, str, bytes] | None:
            rpc, raw, md = item
            if time.monotonic() > stop_at:
                return None
            try:
                calls[rpc](raw, timeout=TIMEOUT, metadata=md)
                return rpc, "OK", "", raw
            except grpc.RpcError as e:
                return rpc, e.code().name, e.details() or "", raw

        with ThreadPoolExecutor(workers) as pool:
            for result in pool.map(send, plan):
                if result is None:
                    continue
                rpc, code, details, raw = result
                report.requests += 1
                report.codes[(rpc, code)] += 1
                if code in {c.name for c in BAD}:
                    report.bad.append((rpc, code, details[:300], raw[:200].hex()))
                if proc.poll() is not None and report.crashed is None:
                    report.crashed = f"the owner exited with {proc.returncode} after {report.requests} requests"
        report.seconds = time.monotonic() - started
        channel.close()
        if proc.poll() is not None:
            report.crashed = report.crashed or f"the owner exited with {proc.returncode}"
            return report
        owner = GrpcOwner(endpoint, timeout=TIMEOUT)
        try:
            for t in tables:
                status = owner.status(t.table_id, Auth(t.token))
                if status.state != "active" or status.path != str(t.path):
                    report.changed.append(f"{t.path}: owner state {status}")
                if _rows(t.path, endpoint) != t.rows:
                    report.changed.append(f"{t.path}: rows through the owner differ")
                owner.backfill(TableRef(t.table_id, str(t.path)), -1, Auth(t.token))
                if _rows(t.path, None) != t.rows:
                    report.changed.append(f"{t.path}: rows of the backfilled log differ")
                report.tables_checked += 1
        finally:
            owner.close()
        if proc.poll() is not None:
            report.crashed = f"the owner exited with {proc.returncode} during the final checks"
        for t in tables:
            for f in (t.path / "_delta_log").glob("*.json"):
                if OUTSIDE.encode() in f.read_bytes():
                    report.changed.append(f"{f}: a commit from outside the root was backfilled")
        return report
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10_000, help="mutated requests to send (default 10,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=600.0, help="stop sending after this long (default 600)")
    ap.add_argument("--workers", type=int, default=8, help="concurrent calls (default 8)")
    ns = ap.parse_args(argv)
    report = run(ns.n, seed=ns.seed, seconds=ns.seconds, workers=ns.workers)
    print(json.dumps(report.summary(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
