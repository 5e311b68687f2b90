"""Gossip of signed states between peers that host the same feeds: a split view cannot stay hidden (issue 40).

Certificate Transparency's answer to a log that shows different histories to
different clients (RFC 9162 section 8.3: clients and monitors exchange signed tree
heads and check consistency between them), for a log whose writer is its own
operator. Each peer sends the peers it follows (their followed feed) and those
named by `serve --gossip grpc://HOST:PORT` (every feed it hosts) its latest
signed state per feed, after every change (at most once a `MIN_SPACING`) and on
a slow timer. The receiver (`GossipDoor.answer`) checks each state with the
feed key before anything else and compares it with its own:

- same length, another tree; or a shorter state its own tree's prefix does not
  match: a fork proof, built from its own nodes, kept, and sent back;
- a longer state: it answers with its own state and the asker, holding the
  longer tree, judges and sends the fork proof back in a second request of the
  same round, so both sides hold it within one round;
- the asker's shorter state gets the consistency proof from its length, so it
  checks our claim from its side too.

A peer never stores a state it was told, only a fork proof that verifies under
the feed's key (`HostedFeed.mark_forked`): a stranger can neither get an honest
feed marked nor grow the peer's disk. A request holds at most `MAX_FEEDS`
states (the message itself is bounded by the server's --max-message-bytes) and
each client gets `DEFAULT_RATE` requests; the work per state is one signature
check and at most one O(log n) proof.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import grpc

from feedlog.errors import Corruption, FeedlogError, InvalidArgument, NotFound
from feedlog.log import consistency, forks
from feedlog.log.merkle import TreeState, roots_hash
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.client import FeedClient
from feedlog.replication.verify import signed_state
from feedlog.rpc import Address, Tls

from .auth import Guard, Rate, RateLimiter
from .events import event
from .host import FeedHost, HostedFeed

#: states one Gossip request may carry (a sender with more feeds sends several requests)
MAX_FEEDS = 256
#: Gossip requests per client: a peer gossips once a change (at most once a second) per 256 feeds
DEFAULT_RATE = Rate(20, 100)
#: the default slow timer between rounds, in seconds (`serve --gossip-every`)
DEFAULT_EVERY_S = 60.0
#: the least time between two rounds however often feeds change: gossip costs at most this much
MIN_SPACING = 1.0
#: how long one exchange may take before the peer is given up on for this round
CALL_TIMEOUT = 10.0
#: the wait before asking again after a round that could not ask some peer
RETRY_S = 5.0


class GossipDoor:
    """The receiving side: `answer` one Gossip request, checked and rate-limited per client."""

    def __init__(self, host: FeedHost, guard: Guard, rate: Rate = DEFAULT_RATE) -> None:
        self.host = host
        self.guard = guard
        self.limiter = RateLimiter(rate, "gossip")

    def answer(self, request: pb.GossipRequest, context: grpc.ServicerContext) -> pb.GossipResponse:
        client = self.guard.client(context, None)
        self.limiter.charge(client)
        if not request.feeds:
            raise InvalidArgument("a gossip request names at least one feed")
        if len(request.feeds) > MAX_FEEDS:
            raise InvalidArgument(f"{len(request.feeds)} feeds in one gossip request; the limit is {MAX_FEEDS}")
        source = str(context.peer() or client)
        return pb.GossipResponse(feeds=[self._one(g, source) for g in request.feeds])

    def _one(self, g: pb.GossipState, source: str) -> pb.GossipReply:
        key = wire.check_key(g.key)
        reply = pb.GossipReply(key=key)
        try:
            hf = self.host.get(key)
        except NotFound:
            return reply  # no state: not hosted here (and nothing told about it is kept)
        if g.HasField("fork_proof"):
            try:
                hf.mark_forked(_proof_of(g.fork_proof, key, "the fork proof sent"), source)
            except Corruption as e:  # bogus evidence: refused, nothing marked
                raise InvalidArgument(f"feed {key.hex()}: {e}") from None
        ours = hf.feed.core.state
        reply.state.CopyFrom(wire.state_pb(ours))
        if g.HasField("state"):
            try:
                theirs = signed_state(key, g.state, "the state sent")
            except Corruption as e:
                raise InvalidArgument(f"feed {key.hex()}: {e}") from None
            if theirs.length < ours.length:
                # one proof serves both: the asker checks our state with it, and we check its state
                proof = consistency.prove(theirs.length, ours.length, hf.feed.core.node)
                reply.consistency.CopyFrom(wire.consistency_pb(proof))
                if hf.fork is None and theirs.fork == ours.fork and roots_hash(proof.old_roots) != theirs.tree_hash:
                    hf.mark_forked(forks.of_states(key, theirs, ours, proof), source)
            elif theirs.length == ours.length and hf.fork is None:
                found = forks.check(key, ours, hf.feed.core.node, theirs)
                if found is not None:
                    hf.mark_forked(found, source)
        if hf.fork is not None:
            reply.fork_proof.CopyFrom(wire.fork_proof_pb(hf.fork))
        return reply


def _proof_of(m: pb.ForkProof, key: bytes, what: str) -> forks.ForkProof:
    proof = wire.fork_proof_of(m, what)
    try:
        forks.verify(proof, key)
    except InvalidArgument as e:  # another key's proof
        raise Corruption(str(e)) from None
    return proof


def judge_reply(hf: HostedFeed, sent: TreeState, reply: pb.GossipReply, peer: str) -> forks.ForkProof | None:
    """The asker's side: the fork proof (verified) the reply carries or shows against `sent`, our state
    when we asked; None when consistent or not hosted there. Corruption for a reply that lies."""
    key = hf.key
    if reply.HasField("fork_proof"):
        return _proof_of(reply.fork_proof, key, f"{peer}'s fork proof")
    if not reply.HasField("state") or reply.state.length == 0:
        return None
    # its signature is checked where it matters, not twice: `from_received` verifies both states, and a
    # shorter or equal state is verified only if it would make a fork proof (`forks.of_states`)
    try:
        theirs = wire.state_of(reply.state)
    except Corruption as e:
        raise Corruption(f"{peer}: {e}") from None
    if theirs.length > sent.length:
        if not reply.HasField("consistency"):
            raise Corruption(f"{peer}: a longer state without the consistency proof from {sent.length}")
        return forks.from_received(key, sent, theirs, wire.consistency_of(reply.consistency, peer))
    return forks.check(key, sent, hf.feed.core.node, theirs)


class Gossiper:
    """The sending side: one thread that runs a round after every change (spaced) and on a slow timer.

    `peers`: `serve --gossip` addresses (every hosted feed) and followed upstreams (their feed only).
    """

    def __init__(
        self,
        host: FeedHost,
        peers: Sequence[Address],
        *,
        every: float = DEFAULT_EVERY_S,
        tls: Tls | None = None,
        spacing: float = MIN_SPACING,
    ) -> None:
        self.host = host
        self.every = every
        self.spacing = spacing
        self.tls = tls
        # target -> the feeds to tell it (None: every feed hosted here)
        self.peers: dict[str, set[bytes] | None] = {}
        for a in peers:
            if a.feed is None:
                self.peers[a.target] = None
            elif self.peers.get(a.target, set()) is not None:
                self.peers.setdefault(a.target, set()).add(a.key)  # type: ignore[union-attr]
        self.rounds = 0
        self.failed = False  # the last round could not ask some peer
        self._stop = threading.Event()
        self._clients: dict[str, FeedClient] = {}
        self._thread = threading.Thread(target=self._run, name="gossip", daemon=True)

    def start(self) -> Gossiper:
        if self.peers:
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.host.changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for c in self._clients.values():
            c.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.host.changed.clear()
            self.run_round()
            if self._stop.wait(self.spacing):  # at most one round a `spacing`, however busy the feeds
                return
            # a peer that could not be asked (not up yet, restarting) is asked again soon, not a timer later
            wait = min(self.every, RETRY_S) if self.failed else self.every
            self.host.changed.wait(max(0.0, wait - self.spacing))

    def run_round(self) -> int:
        """Gossip with every peer once; return the fork proofs this round found or was given."""
        found = 0
        self.failed = False
        for target, keys in list(self.peers.items()):
            try:
                found += self._with(target, keys)
            except FeedlogError as e:
                self.failed = True
                event("gossip_failed", logging.INFO, peer=target, error=str(e))
            except Exception as e:  # a bug of ours met by hostile input: said, and the round goes on
                self.failed = True
                event("gossip_failed", logging.ERROR, peer=target, error=f"{type(e).__name__}: {e}")
        self.rounds += 1
        return found

    def _client(self, target: str) -> FeedClient:
        c = self._clients.get(target)
        if c is None:
            c = self._clients[target] = FeedClient(target, tls=self.tls, timeout=CALL_TIMEOUT)
        return c

    def _with(self, target: str, keys: set[bytes] | None) -> int:
        feeds = [hf for hf in self.host.feeds() if (keys is None or hf.key in keys) and hf.feed.length]
        client = self._client(target)
        found = 0
        for lo in range(0, len(feeds), MAX_FEEDS):
            chunk = feeds[lo : lo + MAX_FEEDS]
            sent = {hf.key: hf.feed.core.state for hf in chunk}
            req = pb.GossipRequest()
            for hf in chunk:
                g = req.feeds.add(key=hf.key, state=wire.state_pb(sent[hf.key]))
                if hf.fork is not None:
                    g.fork_proof.CopyFrom(wire.fork_proof_pb(hf.fork))
            resp = client.gossip(req)
            by_key = {hf.key: hf for hf in chunk}
            back = pb.GossipRequest()  # proofs the peer does not hold yet: sent in this same round
            for reply in resp.feeds[: len(chunk)]:
                known = by_key.get(bytes(reply.key))
                if known is None:
                    continue
                hf = known
                try:
                    proof = judge_reply(hf, sent[hf.key], reply, target)
                except Corruption as e:  # a peer that lies about its state marks nothing
                    event("gossip_rejected", logging.WARNING, peer=target, feed=hf.key.hex(), error=str(e))
                    continue
                if proof is None:
                    continue
                found += 1
                hf.mark_forked(proof, target)
                if not reply.HasField("fork_proof"):
                    back.feeds.add(key=hf.key, fork_proof=wire.fork_proof_pb(proof))
            if back.feeds:
                client.gossip(back)
        return found
