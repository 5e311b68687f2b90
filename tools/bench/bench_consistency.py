"""Split-view detection benchmark (issue 40): consistency proofs, gossip, and witnesses on clone.

Each figure comes with a reference measured in the same run that contains none of feedlog's code:
  proofs     size (nodes, bytes on the wire) and time to produce and to verify a consistency proof
             between lengths m = n/2 + 1 and n, n = 1k .. 10M. The trees are those of feeds of n
             identical blocks, whose node at depth d is the same hash for every offset: each node is
             built by the Merkle code (`crypto.leaf_hash`, `parent_hash`) once per depth, so a 10M tree
             costs 24 hashes to make, and proof work does not depend on block contents. At 1k and 64k a
             tree of random blocks built block by block (`merkle.append_leaves`) checks the figures
             match. Reference: hashlib BLAKE2b-256 over as many 80-byte parent inputs as the verifier
             hashes, plus the two Ed25519 verifications (cryptography), in a bare loop.
  gossip     per peer per feed: the bytes of a Gossip state and of its reply (with a consistency
             proof), and the time of one exchange of `--feeds` feeds between two peers on loopback,
             divided by the feeds; reference: one bare Ed25519 verification per feed (what the peer
             must do at the least).
  witness    `clone` of `--clone-entries` entries from a peer on loopback with and without one
             `--witness` (a second peer holding the same feed): the added cost in percent
             (medians of paired runs).

    python tools/bench/bench_consistency.py                      # default: < ~1-2 min
    python tools/bench/bench_consistency.py --clone-entries 1000000   # the issue's witness size
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from feedlog.log import consistency, flat_tree, merkle
from feedlog.log.crypto import KeyPair, Signer, Verifier, leaf_hash, parent_hash
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import Node, TreeState
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

KP = KeyPair.from_seed(bytes([7]) * 32)
BLOCK = b"x" * 64


def uniform_tree() -> Callable[[int], Node]:
    """`node(index)` of the tree of a feed whose blocks are all BLOCK: one hash per depth."""
    by_depth = [Node(0, leaf_hash(BLOCK), len(BLOCK))]
    for _d in range(1, 48):  # trees up to 2**47 blocks (their byte sizes fit a u64)
        below = by_depth[-1]
        by_depth.append(Node(0, parent_hash(below.hash, below.hash, 2 * below.size), 2 * below.size))

    def node(i: int) -> Node:
        n = by_depth[flat_tree.depth(i)]
        return Node(i, n.hash, n.size)

    return node


def random_tree(n: int) -> Callable[[int], Node]:
    nodes: dict[int, Node] = {}
    roots: list[Node] = []
    for lo in range(0, n, 4096):
        blocks = [os.urandom(64) for _ in range(lo, min(lo + 4096, n))]
        created, roots = merkle.append_leaves(roots, lo, blocks)
        nodes.update((c.index, c) for c in created)
    return nodes.__getitem__


def signed(length: int, node: Callable[[int], Node], signer: Signer) -> TreeState:
    th = consistency.roots_hash_at(length, node)
    return TreeState(length, 0, th, signer.sign(TreeState(length, 0, th, b"").signable()))


def best(fn: Callable[[], object], repeat: int) -> float:
    """Seconds per call: the best of 5 timings of `repeat` calls (noise on a shared machine only adds)."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - t0) / repeat)
    return min(times)


def reference(hashes: int, sk: Ed25519PrivateKey) -> float:
    """A bare loop with no feedlog code: `hashes` BLAKE2b-256 of 80-byte inputs and two Ed25519 verifies."""
    pk = sk.public_key()
    msg = b"m" * 80
    sig = sk.sign(msg)
    data = b"p" * 80

    def run() -> None:
        for _ in range(hashes):
            hashlib.blake2b(data, digest_size=32).digest()
        pk.verify(sig, msg)
        pk.verify(sig, msg)

    return best(run, 200)


def bench_proofs(lengths: list[int]) -> None:
    signer, verifier = Signer(KP.seed or b""), Verifier(KP.public_key)
    sk = Ed25519PrivateKey.from_private_bytes(bytes(32))
    print("consistency proofs, m = n/2 + 1 to n (feeds of n identical 64-byte blocks; * = random blocks)")
    print(f"{'n':>12} {'nodes':>6} {'bytes':>6} {'produce':>10} {'verify':>10} {'reference':>10} {'ratio':>6}")
    cases: list[tuple[str, int, Callable[[int], Node]]] = [(f"{n:,}", n, uniform_tree()) for n in lengths]
    cases += [(f"{n:,}*", n, random_tree(n)) for n in (1_000, 65_536)]
    for label, n, node in cases:
        m = n // 2 + 1
        old, new = signed(m, node, signer), signed(n, node, signer)
        proof = consistency.prove(m, n, node)
        size = wire.consistency_pb(proof).ByteSize()
        produce = best(lambda: consistency.prove(m, n, node), 200)  # noqa: B023
        verify = best(lambda: consistency.verify(proof, old, new, verifier), 200)  # noqa: B023
        # the parents a verifier hashes: the internal nodes it derives on the way to the roots at n
        hashes = _parents_hashed(proof)
        ref = reference(hashes, sk)
        print(
            f"{label:>12} {len(proof):>6} {size:>6} {produce * 1e6:>8.1f}us {verify * 1e6:>8.1f}us "
            f"{ref * 1e6:>8.1f}us {ref / verify:>6.2f}"
        )
    print("  (verify includes both Ed25519 signature checks; ratio = reference / verify, 1.0 = the raw limit)")


