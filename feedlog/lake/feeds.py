"""Where Spark reads feeds from: a peer (`grpc://HOST:PORT/KEY`) or a local feed directory.

Both kinds give the same things: the trusted feed key, the signed length,
block 0 (the header, verified), the signed-batch boundary after a seq, and
blocks of a range as `Verified` batches: every block re-hashed into the tree
and the tree's signature checked with the key before anything is released.
A local directory is verified exactly like a peer (its files are not trusted
more than the network); only the key comes from the directory itself.

Objects here are plain data and pickle; connections are opened per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import Corruption, InvalidArgument, NotFound
from ..log import merkle
from ..log.core import KEY_FILE, MAX_BLOCK_BYTES, Core
from ..log.entries import decode_header
from ..replication import wire
from ..replication.client import FeedClient
from ..replication.verify import SegmentVerifier, Verified, max_unsigned_bytes, signed_state
from ..rpc import SCHEME, Address

#: bytes per read message / local segment run
READ_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class FeedSource:
    """One feed to read: `spec` as the user wrote it, the key it is verified against."""

    spec: str
    key: bytes
    target: str | None  # host:port of a peer; None for a local directory
    path: str | None

    @classmethod
    def parse(cls, spec: str) -> FeedSource:
        spec = spec.strip()
        if spec.startswith(SCHEME):
            addr = Address.parse(spec, need_feed=True)
            return cls(spec, addr.key, addr.target, None)
        if "://" in spec:
            raise InvalidArgument(f"feed {spec!r}: expected grpc://HOST:PORT/KEY or a local feed directory")
        p = Path(spec).expanduser().resolve()
        try:
            key = (p / KEY_FILE).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{spec}: not a feed directory (no {KEY_FILE} file)") from None
        except OSError as e:
            raise InvalidArgument(f"{spec}: {e.strerror}") from None
        if len(key) != 32:
            raise Corruption(f"{spec}: the key file does not hold a 32-byte key")
        return cls(spec, key, None, str(p))

    @property
    def key_hex(self) -> str:
        return self.key.hex()

    @contextlib.contextmanager
    def _core(self) -> Iterator[Core]:
        assert self.path is not None
        core = Core.open(self.path, writable=False)
        try:
            yield core
        finally:
            core.close()

    @contextlib.contextmanager
    def _client(self) -> Iterator[FeedClient]:
        assert self.target is not None
        client = FeedClient(self.target)
        try:
            yield client
        finally:
            client.close()

    def signed_length(self) -> int:
        """The length of the newest signed state (what `latest` means)."""
        return self.signed_size()[0]

    def signed_size(self) -> tuple[int, int]:
        """(length, bytes of its blocks) of the newest signed state."""
        if self.path is not None:
            with self._core() as core:
                core.refresh()
                return core.length, core.byte_length
        with self._client() as c:
            info = c.info(self.key)
        # the peer's word is not enough: a length must carry the key holder's signature (a made-up
        # one would have a reader plan, and a stream wait for, entries that do not exist)
        state = signed_state(self.key, info.state, self.spec) if info.state.length else None
        length = 0 if state is None else state.length
        size = int(info.byte_length)  # not signed: bounded by what `length` blocks can hold
        if not 0 <= size <= length * MAX_BLOCK_BYTES:
            raise Corruption(f"{self.spec}: claims {size} bytes for {length} blocks")
        return length, size

    def batch_end(self, seq: int) -> int:
        """The length at the end of the signed batch holding `seq` (an offset that has a signature)."""
        if self.path is not None:
            with self._core() as core:
                core.refresh()
                return core.batch_end(seq)
        with self._client() as c:
            for resp in c.read(self.key, seq, seq + 1):
                for seg in resp.segments:
                    if seg.HasField("state"):
                        end = signed_state(self.key, seg.state, self.spec).length
                        if end <= seq:
                            raise Corruption(f"{self.spec}: the batch it sent for seq {seq} ends at {end}")
                        return end
        raise Corruption(f"{self.spec}: sent no signed state covering seq {seq}")

    def proof(self, seq: int) -> merkle.Proof:
        """Block `seq`'s proof against the newest signed state, checked with the key before it is
        returned (a peer's answer is its word until then; a local file's too)."""
        if self.path is not None:
            with self._core() as core:
                core.refresh()
                if seq >= core.length:
                    raise NotFound(f"{self.spec}: no seq {seq} (the feed has seqs 0..{core.length - 1})")
                p = core.proof(seq)
        else:
            with self._client() as c:
                p = c.proof(self.key, seq)
        merkle.verify_proof(p, self.key)
        if p.seq != seq:  # a valid proof of another entry is not an answer to this one
            raise Corruption(f"{self.spec}: asked for the proof of seq {seq}, sent one of seq {p.seq}")
        return p

    def header(self) -> bytes:
        """Block 0, verified against a signed tree."""
        for batch in self.read(0, 1):
            block = batch.blocks[0]
            if block is None:
                raise Corruption(f"{self.spec}: the header block was cleared")
            decode_header(block)
            return block
        raise NotFound(f"{self.spec}: the feed is empty")

    def read(self, start: int, end: int) -> Iterator[Verified]:
        """Blocks [start, end) as verified batches (trimmed to the range)."""
        if start >= end:
            return
        if self.target is not None:
            with self._client() as c:
                got = start
                for got_batch in _verified(c, self.key, start, end):
                    got = got_batch.start + len(got_batch.blocks)
                    yield got_batch
                if got < end:
                    raise NotFound(f"{self.spec}: the peer ended the read at {got}, before {end}")
            return
        with self._core() as core:
            core.refresh()
            yield from self.read_core(core, start, end)

    def read_core(self, core: Core, start: int, end: int) -> Iterator[Verified]:
        """`read` of a local feed through a core the caller holds open (a follower polling its length)."""
        if end > core.length:
            raise NotFound(f"{self.spec}: asked for blocks up to {end}, the feed has {core.length}")
        v = SegmentVerifier(self.key, start, merkle.nodes_for_roots(start, core.node), source=self.spec)
        pos = start
        while pos < end:
            segs = core.segments(pos, end, READ_BYTES, check=False)  # the verifier hashes every block
            if not segs:
                raise Corruption(f"{self.spec}: no blocks at {pos}")
            for seg in segs:
                done = v.add(seg)
                pos = seg.end
                if done is not None:
                    yield done.trimmed(end)


def _verified(client: FeedClient, key: bytes, start: int, end: int) -> Iterator[Verified]:
    """`client.read_verified` through a `SegmentVerifier`: blocks [start, end) as verified batches."""
    source = client.target
    v: SegmentVerifier | None = None
    for resp in client.read(key, start, end, with_roots=True):
        if v is None:
            roots = wire.nodes_of(resp.roots, source)
            v = SegmentVerifier(key, start, roots, source=source, max_unsigned=max_unsigned_bytes(client.budget))
        for m in resp.segments:
            batch = v.receive(m)
            if batch is None:
                continue
            if batch.start + len(batch.blocks) > end:
                batch = batch.trimmed(end)
            if batch.blocks:
                yield batch
            if v.length >= end:
                return
    if v is not None and v.pending:
        raise Corruption(f"{source}: the stream ended after {v.pending} blocks from {v.length} that were never signed")


def parse_sources(text: str) -> list[FeedSource]:
    """A comma-separated list of feed specs; each feed once."""
    specs = [s for s in (p.strip() for p in text.split(",")) if s]
    if not specs:
        raise InvalidArgument("name at least one feed: grpc://HOST:PORT/KEY or a feed directory")
    out: list[FeedSource] = []
    seen: set[bytes] = set()
    for s in specs:
        src = FeedSource.parse(s)
        if src.key in seen:
            raise InvalidArgument(f"feed {src.key_hex} is named twice")
        seen.add(src.key)
        out.append(src)
    return out
