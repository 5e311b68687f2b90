"""Fuzz a real peer with mutated requests on every RPC of the Feeds service (issue 13 evidence).

Starts `feedlog serve` as its own process on 127.0.0.1 over a data directory
holding a few feeds (one the peer can sign for, one replica, one of drive
events), builds a valid serialized request for every RPC, and sends mutated
copies (bit flips, truncations, insertions, duplicated or overwritten runs,
huge varints) and structure-aware ones (a field anywhere set to an edge
value: 0, 2^64-1, empty or wrong-sized keys, 100 KB strings, repeated fields
grown or emptied) through raw channel calls with identity serializers, half of
them with the peer's write token. It checks, and the exit status says:

- no crash: the peer process is alive throughout and answers GetInfo at the end;
- no INTERNAL or UNKNOWN status (each would be an unhandled server error);
- every feed in the data directory verifies afterwards (signatures, tree, blocks).

Every other status is a legitimate answer to garbage (INVALID_ARGUMENT,
UNAUTHENTICATED, RESOURCE_EXHAUSTED from a rate limit, DEADLINE_EXCEEDED for a
tail that waits for data, ...); the counts per RPC and status are printed.

    python tools/fuzz_peer.py                     # 10,000 requests, at most 10 minutes
    python tools/fuzz_peer.py -n 300 --seed 7     # what the test runs
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
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from feedlog.errors import FeedlogError
from feedlog.log import entries, merkle
from feedlog.log.crypto import KeyPair, Signer, tree_signable
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.client import FeedClient

SERVICE = pb.DESCRIPTOR.services_by_name["Feeds"]
TOKEN = "fuzz-peer-write-token-0123456789abcdef"
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
#: per-call deadlines: a tail that asks beyond the feed's end waits for data, so it gets little time
TIMEOUT = {"Subscribe": 0.2, "Read": 5.0}
DEFAULT_TIMEOUT = 5.0
MAX_STREAM_MESSAGES = 4  # a stream is cancelled after this many responses (the peer must cope)


@dataclass
class Report:
    requests: int = 0
    seconds: float = 0.0
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad: list[tuple[str, str, str, str]] = field(default_factory=list)  # rpc, code, details, request hex
    crashed: str | None = None
    unverified: list[str] = field(default_factory=list)
    feeds_verified: int = 0
    peer_rss_kb: tuple[int, int] = (0, 0)  # idle, peak

    @property
    def ok(self) -> bool:
        return not self.bad and self.crashed is None and not self.unverified and self.requests > 0

    def summary(self) -> dict[str, object]:
        by_rpc: dict[str, dict[str, int]] = {}
        for (rpc, code), n in sorted(self.codes.items()):
            by_rpc.setdefault(rpc, {})[code] = n
        totals: Counter[str] = Counter()
        for (_rpc, code), n in self.codes.items():
            totals[code] += n
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 1),
            "by_status": dict(totals.most_common()),
            "by_rpc": by_rpc,
            "internal_or_unknown": len(self.bad),
            "bad_samples": self.bad[:5],
            "crashed": self.crashed,
            "feeds_verified": self.feeds_verified,
            "feeds_failing_verify": self.unverified,
            "peer_rss_kb": {"idle": self.peer_rss_kb[0], "peak": self.peer_rss_kb[1]},
            "ok": self.ok,
        }


# ---- the feeds and the valid requests mutations start from ----------------------------------------


def make_feeds(data: Path, authors: Path) -> tuple[Feed, KeyPair, Feed, bytes]:
    """DATA/signed (the peer holds its secret key), DATA/replica (no key; its author kept outside), DATA/drive."""
    signed = Feed.create(data / "signed", key_pair=KeyPair.generate(), timestamps="exact")
    signed.append([Write(f"/k{i}", f"value {i}".encode()) for i in range(20)])
    signed.close()
    drive = Feed.create(data / "drive", key_pair=KeyPair.generate(), content_type="drive-event", timestamps="off")
    drive.append([Write("/file", {"mode": 0o644, "size": 3}), Write("/gone", None, deleted=True)])
    drive.close()
    kp = KeyPair.generate()
    author = Feed.create(authors / "author", key_pair=kp, timestamps="off")
    for lo in range(0, 30, 10):
        author.append([Write(f"/a{i}", b"x" * (i % 7)) for i in range(lo, lo + 10)])
    with Feed.create_replica(data / "replica", author.key) as replica:
        for seg in author.core.segments(0, author.length, 1 << 20):
            assert seg.state is not None
            replica.store_signed([b for b in seg.blocks if b is not None], seg.state)
    with Feed.open(data / "signed", writable=False) as f:
        signed_key = f.key
    return author, kp, Feed.open(data / "drive", writable=False), signed_key


def next_append(author: Feed, kp: KeyPair) -> pb.AppendRequest:
    """A genuine signed append that continues the replica (the author's next batch, stored nowhere)."""
    blocks = [
        entries.encode_entry("entry", f"/new{i}", b"fresh", deleted=False, timestamp=None, expires_at=None)
        for i in range(3)
    ]
    start = author.length
    _created, roots = merkle.append_leaves(author.core.roots(), start, blocks)
    assert kp.seed is not None
    sig = Signer(kp.seed).sign(tree_signable(merkle.roots_hash(roots), start + len(blocks), 0))
    return pb.AppendRequest(key=author.key, expected_length=start, blocks=blocks, signature=sig, fork=0)


def seeds(author: Feed, kp: KeyPair, drive: Feed, signed_key: bytes) -> dict[str, list[bytes]]:
    """Valid serialized requests for every RPC of the service."""
    rk, dk = author.key, drive.key
    append = next_append(author, kp).SerializeToString()
    first_state = next(g.state for g in author.core.segments(0, author.length, 1 << 20) if g.state is not None)
    out: dict[str, list[Message]] = {
        "GetInfo": [
            pb.GetInfoRequest(feed=pb.FeedId(key=rk)),
            pb.GetInfoRequest(feed=pb.FeedId(discovery_key=drive.discovery_key)),
            pb.GetInfoRequest(feed=pb.FeedId(key=rk), consistency_from=11),  # issue 40: with a consistency proof
        ],
        # issue 40: a signed state of the replica (an older one: the answer carries a consistency proof)
        "Gossip": [
            pb.GossipRequest(feeds=[pb.GossipState(key=rk, state=wire.state_pb(first_state))]),
            pb.GossipRequest(feeds=[pb.GossipState(key=rk, state=wire.state_pb(author.core.state))]),
        ],
        "Create": [pb.CreateRequest(content_type="entry", timestamps="exact", ttl="7d"), pb.CreateRequest()],
        "Put": [
            pb.PutRequest(feed=signed_key, entries=[pb.Put(key="/p", value=b"v", ttl_ms=60_000)]),
            pb.PutRequest(feed=signed_key, entries=[pb.Put(key="/q", deleted=True, timestamps="truncate:1s")]),
        ],
        "Read": [
            pb.ReadRequest(feed=pb.FeedId(key=rk), start=0, end=0, with_roots=True, max_message_bytes=4096),
            pb.ReadRequest(feed=pb.FeedId(key=dk), start=1, end=3),
        ],
        "Subscribe": [pb.SubscribeRequest(feed=pb.FeedId(key=rk), start=5, with_roots=True, max_message_bytes=512)],
        "Proof": [pb.ProofRequest(feed=pb.FeedId(key=rk), seq=7), pb.ProofRequest(feed=pb.FeedId(key=dk), seq=1)],
    }
    raw = {name: [m.SerializeToString() for m in ms] for name, ms in out.items()}
    raw["Append"] = [append]
    raw["AppendStream"] = [append]
    raw["PutStream"] = raw["Put"]
    missing = {m.name for m in SERVICE.methods} - set(raw)
    assert not missing, f"no seed request for {missing}"
    return raw


INTS = [0, 1, 2, 7, 255, 4096, 2**31 - 1, 2**32 - 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1]
STRINGS = [
    "",
    "/",
    "\x00",
    "../../etc/passwd",
    "é" * 500,
    "a" * 100_000,
    "exact",
    "truncate:0s",
    "fuzz:-1",
    "off",
    "7d",
    "0s",
    "99999999999999999d",
    "drive-event",
    "entry",
    "\ud7ff\ufffd",
    "sha256:" + "0" * 64,
]


def mutate_fields(rng: random.Random, msg: Message) -> None:
    """A structure-aware edit: one field anywhere in `msg` set to an edge value (the message stays parseable)."""
    spots: list[tuple[Message, Any]] = []  # (message, field descriptor): upb's descriptors are untyped

    def walk(m: Message, depth: int) -> None:
        for f in m.DESCRIPTOR.fields:
            spots.append((m, f))
            if f.type != FieldDescriptor.TYPE_MESSAGE or depth > 3 or _is_map(f):
                continue
            if f.is_repeated:
                for sub in getattr(m, f.name):
                    walk(sub, depth + 1)
            elif m.HasField(f.name) or rng.random() < 0.3:
                walk(getattr(m, f.name), depth + 1)

    walk(msg, 0)
    m, f = rng.choice(spots)
    repeated = f.is_repeated
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        if _is_map(f):
            getattr(m, f.name)[rng.choice(STRINGS[:12])] = rng.choice(INTS)
        elif repeated:
            items = getattr(m, f.name)
            if items and rng.random() < 0.5:
                del items[rng.randrange(len(items))]
            else:
                items.add()
        elif rng.random() < 0.5:
            m.ClearField(f.name)
        else:
            getattr(m, f.name).SetInParent()
        return
    value = _edge_value(rng, f, getattr(m, f.name) if not repeated else None)
    if repeated:
        items = getattr(m, f.name)
        if items and rng.random() < 0.3:
            del items[rng.randrange(len(items))]
        else:
            items.extend([value] * rng.choice([1, 1, 2, 100]))
    else:
        setattr(m, f.name, value)


def _is_map(f: Any) -> bool:
    return f.message_type is not None and bool(f.message_type.GetOptions().map_entry)


def _edge_value(rng: random.Random, f: Any, old: object) -> object:
    if f.type == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if f.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(STRINGS)
    if f.type == FieldDescriptor.TYPE_BYTES:
        old_b = old if isinstance(old, bytes) else b""
        return rng.choice(
            [b"", rng.randbytes(rng.randint(1, 64)), bytes(32), old_b[:-1], old_b + b"\x00", rng.randbytes(32)]
        )
    bits = 32 if f.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32) else 64
    v = rng.choice(INTS) if rng.random() < 0.8 else rng.getrandbits(bits)
    if f.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64):
        return (v % 2 ** (bits - 1)) * rng.choice([1, -1])
    return v % 2**bits