def _parents_hashed(proof: consistency.ConsistencyProof) -> int:
    known = {x.index for x in (*proof.old_roots, *proof.nodes)}
    count = 0

    def walk(i: int) -> None:
        nonlocal count
        if i in known:
            return
        kids = flat_tree.children(i)
        assert kids is not None
        walk(kids[0])
        walk(kids[1])
        count += 1

    for r in flat_tree.full_roots(proof.new_length):
        walk(r)
    return count + 2  # and the two tree hashes over the roots


def bench_gossip(tmp: Path, feeds: int) -> None:
    a_dir, b_dir = tmp / "ga", tmp / "gb"
    for k in range(feeds):
        kp = KeyPair.from_seed(k.to_bytes(4, "big") * 8)
        with Feed.create(a_dir / f"f{k}", key_pair=kp, timestamps="off", fsync=False) as f:
            f.append([Write(f"/k{i}", b"v") for i in range(20)])
        shutil.copytree(a_dir / f"f{k}", b_dir / f"f{k}")
        with Feed.open(b_dir / f"f{k}") as f:  # b is ahead: its replies carry a proof
            f.append([Write("/more", b"v")])
    with PeerServer(a_dir, fsync=False) as a, PeerServer(b_dir, fsync=False) as b:
        assert a.gossiper is not None
        a.gossiper.peers = {b.address: None}
        a.gossiper.run_round()  # connect, warm up
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a.gossiper.run_round()
            times.append(time.perf_counter() - t0)
        hfs = a.host.feeds()
        req = pb.GossipRequest(
            feeds=[pb.GossipState(key=hf.key, state=wire.state_pb(hf.feed.core.state)) for hf in hfs]
        )
        with FeedClient(b.address) as c:
            resp = c.gossip(req)
        marked = sum(hf.fork is not None for hf in [*a.host.feeds(), *b.host.feeds()])
    per = min(times) / feeds
    sk = Ed25519PrivateKey.from_private_bytes(bytes(32))
    pk, sig = sk.public_key(), sk.sign(b"m" * 80)
    raw = best(lambda: pk.verify(sig, b"m" * 80), 2000)
    print(
        f"gossip, {feeds} feeds between two peers on loopback: {per * 1e6:.0f}us a feed a round "
        f"({req.ByteSize() / feeds:.0f} bytes a state sent, {resp.ByteSize() / feeds:.0f} bytes a reply with its "
        f"consistency proof); reference, one bare Ed25519 verify: {raw * 1e6:.0f}us, ratio {raw / per:.2f}; "
        f"feeds marked forked: {marked}"
    )


def bench_witness(tmp: Path, entries: int, runs: int) -> None:
    src = tmp / "w1" / "feed"
    with Feed.create(src, key_pair=KP, timestamps="off", fsync=False) as f:
        value = b"v" * 80
        for lo in range(0, entries, 1000):
            f.append([Write(f"/k{i}", value) for i in range(lo, min(lo + 1000, entries))])
    shutil.copytree(tmp / "w1", tmp / "w2")
    plain: list[float] = []
    witnessed: list[float] = []
    with PeerServer(tmp / "w1", fsync=False) as p1, PeerServer(tmp / "w2", fsync=False) as p2:
        url = Address.parse(f"grpc://{p1.address}/{KP.public_key.hex()}")
        witness = Address.parse(f"grpc://{p2.address}")
        for r in range(runs):
            for with_witness in (r % 2 == 0, r % 2 == 1):  # alternate which goes first
                dest = tmp / f"clone-{r}-{with_witness}"
                t0 = time.perf_counter()
                clone(url, dest, witnesses=[witness] if with_witness else ())
                (witnessed if with_witness else plain).append(time.perf_counter() - t0)
                shutil.rmtree(dest)
    a, b = statistics.median(plain), statistics.median(witnessed)
    print(
        f"clone of {entries:,} entries: {a:.2f}s without a witness, {b:.2f}s with one "
        f"(medians of {runs} paired runs): the witness adds {100 * (b - a) / a:+.1f}%"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-length", type=int, default=10_000_000)
    ap.add_argument("--feeds", type=int, default=100, help="feeds gossiped between two peers (default 100)")
    ap.add_argument("--clone-entries", type=int, default=200_000, help="entries cloned with a witness (200k)")
    ap.add_argument("--runs", type=int, default=3, help="paired clone runs (default 3)")
    ns = ap.parse_args()
    print("(a shared machine: figures are noisy; the ratios are measured in the same run)")
    lengths = [n for n in (1_000, 10_000, 100_000, 1_000_000, 10_000_000) if n <= ns.max_length]
    bench_proofs(lengths)
    with tempfile.TemporaryDirectory(prefix="bench-consistency-") as d:
        bench_gossip(Path(d), ns.feeds)
        bench_witness(Path(d), ns.clone_entries, ns.runs)


if __name__ == "__main__":
    main()
