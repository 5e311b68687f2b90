"""Cross-checking the feeds Spark reads against witnesses (issue 40): the source option `witnesses` and
`feedlog ingest --witness`.

On the driver, before any task reads: each feed's source is asked for its signed
state and every witness (a peer hosting the same feed) must hold one consistent
with it (`replication.witness.check_witnesses`): a feed whose key signed two
histories fails the job with `Fork` (exit 5) before a row is written. Which
witnesses agreed, at which signed length, goes into the commit's provenance
(`commitInfo.feedlog.witnesses`, the sink's `witnesses` option).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidArgument
from ..log.core import Core
from ..log.merkle import TreeState
from ..replication.client import FeedClient
from ..replication.verify import signed_state
from ..replication.witness import Agreed, check_witnesses
from ..rpc import SCHEME, Address
from .feeds import FeedSource

#: the source's and the sink's option
OPTION = "witnesses"


def parse(text: str | Sequence[str] | None) -> list[Address]:
    """`grpc://HOST:PORT` witnesses, comma-separated or a list."""
    items = text.split(",") if isinstance(text, str) else list(text or [])
    out = []
    for w in (i.strip() for i in items):
        if not w:
            continue
        if not w.startswith(SCHEME):
            raise InvalidArgument(f"witness {w!r}: expected grpc://HOST:PORT")
        out.append(Address.parse(w))
    return out


def cross_check(src: FeedSource, witnesses: Sequence[Address]) -> tuple[TreeState, list[Agreed]]:
    """The source's signed state and the witnesses that agree with it (Fork, with the proof, otherwise)."""
    if src.path is not None:
        core = Core.open(src.path, writable=False)
        try:
            state = core.state
            return state, check_witnesses(src.key, state, witnesses, node=core.node, source=src.spec)
        finally:
            core.close()
    assert src.target is not None
    with FeedClient(src.target) as client:
        state = signed_state(src.key, client.info(src.key).state, src.spec)

        def longer(length: int) -> Any:
            return client.info(src.key, consistency_from=length)

        return state, check_witnesses(src.key, state, witnesses, longer=longer, source=src.spec)


def provenance(agreed: Mapping[str, Sequence[Agreed]]) -> str:
    """The sink's `witnesses` option: {feed key hex: [{witness, length, tree_hash}]}, as JSON."""
    return json.dumps(
        {
            key: [{"witness": a.witness, "length": a.state.length, "tree_hash": a.state.tree_hash.hex()} for a in ws]
            for key, ws in agreed.items()
        },
        sort_keys=True,
    )
