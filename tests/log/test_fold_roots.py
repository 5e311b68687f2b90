"""`merkle.fold_roots` and `merkle.leaf_hashes` (a reader's batch fold) against the node-per-block reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.log import merkle
from feedlog.log.crypto import leaf_hash


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=70),
    st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=1024, max_size=1100)), max_size=70),
)
def test_fold_roots_gives_the_roots_append_nodes_gives(before: list[bytes], batch: list[bytes]) -> None:
    _, roots = merkle.append_leaves([], 0, before)
    sizes = [len(b) for b in batch]
    hashes = merkle.leaf_hashes(batch, sizes)
    assert hashes == [leaf_hash(b) for b in batch]  # small and large blocks alike
    want = merkle.append_leaves(roots, len(before), batch)[1]
    assert merkle.fold_roots(roots, len(before), hashes, sizes) == want
