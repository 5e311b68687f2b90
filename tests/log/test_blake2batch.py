"""The compiled batch hasher (`feedlog.log._blake2batch`) against its references: hashlib's BLAKE2b,
and merkle's pure-Python `_leaf_hashes` / `_parent_hashes`, on random inputs."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.errors import Corruption
from feedlog.log import merkle, storage
from feedlog.log.crypto import leaf_hash, parent_hash

native = merkle._native
#: the comparisons need the extension; a machine with no C compiler installs (and tests) without it
needs_native = pytest.mark.skipif(native is None, reason="no C compiler: feedlog.log._blake2batch was not built")


def _can_build() -> bool:
    """A C compiler and Python's headers: what setup.py needs to build the extension."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    headers = Path(sysconfig.get_path("include")) / "Python.h"
    return shutil.which(cc.split()[0]) is not None and headers.is_file()


def test_an_install_with_a_compiler_built_the_extension() -> None:
    """tools/run installs where a C compiler and Python's headers are (as on CI's machine): the suite
    then runs the fast path."""
    if not _can_build():
        pytest.skip("no C compiler or no Python.h here: the hashlib path is the one installed")
    assert native is not None, "feedlog.log._blake2batch did not build although cc and Python.h are here (setup.py)"


def _len_edges() -> list[int]:
    """Lengths around BLAKE2b's 128-byte blocks, with and without a leaf's 9-byte prefix."""
    out = set(range(0, 40))
    for k in range(1, 5):
        for d in (-10, -9, -8, -1, 0, 1):
            out.add(max(0, 128 * k + d))
    return sorted(out)


@needs_native
def test_blake2b_matches_hashlib_at_every_block_edge() -> None:
    assert native is not None
    rng = random.Random(7)
    for n in [*_len_edges(), 1000, 4095, 4096, 4097, 1 << 16, (1 << 20) + 3]:
        data = rng.randbytes(n)
        assert native.blake2b_256(data) == hashlib.blake2b(data, digest_size=32).digest(), n


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.binary(min_size=4090, max_size=4200)), max_size=60))
def test_leaf_hashes_match_the_reference(blocks: list[bytes]) -> None:
    assert native is not None
    sizes = [len(b) for b in blocks]
    got = native.leaf_hashes(blocks, sizes)
    assert got == merkle._leaf_hashes(blocks, sizes) == [leaf_hash(b) for b in blocks]


@needs_native
def test_leaf_hashes_of_many_chunks_and_a_failure_partway() -> None:
    """The C loop takes blocks 256 at a time: several chunks and a ragged last one hash as the
    reference does, and a bad block in a later chunk fails the call, leaving its buffers released."""
    assert native is not None
    rng = random.Random(11)
    blocks = [rng.randbytes(rng.randrange(0, 200)) for _ in range(700)]
    sizes = [len(b) for b in blocks]
    assert native.leaf_hashes(blocks, sizes) == merkle._leaf_hashes(blocks, sizes)
    held = bytearray(b"held")  # a buffer exported while hashed: resizable again once released
    with pytest.raises(TypeError):
        native.leaf_hashes([*blocks[:299], held, 12345, *blocks[301:]], sizes)
    held.extend(b"!")  # BufferError if the failed call had kept it exported


@needs_native
def test_leaf_hashes_take_any_buffer_and_numpy_sizes() -> None:
    assert native is not None
    blocks = [bytes(range(n % 256)) * 3 for n in _len_edges()]
    views = [memoryview(b) for b in blocks]
    sizes = np.array([len(b) for b in blocks], dtype=np.int64)
    want = [leaf_hash(b) for b in blocks]
    assert native.leaf_hashes(views, list(sizes)) == want  # numpy integers, as the audit passes them
    assert native.leaf_hashes(tuple(blocks), sizes.tolist()) == want


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.integers(0, 2**64 - 1)), max_size=80))
def test_parent_hashes_match_the_reference(pairs: list[tuple[bytes, int]]) -> None:
    assert native is not None
    hashes = [h for h, _ in pairs]
    sizes = [s for _, s in pairs][: len(hashes) // 2]
    got = native.parent_hashes(hashes, sizes)
    assert got == merkle._parent_hashes(hashes, sizes)
    assert got == [parent_hash(hashes[2 * i], hashes[2 * i + 1], s) for i, s in enumerate(sizes)]


@needs_native
def test_bad_input_is_refused_not_hashed() -> None:
    assert native is not None
    h = bytes(32)
    with pytest.raises(ValueError, match="32 bytes"):
        native.parent_hashes([h, b"short"], [1])
    with pytest.raises(ValueError, match="two hashes"):
        native.parent_hashes([h], [1])
    with pytest.raises(ValueError, match="differ"):
        native.leaf_hashes([b"a", b"b"], [1])
    with pytest.raises(OverflowError):
        native.leaf_hashes([b"a"], [-1])
    with pytest.raises(TypeError):
        native.leaf_hashes([b"a"], ["1"])
    with pytest.raises(TypeError):
        native.leaf_hashes(["a"], [1])

    blocks = [b"x"] * 10
    hashes = [h] * 10

    class Shrinks:  # a size whose __index__ empties the lists being hashed: an error, never a crash
        def __index__(self) -> int:
            blocks.clear()
            hashes.clear()
            return 1

    with pytest.raises(RuntimeError, match="changed size"):
        native.leaf_hashes(blocks, [Shrinks(), *[1] * 9])
    hashes[:] = [h] * 10
    with pytest.raises(RuntimeError, match="changed size"):
        native.parent_hashes(hashes, [Shrinks()] * 5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=50), max_size=40), st.lists(st.binary(max_size=200), max_size=90))
