"""`feedlog audit TABLE`: prove that a table's rows are exactly the signed feed prefixes.

With nothing but the table and the feed keys the user trusts: for each feed,
re-derive every row's Merkle leaf from what the table stores (the exact block
bytes, or the leaf hash + size a TTL tombstone keeps), rebuild the tree in seq
order and check it against every signed state found, in the rows' `signed`
column and in the commits' provenance (`commitInfo.feedlog`), each signature
verified with the trusted key. Decoded columns are compared with the block
they came from. Reports missing seqs, extra rows (duplicates, rows past the
last signature, feeds with no trusted key) and altered rows (a column that
disagrees with its block, or a signed batch whose rows no longer hash to its
signature: the block bytes were changed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..delta import DeltaTable
from ..errors import Corruption, FeedlogError, InvalidArgument
from ..log import merkle
from ..log.crypto import Verifier, leaf_hash
from ..log.entries import decode_entry, decode_header
from ..log.merkle import Node, TreeState
from .rows import COLUMNS, ts_us

#: problems listed per kind before the rest are only counted
SHOW = 10


@dataclass
class FeedAudit:
    key: str
    rows: int = 0
    signed_length: int = 0  # the prefix the signatures cover (seqs 1 .. signed_length-1)
    signatures: int = 0  # signed states checked
    missing: list[int] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    trusted: bool = True

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.altered) and self.trusted and self.signed_length > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "feed": self.key,
            "ok": self.ok,
            "rows": self.rows,
            "signed_length": self.signed_length,
            "signatures_checked": self.signatures,
            "key_trusted": self.trusted,
            "missing": len(self.missing),
            "missing_seqs": self.missing[:SHOW],
            "extra": len(self.extra),
            "extra_rows": self.extra[:SHOW],
            "altered": len(self.altered),
            "altered_rows": self.altered[:SHOW],
        }


@dataclass
class AuditReport:
    table: str
    version: int
    feeds: list[FeedAudit]

    @property
    def ok(self) -> bool:
        return bool(self.feeds) and all(f.ok for f in self.feeds)

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "ok": self.ok, "feeds": [f.to_json() for f in self.feeds]}


def provenance_of(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-feed provenance a commitInfo carries (empty if none)."""
    block = info.get("feedlog")
    feeds = block.get("feeds") if isinstance(block, dict) else None
    return [f for f in feeds if isinstance(f, dict)] if isinstance(feeds, list) else []


def _signed_states(history: Iterable[Mapping[str, Any]], key: str) -> list[TreeState]:
    out = []
    for info in history:
        for p in provenance_of(info):
            s = p.get("signed")
            if p.get("key") == key and isinstance(s, dict):
                try:
                    out.append(
                        TreeState(
                            int(s["length"]),
                            int(s["fork"]),
                            bytes.fromhex(s["tree_hash"]),
                            bytes.fromhex(s["signature"]),
                        )
                    )
                except (KeyError, TypeError, ValueError):
                    continue
    return out


