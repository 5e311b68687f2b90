"""`feedlog serve|push|clone|pull|tail`: a peer, and copying feeds to and from peers.

`serve` is the server package's own (`feedlog_server.serve`, also run by
`python -m feedlog_server`); the remote forms of create/put/del/info
(grpc://HOST:PORT/KEY) are the feed commands' (feed_cmds).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable

from feedlog_server.serve import PEER_HELP, peer_arguments, serve_peer

from ..errors import FeedlogError, Unavailable
from ..log import entries
from ..log.feed import Feed
from ..replication.sync import clone, pull, push
from ..replication.verify import signed_state
from ..replication.witness import check_witnesses
from ..rpc import Address
from .args import Handler, Parser, Subcommands, add_command, seq_number
from .fmt import (
    Progress,
    emit,
    interrupted_line,
    json_line,
    plural,
    progress_flag,
    progress_wanted,
    record_json,
    record_line,
)
from .fork_cmds import witness_args, witnesses_of
from .remote import client_for, header_type, peer_token, signed_type, tls_args, tls_of, warn_if_clear


def _reporter(progress: Progress) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress.total = total
        if progress.bar is not None:
            progress.bar.total = total
        progress.update(done)

    return report


def _copy_interrupted(progress: Progress, path: str) -> int:
    """An interrupted clone or pull: what verified blocks it kept, and the command that continues."""
    progress.close()
    try:
        with Feed.open(path, writable=False) as feed:
            length = feed.length
    except FeedlogError:  # nothing was kept (a clone that verified nothing leaves no directory)
        length = 0
    kept = f"{plural(length, 'verified block')} kept in {path}; to continue: feedlog pull {shlex.quote(path)}"
    print(interrupted_line(kept if length else "nothing copied"), file=sys.stderr)
    return 130


def cmd_push(ns: argparse.Namespace) -> int:
    address = Address.parse(ns.url)
    tls, token = tls_of(ns), peer_token(ns)
    warn_if_clear(address.target, tls, token)
    with Progress("push", enabled=progress_wanted(ns)) as progress:
        try:
            done = push(ns.path, address, tls=tls, token=token, on_progress=_reporter(progress))
        except KeyboardInterrupt:
            progress.close()
            took = f"the peer took {plural(progress.done, 'block')} (whole signed batches); " if progress.done else ""
            print(interrupted_line(f"{took}the same push continues where it stopped"), file=sys.stderr)
            return 130
    emit(
        ns,
        {"pushed": done.blocks, "length": done.length},
        f"pushed {plural(done.blocks, 'block')}; the peer has {done.length:,}",
    )
    return 0


def cmd_clone(ns: argparse.Namespace) -> int:
    address = Address.parse(ns.url, need_feed=True)
    with Progress("clone", enabled=progress_wanted(ns)) as progress:
        try:
            done = clone(address, ns.path, tls=tls_of(ns), on_progress=_reporter(progress), witnesses=witnesses_of(ns))
        except KeyboardInterrupt:
            return _copy_interrupted(progress, ns.path)
    emit(
        ns,
        {"fetched": done.blocks, "length": done.length, **_agreed(done.witnesses)},
        f"cloned {plural(done.length, 'block')} into {ns.path}" + _agreed_text(done.witnesses),
    )
    return 0


def cmd_pull(ns: argparse.Namespace) -> int:
    with Progress("pull", enabled=progress_wanted(ns)) as progress:
        try:
            peer = Address.parse(ns.peer) if ns.peer else None
            done = pull(ns.path, tls=tls_of(ns), on_progress=_reporter(progress), peer=peer, witnesses=witnesses_of(ns))
        except KeyboardInterrupt:
            return _copy_interrupted(progress, ns.path)
    text = f"fetched {plural(done.blocks, 'block')}; length {done.length:,}"
    if done.filled:
        text += f"; filled {plural(done.filled, 'hole')}"
    if done.holes:  # blocks that came cleared: a hole, not a value (issue 37)
        text += f"; {plural(done.holes, 'hole')} left (blocks a peer sent cleared: pull --peer from another to fill)"
    text += _agreed_text(done.witnesses)
    data = {"fetched": done.blocks, "length": done.length, "filled": done.filled, "holes": done.holes}
    emit(ns, {**data, **_agreed(done.witnesses)}, text)
    return 0


def _agreed(witnesses: tuple[str, ...]) -> dict[str, list[str]]:
    """The --witness peers that agreed (issue 40), in --json only when some were asked."""
    return {"witnesses": list(witnesses)} if witnesses else {}


def _agreed_text(witnesses: tuple[str, ...]) -> str:
    return f"; {plural(len(witnesses), 'witness', 'witnesses')} agreed" if witnesses else ""


def cmd_tail(ns: argparse.Namespace) -> None:
    address, client = client_for(ns, ns.url)
    key = address.key
    shown = 0
    with client:
        # entries decode by the feed's type, which only its header (block 0) says with a signature;
        # a feed with no blocks yet is tailed from 0, so that its header comes first
        info = client.info(key)
        if ns.witness and info.state.length:  # issue 40: the source's signed state, cross-checked first
            check_witnesses(
                key,
                signed_state(key, info.state, address.target),
                witnesses_of(ns),
                tls=tls_of(ns),
                longer=lambda length: client.info(key, consistency_from=length),
                source=address.target,
            )
        content_type = signed_type(client, key, address.target) if info.state.length else None
        start = ns.from_ if content_type is not None else 0
        sub = client.subscribe(key, start, with_roots=True)
        try:
            for batch in sub.verified(key, start):
                for k, block in enumerate(batch.blocks):
                    seq = batch.start + k
                    if seq == 0:
                        content_type = content_type or header_type(block, address.target)
                        continue
                    if seq < ns.from_ or content_type is None:
                        continue
                    r = (
                        entries.cleared_record(seq)
                        if block is None
                        else entries.decode_record(content_type, seq, block)
                    )
                    if ns.json:
                        print(json_line(record_json(r, 0)), flush=True)
                    else:
                        print(record_line(r, 0), flush=True)
                    shown += 1
                    if ns.count is not None and shown >= ns.count:
                        return
            # a tail runs until interrupted: a peer that ends it (shutting down, or misbehaving) is not success
            raise Unavailable(f"{address.target}: the peer ended the tail after {plural(shown, 'entry', 'entries')}")
        finally:
            sub.cancel()


def register(sub: Subcommands) -> None:
    def add(name: str, handler: Handler, help_: str) -> Parser:
        return add_command(sub, name, handler, help_)

    peer_arguments(add("serve", serve_peer, PEER_HELP))

    p = add("push", cmd_push, "send a local feed's signed batches that the peer lacks")
    p.add_argument("path")
    p.add_argument("url", metavar="grpc://HOST:PORT")
    tls_args(p, write=True)
    progress_flag(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("clone", cmd_clone, "copy a feed from a peer, verifying every block and signature")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("path")
    witness_args(p)
    tls_args(p)
    progress_flag(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("pull", cmd_pull, "fetch and verify new blocks from where the feed was cloned")
    p.add_argument("path")
    p.add_argument(
        "--peer",
        metavar="grpc://HOST:PORT",
        help="pull from this peer instead of the origin (also fills holes: blocks the origin sent cleared)",
    )
    witness_args(p)
    tls_args(p)
    progress_flag(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("tail", cmd_tail, "follow a feed on a peer live, verifying every block")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("--from", dest="from_", type=seq_number, default=1, metavar="N", help="first seq (default 1)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N entries (default: run until interrupted)")
    witness_args(p)
    tls_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