def mutate(rng: random.Random, data: bytes, kind: type[Message] | None = None) -> bytes:
    """A structure-aware edit (half the time, when the request's type is known), else one to three byte edits."""
    if kind is not None and rng.random() < 0.5:
        msg = kind.FromString(data)
        for _ in range(rng.randint(1, 3)):
            mutate_fields(rng, msg)
        return msg.SerializeToString()
    return mutate_bytes(rng, data)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One to three random edits of a serialized request."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip bits
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate
            del b[pos:]
        elif op == 2:  # insert random bytes
            b[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and b:  # overwrite a byte with an interesting value
            b[rng.randrange(len(b))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF])
        elif op == 4:  # a huge varint where a field might be
            b[pos:pos] = bytes([rng.choice([0x08, 0x10, 0x18, 0x20, 0x28])]) + b"\xff" * 9 + b"\x01"
        elif op == 5 and b:  # duplicate a run (repeated fields, length prefixes that now lie)
            lo = rng.randrange(len(b))
            hi = min(len(b), lo + rng.randint(1, 32))
            b[hi:hi] = b[lo:hi]
        elif op == 6 and b:  # delete a run
            lo = rng.randrange(len(b))
            del b[lo : lo + rng.randint(1, 8)]
    return bytes(b)


# ---- the peer process ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int, what: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(what + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Peer:
    proc: subprocess.Popen[str]
    address: str
    log: Path

    @classmethod
    def start(cls, data: Path, work: Path) -> Peer:
        port = free_port()
        token_file = work / "token"
        token_file.write_text(TOKEN + "\n")
        log = work / "peer.log"
        cmd = [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", f"127.0.0.1:{port}"]
        cmd += ["--write-token-file", str(token_file)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
        peer = cls(proc, f"127.0.0.1:{port}", log)
        deadline = time.monotonic() + 30
        with FeedClient(peer.address, timeout=2) as c:
            while True:
                try:
                    c.channel.unary_unary(f"/{SERVICE.full_name}/GetInfo")(b"", timeout=1)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        break  # it answers (INVALID_ARGUMENT for an empty request)
                except FeedlogError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    peer.stop()
                    raise RuntimeError(f"the peer did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        return peer

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


# ---- the run --------------------------------------------------------------------------------------------


def call(channel: grpc.Channel, rpc: str, request: bytes, token: bool) -> tuple[str, str]:
    """Send one raw request; (status name, details)."""
    m = SERVICE.methods_by_name[rpc]
    path = f"/{SERVICE.full_name}/{rpc}"
    md = (("authorization", f"Bearer {TOKEN}"),) if token else None
    timeout = TIMEOUT.get(rpc, DEFAULT_TIMEOUT)
    try:  # no serializers: the bytes go on the wire as they are
        if m.client_streaming:
            call_ = channel.stream_stream(path)(iter([request, request]), timeout=timeout, metadata=md)
            _drain(call_)
        elif m.server_streaming:
            _drain(channel.unary_stream(path)(request, timeout=timeout, metadata=md))
        else:
            channel.unary_unary(path)(request, timeout=timeout, metadata=md)
        return "OK", ""
    except grpc.RpcError as e:
        code = e.code()
        return (code.name if code is not None else "NONE"), (e.details() or "")


def _drain(it: Iterator[bytes]) -> None:
    for n, _ in enumerate(it, 1):
        if n >= MAX_STREAM_MESSAGES:
            it.cancel()  # type: ignore[attr-defined]
            return


def run(n: int, *, seed: int = 1, seconds: float = 600.0, workers: int = 4, keep: Path | None = None) -> Report:
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="fuzz-peer-")) if keep is None else keep
    data, authors = work / "data", work / "authors"
    author, kp, drive, signed_key = make_feeds(data, authors)
    corpus = seeds(author, kp, drive, signed_key)
    drive.close()
    author.close()
    names = sorted(corpus)
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        rpc = names[i % len(names)]
        base = rng.choice(corpus[rpc])
        kind = getattr(pb, SERVICE.methods_by_name[rpc].input_type.name)
        jobs.append((rpc, base if rng.random() < 0.03 else mutate(rng, base, kind), rng.random() < 0.5))
    lock = threading.Lock()
    peer = Peer.start(data, work)  # stopped in the finally below
    idle = rss_kb(peer.proc.pid)
    peak = [idle]
    t0 = time.monotonic()
    deadline = t0 + seconds
    channel = grpc.insecure_channel(
        peer.address, options=[("grpc.max_receive_message_length", 32 << 20), ("grpc.enable_retries", 0)]
    )

    def one(job: tuple[str, bytes, bool]) -> None:
        if time.monotonic() > deadline or report.crashed is not None:
            return
        rpc, raw, token = job
        code, details = call(channel, rpc, raw, token)
        with lock:
            report.requests += 1
            report.codes[(rpc, code)] += 1
            if code in {c.name for c in BAD}:
                report.bad.append((rpc, code, details[:300], raw.hex()))
            if report.requests % 200 == 0:
                peak[0] = max(peak[0], rss_kb(peer.proc.pid, "VmHWM"))
                if not peer.alive():
                    report.crashed = f"the peer exited with {peer.proc.returncode} after {report.requests} requests"

    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, jobs))
        report.seconds = time.monotonic() - t0
        peak[0] = max(peak[0], rss_kb(peer.proc.pid, "VmHWM"))
        report.peer_rss_kb = (idle, peak[0])
        if not peer.alive():
            report.crashed = f"the peer exited with {peer.proc.returncode}"
        else:  # still answering
            for key in (author.key, drive.key, signed_key):
                with FeedClient(peer.address, timeout=10) as c:
                    c.info(key)
    except FeedlogError as e:
        report.crashed = f"the peer stopped answering: {e}"
    finally:
        channel.close()
        code = peer.stop()
        if report.crashed is None and code not in (0, -15):
            report.crashed = f"the peer exited with {code} on SIGTERM: {peer.log.read_text()[-1000:]}"
    for d in sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        try:
            with Feed.open(d, writable=False) as f:
                f.verify()
            report.feeds_verified += 1
        except FeedlogError as e:
            report.unverified.append(f"{d.name}: {e}")
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10_000, help="mutated requests to send (default 10,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=600, help="stop sending after this long (default 600)")
    ap.add_argument("--workers", type=int, default=4, help="concurrent callers (default 4)")
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it (peer log, feeds)")
    ns = ap.parse_args(argv)
    if ns.keep is not None:
        ns.keep.mkdir(parents=True, exist_ok=True)
    report = run(ns.n, seed=ns.seed, seconds=ns.seconds, workers=ns.workers, keep=ns.keep)
    print(json.dumps(report.summary(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
