"""Who may write to a peer, and how fast: write tokens or client certificates, per-client rate limits.

Reads (GetInfo, Read, Subscribe, Proof) are open: they serve signed data any
reader verifies. A signed Append to a hosted feed is authenticated by its
signature. Everything else that writes needs a *principal*:

- a verified client certificate (mutual TLS): `cert:<common name>`;
- a write token sent as `authorization: Bearer <token>` call metadata:
  `token:<first 8 hex digits of its SHA-256>`.

The peer keeps only SHA-256 hashes of its tokens and compares hashes with
`hmac.compare_digest`. A token file lists one token per line; a line
`sha256:<64 hex>` is an already hashed token, so the file on the server need
not hold the secret. Rate limits are token buckets keyed by the principal, or
by the client's IP address when there is none.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from feedlog.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unauthenticated
from feedlog.rpc import new_token

from .events import event

if TYPE_CHECKING:  # imported by the serve command before gRPC is set up: grpc only for types here
    import grpc

#: the environment variable holding a write token, read by `feedlog serve` and by the client commands
TOKEN_ENV = "FEEDLOG_PEER_TOKEN"
#: where a peer started without tokens or client certificates keeps the token it generated (mode 0600)
GENERATED_TOKEN = Path("_peer") / "write-token"
MAX_CLIENTS = 4096  # rate-limit buckets kept; the least recently used are dropped (a fresh bucket is full)
_HASHED = re.compile(r"sha256:([0-9a-fA-F]{64})")


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_hashes(lines: Iterable[str]) -> list[bytes]:
    """Hashes of the tokens in `lines`: one per non-blank line, `#` starts a comment, `sha256:HEX` is pre-hashed."""
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _HASHED.fullmatch(line)
        out.append(bytes.fromhex(m.group(1)) if m else token_hash(check_token(line)))
    return out


def check_token(token: str) -> str:
    """A usable token: printable ASCII without spaces (it travels as an HTTP/2 header value)."""
    token = token.strip()
    if len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token:
        raise InvalidArgument("a write token is at least 16 printable ASCII characters without spaces")
    return token


def read_token_file(path: str | os.PathLike[str]) -> list[bytes]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"cannot read token file {path}: {e}") from None
    hashes = token_hashes(text.splitlines())
    if not hashes:
        raise InvalidArgument(f"token file {path} holds no token")
    return hashes


def generated_token(data: Path) -> tuple[Path, str]:
    """The token in DATA/_peer/write-token, made (random, mode 0600) if the file does not exist yet."""
    path = data / GENERATED_TOKEN
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        text = path.read_text().strip()
        if path.stat().st_mode & 0o077:
            event("token_file_readable", file=str(path), mode=oct(path.stat().st_mode & 0o777))
        return path, check_token(text)
    token = new_token(32)  # never starting with '-': `--token -x...` reads as an option
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path, token


@dataclass(frozen=True, slots=True)
class Rate:
    """`per_second` requests on average, up to `burst` at once."""

    per_second: float
    burst: int

    @classmethod
    def parse(cls, text: str) -> Rate:
        """`N/s`, `N/min` or `N/h`, optionally `,BURST` (default: one second's worth, at least 1)."""
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|min|h)\s*(?:,\s*(\d+)\s*)?", text)
        if not m or float(m.group(1)) <= 0:
            raise InvalidArgument(f"{text!r}: expected a rate like 100/s, 10/min or 100/s,500 (burst)")
        per_second = float(m.group(1)) / {"s": 1, "min": 60, "h": 3600}[m.group(2)]
        burst = int(m.group(3)) if m.group(3) else max(1, int(per_second))
        if burst < 1:
            raise InvalidArgument(f"{text!r}: the burst must be at least 1")
        return cls(per_second, burst)

    def __str__(self) -> str:
        return f"{self.per_second:g}/s, burst {self.burst}"


