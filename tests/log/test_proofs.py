"""An entry's proof as JSON (feedlog.log.proofs): it round-trips, and a document that is not one is
refused by its shape before any hash is computed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from feedlog.errors import Corruption, InvalidArgument, SignatureError
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import verify_proof
from feedlog.log.proofs import FORMAT, proof_from_json, proof_json


@pytest.fixture
def doc(tmp_path: Path) -> Any:
    feed = Feed.create(tmp_path / "f")
    feed.append([Write(f"/k/{i}", f"v{i}".encode(), False, None, None) for i in range(37)])
    d = proof_json(feed.core.proof(21), feed.key)
    feed.close()
    return json.loads(json.dumps(d))  # through text, as a downloaded file


def test_round_trip_verifies(doc: dict[str, object]) -> None:
    proof, key = proof_from_json(doc)
    assert doc["format"] == FORMAT and proof.seq == 21 and proof_json(proof, key) == doc
    verify_proof(proof, key)


def test_a_changed_byte_anywhere_fails_verification(doc: dict[str, object]) -> None:
    for field in ("block", "path", "roots", "signature", "tree_hash"):
        d = json.loads(json.dumps(doc))
        if field in ("path", "roots"):
            node = d[field][0]
            node["hash"] = ("0" if node["hash"][0] != "0" else "1") + node["hash"][1:]
        elif field in ("signature", "tree_hash"):
            v = d["signed"][field]
            d["signed"][field] = ("0" if v[0] != "0" else "1") + v[1:]
        else:
            d[field] = d[field][:-1] + ("0" if d[field][-1] != "0" else "1")
        proof, key = proof_from_json(d)
        with pytest.raises((Corruption, SignatureError)):
            verify_proof(proof, key)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(format="other/9"),
        lambda d: d.update(seq=-1),
        lambda d: d.update(seq=True),
        lambda d: d.update(key="zz"),
        lambda d: d.update(key="00" * 31),
        lambda d: d.update(path="nope"),
        lambda d: d.update(roots=[{"index": 0}]),
        lambda d: d.update(path=[{"index": 0, "hash": "00", "size": 1}] * 200),
        lambda d: d.update(signed=None),
        lambda d: d["signed"].update(signature="00" * 63),
    ],
)
def test_a_document_of_the_wrong_shape_is_refused(doc: dict[str, object], change) -> None:
    d = json.loads(json.dumps(doc))
    change(d)
    with pytest.raises((Corruption, InvalidArgument)):
        proof_from_json(d)
    with pytest.raises(InvalidArgument):
        proof_from_json([doc])