def audit_table(
    path: str,
    keys: Sequence[bytes] | None = None,
    version: int | None = None,
    owner: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> AuditReport:
    # owner: the commit owner to ask for un-backfilled commits (default $FEEDLOG_OWNER); else the
    # backfilled log is audited, with a warning
    table = DeltaTable.open(path, owner=owner, storage_options=storage_options)
    snap = table.snapshot(version)
    missing_cols = [c for c in COLUMNS if c not in snap.schema.names]
    if missing_cols:
        raise InvalidArgument(f"{path} is not a feedlog table: no column(s) {', '.join(missing_cols)}")
    data = snap.to_arrow().select(list(COLUMNS))
    data = data.sort_by([("feed", "ascending"), ("seq", "ascending")])
    infos = [h.commit_info for h in table.history() if h.version <= snap.version]
    trusted = {k.hex() for k in keys} if keys else None
    in_table = pc.unique(data.column("feed")).to_pylist() if data.num_rows else []
    feeds = sorted(set(in_table) | (trusted or set()))
    report = AuditReport(table.storage.location, snap.version, [])
    for key in feeds:
        rows = data.filter(pc.equal(data.column("feed"), key)) if data.num_rows else data
        report.feeds.append(_audit_feed(key, rows, _signed_states(infos, key), trusted is None or key in trusted))
    return report


def _audit_feed(key: str, rows: pa.Table, commits: list[TreeState], trusted: bool) -> FeedAudit:
    a = FeedAudit(key, rows=rows.num_rows, trusted=trusted)
    if not trusted:
        a.extra.append(f"all {rows.num_rows} rows: feed {key[:16]}... is not among the trusted keys")
        return a
    try:
        verifier = Verifier(bytes.fromhex(key))
    except (ValueError, FeedlogError):
        a.extra.append(f"all {rows.num_rows} rows: {key!r} is not a feed key")
        return a
    if rows.num_rows == 0:
        a.missing.append(1)
        return a
    cols = {c: rows.column(c) for c in COLUMNS}
    seqs = cols["seq"].to_pylist()
    cleared = cols["cleared"].to_pylist()
    blocks = cols["block"].to_pylist()
    leaf_hashes = cols["leaf_hash"].to_pylist()
    sizes = cols["size"].to_pylist()
    signed = cols["signed"].to_pylist()

    # every signed state claimed, by length; a state that does not verify is an altered row
    checkpoints: dict[int, TreeState] = {}
    header: bytes | None = None
    for i, s in enumerate(signed):
        if s is None:
            continue
        state = TreeState(s["length"], s["fork"], s["tree_hash"] or b"", s["signature"] or b"")
        if state.length != seqs[i] + 1 or not verifier.verify(state.signature, state.signable()):
            a.altered.append(f"seq {seqs[i]}: its signed state (length {state.length}) does not verify")
            continue
        checkpoints[state.length] = state
        header = header or s["header"]
    for state in commits:
        if verifier.verify(state.signature, state.signable()):
            checkpoints.setdefault(state.length, state)
        else:
            a.altered.append(f"commit provenance for length {state.length}: the signature does not verify")
    if not checkpoints or header is None:
        a.missing.append(1)
        a.extra.append(f"{rows.num_rows} rows with no verifiable signature to check them against")
        return a
    a.signed_length = length = max(checkpoints)
    try:
        content_type = decode_header(header)
    except Corruption as e:
        a.altered.append(f"header: {e}")
        return a

    # rows in seq order: re-derive leaves, check decoded columns
    leaves: list[Node | None] = [Node(0, leaf_hash(header), len(header))] + [None] * (length - 1)
    decoded = _decoded_columns(cols)
    seen = set()
    for i, seq in enumerate(seqs):
        if seq < 1 or seq >= length:
            a.extra.append(f"seq {seq}: past the last signed length {length}" if seq >= length else f"seq {seq}")
            continue
        if seq in seen:
            a.extra.append(f"seq {seq}: a duplicate row")
            continue
        seen.add(seq)
        if cleared[i]:
            lh = leaf_hashes[i]
            if blocks[i] is not None or lh is None or len(lh) != 32:
                a.altered.append(f"seq {seq}: a cleared row needs a 32-byte leaf_hash and no block")
                continue
            leaves[seq] = Node(2 * seq, lh, sizes[i])
            continue
        block = blocks[i]
        if block is None:
            a.altered.append(f"seq {seq}: no block bytes (and not marked cleared)")
            continue
        leaves[seq] = Node(2 * seq, leaf_hash(block), len(block))
        if sizes[i] != len(block):
            a.altered.append(f"seq {seq}: size {sizes[i]} but the block has {len(block)} bytes")
        diff = _differs(content_type, seq, block, decoded, i)
        if diff:
            a.altered.append(f"seq {seq}: column {diff} differs from its signed block")
    a.missing = [s for s in range(1, length) if leaves[s] is None and s not in seen]

    # fold the leaves into the tree, checking each signed length on the way
    roots: list[Node] = []
    good = 0
    pos = 0
    for end in sorted(checkpoints):
        chunk = leaves[pos:end]
        if any(n is None for n in chunk):
            break  # a gap or an unusable row: nothing after it can be checked (already reported)
        _, roots = merkle.append_nodes(roots, [n for n in chunk if n is not None])
        pos = end
        state = checkpoints[end]
        a.signatures += 1
        if merkle.roots_hash(roots) != state.tree_hash:
            a.altered.append(
                f"seqs {max(good, 1)}..{end - 1}: do not hash to the signed tree at length {end} "
                "(block bytes were changed)"
            )
            break
        good = end
    return a


def _decoded_columns(cols: Mapping[str, Any]) -> dict[str, list[Any]]:
    out = {}
    for name in ("key", "value", "deleted", "stat"):
        out[name] = cols[name].to_pylist()
    for name in ("timestamp", "expires_at"):
        out[name] = cols[name].cast(pa.int64()).to_pylist()
    return out


def _differs(content_type: str, seq: int, block: bytes, decoded: Mapping[str, list[Any]], i: int) -> str | None:
    try:
        r = decode_entry(content_type, seq, block)
    except Corruption:
        return "block (not an entry)"
    expect = {
        "key": r.key,
        "value": r.value,
        "deleted": r.deleted,
        "timestamp": ts_us(r.timestamp),
        "expires_at": ts_us(r.expires_at),
    }
    for name, want in expect.items():
        if decoded[name][i] != want:
            return name
    stat = decoded["stat"][i]
    have = {k: v for k, v in stat.items() if v is not None} if stat is not None else None
    if have != r.stat:
        return "stat"
    return None