DEFAULT_WRITE_RATE = Rate(10_000, 20_000)  # write requests per client (a request may carry many entries)
DEFAULT_CREATE_RATE = Rate(1, 20)  # new feeds per client


class RateLimiter:
    """Token buckets, one per client, at most MAX_CLIENTS of them."""

    def __init__(self, rate: Rate, what: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.what = what
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def charge(self, client: str) -> None:
        """Take one token from `client`'s bucket, or raise ResourceExhausted saying when to retry."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(client, (float(self.rate.burst), now))
            tokens = min(float(self.rate.burst), tokens + (now - at) * self.rate.per_second)
            ok = tokens >= 1
            self._buckets[client] = (tokens - 1 if ok else tokens, now)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
        if not ok:
            after = (1 - tokens) / self.rate.per_second
            raise ResourceExhausted(
                f"{self.what} rate limit for {client} ({self.rate}) reached: retry in {after:.2f}s",
                retry_after=after,
            )


class Guard:
    """The peer's write policy: who is calling, whether they may write or create feeds, and how often."""

    def __init__(
        self,
        hashes: Iterable[bytes] = (),
        *,
        client_certs: bool = False,
        accept_new: bool = False,
        write_rate: Rate = DEFAULT_WRITE_RATE,
        create_rate: Rate = DEFAULT_CREATE_RATE,
    ) -> None:
        self._hashes = list(hashes)
        self.client_certs = client_certs
        self.accept_new = accept_new
        self.writes = RateLimiter(write_rate, "write")
        self.creates = RateLimiter(create_rate, "feed creation")

    @property
    def how(self) -> str:
        ways = (["a write token (authorization: Bearer <token>)"] if self._hashes else []) + (
            ["a client certificate"] if self.client_certs else []
        )
        return " or ".join(ways) or "credentials this peer was not configured with (it takes no server-side writes)"

    def principal(self, context: grpc.ServicerContext) -> str | None:
        """The authenticated caller, None if anonymous; PermissionDenied for a token that is not ours."""
        presented = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if presented:
            value = presented[0] if isinstance(presented[0], str) else presented[0].decode("latin-1")
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
            digest = token_hash(token.strip())
            match = False
            for h in self._hashes:  # no early exit: the time taken does not tell which token came close
                match |= hmac.compare_digest(digest, h)
            if not match:
                raise PermissionDenied("this write token is not valid on this peer")
            return f"token:{digest.hex()[:8]}"
        if self.client_certs:
            cn = (context.auth_context() or {}).get("x509_common_name")
            if cn:
                return f"cert:{cn[0].decode(errors='replace')}"
        return None

    def client(self, context: grpc.ServicerContext, principal: str | None) -> str:
        """The rate-limit key: the principal, else the caller's IP address (any port)."""
        if principal:
            return principal
        peer = str(context.peer() or "unknown")
        return "addr:" + peer.rpartition(":")[0] if peer.count(":") >= 2 else "addr:" + peer

    def writer(self, context: grpc.ServicerContext, what: str) -> str:
        """The principal making a server-side write (Put, PutStream, Create); raises if there is none."""
        principal = self.principal(context)
        if principal is None:
            raise Unauthenticated(f"{what} needs {self.how}")
        self.writes.charge(principal)
        return principal

    def appender(self, context: grpc.ServicerContext) -> str | None:
        """A signed Append: open to anyone (the signature authenticates it), but rate-limited per client."""
        principal = self.principal(context)
        self.writes.charge(self.client(context, principal))
        return principal

    def may_create(self, context: grpc.ServicerContext, principal: str | None, key: bytes) -> None:
        """A stranger's Append at length 0 creates a feed only on a peer started with accept_new."""
        if principal is None and not self.accept_new:
            raise Unauthenticated(
                f"this peer does not host feed {key.hex()}: pushing a new feed needs {self.how} "
                "(or a peer started with --accept-new)"
            )
        self.creates.charge(self.client(context, principal))
