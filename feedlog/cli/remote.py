"""Reaching a peer or a commit owner from the command line: grpc:// targets, TLS and write-token
arguments, and a client for a peer (shared by the feed, peer and table commands)."""

from __future__ import annotations

import argparse
import sys

from feedlog_server.auth import TOKEN_ENV

from ..errors import Corruption, InvalidArgument
from ..log import entries
from ..replication.client import FeedClient
from ..rpc import SCHEME, Address, Tls
from .args import given_token


def is_remote(target: str) -> bool:
    """Whether a command's target is a peer (grpc://HOST:PORT[/KEY]) rather than a local directory."""
    return target.startswith(SCHEME)


def tls_args(p: argparse.ArgumentParser, write: bool = False) -> None:
    g = p.add_argument_group("TLS to the peer")
    g.add_argument("--tls-ca", metavar="FILE", help="CA certificate that signed the peer's certificate (enables TLS)")
    g.add_argument("--tls-cert", metavar="FILE", help="our client certificate (mutual TLS)")
    g.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert")
    if write:
        g = p.add_argument_group("write credentials (remote targets; or a client certificate above)")
        g.add_argument("--token-file", metavar="FILE", help=f"the peer's write token (default: ${TOKEN_ENV}, if set)")
        g.add_argument(
            "--token",
            help="the token itself (visible to other users in ps: prefer --token-file; one starting with '-' "
            "goes as --token=TOKEN)",
        )


def tls_of(ns: argparse.Namespace) -> Tls | None:
    """TLS to the peer or owner from --tls-ca [--tls-cert --tls-key], None without --tls-ca."""
    ca = getattr(ns, "tls_ca", None)
    if ca is None:
        if getattr(ns, "tls_cert", None) or getattr(ns, "tls_key", None):
            raise InvalidArgument("--tls-cert/--tls-key need --tls-ca")
        return None
    return Tls.from_files(ca, getattr(ns, "tls_cert", None), getattr(ns, "tls_key", None))


def peer_token(ns: argparse.Namespace) -> str | None:
    """The peer write token from --token-file, --token (warned about) or $FEEDLOG_PEER_TOKEN."""
    return given_token(ns, TOKEN_ENV)


def client_for(
    ns: argparse.Namespace, url: str, need_feed: bool = True, write: bool = False
) -> tuple[Address, FeedClient]:
    address = Address.parse(url, need_feed=need_feed)
    tls, token = tls_of(ns), peer_token(ns) if write else None
    warn_if_clear(address.target, tls, token)
    return address, FeedClient(address.target, tls=tls, token=token)


def warn_if_clear(target: str, tls: Tls | None, token: str | None) -> None:
    from feedlog_server.rpc import is_loopback

    if token and tls is None and not is_loopback(target):
        print(f"feedlog: warning: sending the write token to {target} without TLS (--tls-ca)", file=sys.stderr)


def signed_type(client: FeedClient, key: bytes, source: str) -> str:
    """The content type feed `key`'s header says, the header verified against a signed tree (GetInfo's
    `content_type` is the peer's word only)."""
    for batch in client.read_verified(key, 0, 1):
        return header_type(batch.blocks[0], source)
    raise Corruption(f"{source}: sent no header block")


def header_type(block: bytes | None, source: str) -> str:
    if block is None:
        raise Corruption(f"{source}: the feed's header block was cleared")
    return entries.decode_header(block)
