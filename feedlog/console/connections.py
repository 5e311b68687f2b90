"""The console's connections: a deadline for each request head, and a cap per client address.

uvicorn's h11 protocol starts no timer when a connection opens (`timeout_keep_alive` only runs
between requests, and any byte cancels it), while `limit_concurrency` counts every open
connection; so N sockets that send nothing, or trickle a byte at a time, turned every real
request into a 503 for as long as they stayed open, before any token was checked. This subclass
adds the two missing bounds and nothing else:

- a connection must deliver a complete request head within `head_timeout` seconds of opening,
  and again of each response's end (a trickled head or a trickled leftover body both count as
  waiting); otherwise it is closed. The timer is off while a request is being answered.
- one client address (`feedlog.rpc.client_key`: an IPv4 address, an IPv6 /64) holds at most
  `per_client` connections; one beyond is closed as it opens, so one client cannot take every
  slot of `--max-connections`.

Over TLS, asyncio completes the handshake before `connection_made` (bounded by its own
`ssl_handshake_timeout`, 60 s), so the head deadline starts once the handshake is done.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from ..rpc import client_key

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol

#: seconds a connection has to send its request head (after opening, or after its last answer)
HEAD_TIMEOUT_S = 10.0
#: connections one client address may hold at once (at most half of --max-connections)
PER_CLIENT = 16


def per_client_cap(max_connections: int, asked: int | None) -> int:
    """Connections one client may hold (pure): `asked`, else PER_CLIENT, and never every slot
    when there are two or more (uvicorn answers 503 once the open connections reach the limit)."""
    cap = asked if asked is not None else PER_CLIENT
    return max(1, min(cap, max_connections // 2)) if max_connections > 1 else 1


def guarded_protocol(head_timeout: float, per_client: int) -> type[H11Protocol]:
    """An h11 protocol class for `uvicorn.Config(http=...)` with both bounds; one class per server,
    as the per-client counts are shared by its connections."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # an extra: imported only to serve

    held: Counter[str] = Counter()

    class Guarded(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _key: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            key = client_key(self.client[0]) if self.client else ""
            if held[key] >= per_client:
                transport.close()  # connection_lost follows and takes it out of uvicorn's set
                return
            held[key] += 1
            self._key = key
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._key is not None:
                held[self._key] -= 1
                if held[self._key] <= 0:
                    del held[self._key]
                self._key = None
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a complete request head arrived: it is being answered
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()  # the next head has the same deadline (a pipelined one disarms it at once)
            super().on_response_complete()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(head_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return Guarded
