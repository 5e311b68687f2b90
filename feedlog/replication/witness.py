"""Cross-checking what a reader holds against other peers' signed states: split views cannot stay hidden.

A reader that holds (or is about to take) signed state `ours` of a feed asks a
peer for its signed state and, when the peer's is longer, the consistency proof
from our length (GetInfo `consistency_from`). Three outcomes (issue 40):

- consistent: the peer's history extends ours, or ours extends the peer's
  (judged from our own tree when we keep one, else from the longer side's proof);
- a fork: the key signed two histories, shown by a `forks.ForkProof` that
  verifies under the feed key (a peer that already holds one sends it);
- a lie: a proof that does not even match the peer's own signed state, or a
  state the key did not sign (Corruption naming the peer, nothing marked).

A witness is any peer that hosts the feed (`--witness grpc://HOST:PORT`); one
that cannot be asked fails the check (Unavailable, NotFound): a cross-check
that silently skips its witnesses checks nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import Corruption, Fork
from ..log import forks
from ..log.forks import ForkProof
from ..log.merkle import Node, TreeState
from ..pb import feeds_pb2 as pb
from ..rpc import Address, Tls
from . import wire
from .client import FeedClient
from .verify import signed_state


@dataclass(frozen=True, slots=True)
class Agreed:
    """A witness whose signed state is consistent with ours."""

    witness: str
    state: TreeState


def peer_fork(key: bytes, info: pb.FeedInfo, source: str) -> ForkProof | None:
    """The fork proof a peer's GetInfo carries, once it verifies under `key`; a bogus one is Corruption."""
    if not info.HasField("fork_proof"):
        return None
    proof = wire.fork_proof_of(info.fork_proof, source)
    try:
        forks.verify(proof, key)
    except Corruption as e:
        raise Corruption(f"{source}: sent a fork proof that does not verify: {e}") from None
    return proof


def judge(
    key: bytes,
    ours: TreeState,
    info: pb.FeedInfo,
    source: str,
    node: Callable[[int], Node] | None = None,
    longer: Callable[[int], pb.FeedInfo] | None = None,
    *,
    need_proof: bool = True,
) -> tuple[TreeState, ForkProof | None]:
    """The peer's signed state (from `info`, asked with `consistency_from=ours.length`) and the fork
    proof, if ours and its cannot both hold. A shorter peer state is judged from our tree (`node`) or,
    for a reader that keeps none, from the proof our source sends from that length (`longer(length)`:
    GetInfo on our source asked with `consistency_from`). Corruption for a peer that lies. A longer peer
    state without its proof is Corruption too, unless not `need_proof`: a reader about to take the
    continuation from that peer checks it block by block anyway (a peer older than issue 40 sends none)."""
    found = peer_fork(key, info, source)
    if found is None and info.state.length == 0:  # the peer holds nothing of the feed: nothing signed to judge
        return TreeState(0, info.state.fork, bytes(info.state.tree_hash), b""), None
    theirs = signed_state(key, info.state, source)
    if found is not None or ours.length == 0:  # every tree extends the empty one
        return theirs, found
    if theirs.length >= ours.length:
        if theirs.length > ours.length and not info.HasField("consistency"):
            if not need_proof:
                return theirs, None
            raise Corruption(f"{source}: did not send the consistency proof from length {ours.length} asked for")
        if theirs.length == ours.length:
            fp = None if theirs.tree_hash == ours.tree_hash else forks.of_states(key, ours, theirs)
            return theirs, fp
        proof = wire.consistency_of(info.consistency, source)
        try:
            return theirs, forks.from_received(key, ours, theirs, proof)
        except Corruption as e:
            raise Corruption(f"{source}: its consistency proof from length {ours.length} is bogus: {e}") from None
    if theirs.fork != ours.fork:
        return theirs, None  # a truncation elsewhere: no evidence (the continuation checks refuse it)
    if node is not None:
        return theirs, forks.check(key, ours, node, theirs)
    if longer is None:
        raise Corruption(f"{source}: is behind us (length {theirs.length} < {ours.length}) and we keep no tree")
    src = longer(theirs.length)
    ahead = signed_state(key, src.state, "our source")
    if ahead.length < theirs.length or not src.HasField("consistency"):
        raise Corruption(f"our source sent no consistency proof from length {theirs.length}")
    return theirs, forks.from_received(key, theirs, ahead, wire.consistency_of(src.consistency, "our source"))


def check_witnesses(
    key: bytes,
    ours: TreeState,
    witnesses: Sequence[Address],
    *,
    tls: Tls | None = None,
    node: Callable[[int], Node] | None = None,
    longer: Callable[[int], pb.FeedInfo] | None = None,
    keep: Path | None = None,
    source: str = "",
) -> list[Agreed]:
    """Ask each witness; return those that agree, or raise `Fork` for the first that proves a fork
    (its proof kept in `keep`, a feed directory or a file path ending in .json, first)."""
    agreed: list[Agreed] = []
    for w in witnesses:
        with FeedClient(w.target, tls=tls) as client:
            info = client.info(key, consistency_from=ours.length)
        theirs, fp = judge(key, ours, info, w.target, node, longer)
        if fp is not None:
            raise fork_found(fp, w.target, keep, source)
        agreed.append(Agreed(str(w), theirs))
    return agreed


def fork_found(proof: ForkProof, witness: str, keep: Path | None, source: str = "") -> Fork:
    """The Fork a reader raises for `proof`, the proof kept first where `keep` says."""
    where: str | None = None
    note = ""
    if keep is not None:
        try:
            if keep.suffix == ".json":
                from ..log.storage import atomic_write

                atomic_write(keep, forks.dumps(proof))
            else:
                forks.keep(keep, proof)
                keep = keep / forks.FORK_FILE
            where = str(keep)
        except OSError as e:  # the fork is the news: a proof that could not be kept is said, not raised
            note = f" (the proof could not be kept in {keep}: {e.strerror or e})"
    said = f"{source} and {witness} disagree: " if source else f"{witness}: "
    err = forks.fork_error(proof, said.rstrip(": "), where)
    return type(err)(str(err) + note) if note else err
