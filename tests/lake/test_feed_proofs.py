"""FeedSource.proof: what `feedlog prove` and the console hand out is the proof of the entry asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from feedlog.errors import Corruption
from feedlog.lake.feeds import parse_sources
from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient
from feedlog_server.app import PeerServer


def test_a_peer_answering_with_another_entrys_proof_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with PeerServer(tmp_path / "peer", "127.0.0.1:0") as peer, FeedClient(peer.address, token=peer.token) as c:
        key = c.create(timestamps="exact").key
        c.put(key, [Write(f"/k{i}", b"v") for i in range(5)])
        (source,) = parse_sources(f"grpc://{peer.address}/{key.hex()}")
        assert source.proof(3).seq == 3
        honest = FeedClient.proof

        def lying(self: FeedClient, k: bytes, seq: int) -> Any:  # a validly signed proof, of seq 2
            return honest(self, k, seq - 1)

        monkeypatch.setattr(FeedClient, "proof", lying)
        with pytest.raises(Corruption, match="asked for the proof of seq 3, sent one of seq 2"):
            source.proof(3)