def test_a_fold_is_the_same_with_and_without_the_extension(before: list[bytes], batch: list[bytes]) -> None:
    _, roots = merkle.append_leaves([], 0, before)
    fast = merkle.fold(roots, len(before), batch)
    saved, merkle._native = merkle._native, None
    try:
        slow = merkle.fold(roots, len(before), batch)
        slow_roots = merkle.fold_roots(
            roots, len(before), merkle.leaf_hashes(batch, [len(b) for b in batch]), [len(b) for b in batch]
        )
    finally:
        merkle._native = saved
    assert fast == slow
    assert fast.roots == slow_roots == merkle.append_leaves(roots, len(before), batch)[1]


@needs_native
def test_a_get_through_the_compiled_read_answers_as_the_python_one(tmp_path: Path) -> None:
    """Core.get's C read from the maps (`mapped_block`) and its Python read give the same blocks,
    the same None for cleared ones, and past the maps fall back to the same pread."""
    from feedlog.log import core as core_module
    from feedlog.log.core import Core
    from feedlog.log.crypto import KeyPair

    assert core_module._mapped_block is not None
    rng = random.Random(3)
    data = [rng.randbytes(rng.choice([0, 1, 50, 119, 120, 4096, 5000, 70_000])) for _ in range(60)]
    with Core.create(tmp_path / "f", KeyPair.generate()) as c:
        for i in range(0, 50, 7):
            c.append(data[i : min(i + 7, 50)])
        c.clear([3, 17, 40])
        reads = {}
        for mapped in (core_module._mapped_block, None):
            saved, core_module._mapped_block = core_module._mapped_block, mapped
            try:
                reads[mapped is None] = [c.get(s) for s in range(c.length)]
            finally:
                core_module._mapped_block = saved
        assert reads[True] == reads[False]
        assert reads[False][3] is None and reads[False][4] == data[4]
        c.append(data[50:])  # past the maps: C says so, the pread path answers
        assert [c.get(s) for s in range(50, 60)] == data[50:]
        off, _n, _ = c._entry(5)
        with open(tmp_path / "f" / storage.LOG, "r+b") as f:  # a block changed on disk: refused, by C too
            f.seek(off)
            f.write(bytes([data[5][0] ^ 1]))
        assert core_module._mapped_block(c._index_words, c._tree_map, c._log_map, 5) == 2
        with pytest.raises(Corruption, match="block 5 fails its hash check"):
            c.get(5)


@needs_native
def test_folds_of_a_growing_tree_are_the_same_in_c_and_python() -> None:
    """Batch after batch (odd and even starts, batches past the C loop's 256-block chunks): the same
    nodes, joins to older roots and roots; roots that are not the tree's at `start` fail alike."""
    rng = random.Random(5)
    roots: list[merkle.Node] = []
    start = 0
    for n in [1, 2, 3, 300, 1, 0, 7, 513, 64, 1000, 5]:
        batch = [rng.randbytes(rng.randrange(0, 150)) for _ in range(n)]
        fast = merkle.fold(roots, start, batch)
        saved, merkle._native = merkle._native, None
        try:
            slow = merkle.fold(roots, start, batch)
        finally:
            merkle._native = saved
        assert fast == slow
        assert all(type(r) is merkle.Node for r in (*fast.roots, *fast.outside))
        roots, start = fast.roots, start + n
    assert native is not None
    with pytest.raises(KeyError):
        native.fold([], 3, [b"x"], [1])  # block 3 joins a root of depth 0 that was not given
    with pytest.raises(ValueError, match="differ"):
        native.fold([], 0, [b"x"], [])
    with pytest.raises(OverflowError):  # never wrapped to a small start
        native.fold([], 2**64 + 5, [b"x"], [1])
    assert native.fold([], np.int64(0), [b"x"], [1]) == native.fold([], 0, [b"x"], [1])

    given = [2, bytes(32), 1]

    class Clears:  # a root's field whose __index__ empties the root: an error or a copy, never a crash
        def __index__(self) -> int:
            given.clear()
            return 0

    given[0] = Clears()  # root 0 (depth 0) of a 1-block tree, which block 1 joins
    _, _, joined = native.fold([given], 1, [b"x"], [1])
    assert joined == [(1, parent_hash(bytes(32), leaf_hash(b"x"), 2), 2)]
