"""`feedlog serve|push|clone|pull|tail`: a peer, and copying feeds to and from peers.

`serve` is the server package's own (`feedlog_server.serve`, also run by
`python -m feedlog_server`); the remote forms of create/put/del/info
(grpc://HOST:PORT/KEY) are the feed commands' (feed_cmds).
"""

from __future__ import annotations

import argparse

from feedlog_server.serve import PEER_HELP, peer_arguments, serve_peer

from ..errors import InvalidArgument, Unavailable
from ..log import entries
from ..replication.sync import clone, pull, push
from ..rpc import Address
from .args import Handler, Parser, Subcommands, add_command
from .fmt import emit, json_line, record_json, record_line
from .remote import client_for, peer_token, tls_args, tls_of, warn_if_clear


def cmd_push(ns: argparse.Namespace) -> None:
    address = Address.parse(ns.url)
    tls, token = tls_of(ns), peer_token(ns)
    warn_if_clear(address.target, tls, token)
    done = push(ns.path, address, tls=tls, token=token)
    emit(ns, {"pushed": done.blocks, "length": done.length}, f"pushed {done.blocks} blocks; the peer has {done.length}")


def cmd_clone(ns: argparse.Namespace) -> None:
    done = clone(Address.parse(ns.url, need_feed=True), ns.path, tls=tls_of(ns))
    emit(ns, {"fetched": done.blocks, "length": done.length}, f"cloned {done.length} blocks into {ns.path}")


def cmd_pull(ns: argparse.Namespace) -> None:
    done = pull(ns.path, tls=tls_of(ns))
    emit(ns, {"fetched": done.blocks, "length": done.length}, f"fetched {done.blocks} blocks; length {done.length}")


def cmd_tail(ns: argparse.Namespace) -> None:
    if ns.from_ < 0:
        raise InvalidArgument("--from must be 0 or more")
    address, client = client_for(ns, ns.url)
    key = address.key
    shown = 0
    with client:
        content_type = client.info(key).content_type
        sub = client.subscribe(key, ns.from_, with_roots=True)
        try:
            for batch in sub.verified(key, ns.from_):
                for k, block in enumerate(batch.blocks):
                    seq = batch.start + k
                    if seq == 0:
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
            raise Unavailable(f"{address.target}: the peer ended the tail after {shown} entries")
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
    p.add_argument("--json", action="store_true")

    p = add("clone", cmd_clone, "copy a feed from a peer, verifying every block and signature")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("path")
    tls_args(p)
    p.add_argument("--json", action="store_true")

    p = add("pull", cmd_pull, "fetch and verify new blocks from where the feed was cloned")
    p.add_argument("path")
    tls_args(p)
    p.add_argument("--json", action="store_true")

    p = add("tail", cmd_tail, "follow a feed on a peer live, verifying every block")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("--from", dest="from_", type=int, default=1, metavar="N", help="first seq (default 1)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N entries (default: run until interrupted)")
    tls_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
