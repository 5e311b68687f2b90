from hypothesis import given
from hypothesis import strategies as st

from feedlog.log import flat_tree as ft


def test_known_indices() -> None:
    # hypercore's flat-tree README picture
    assert [ft.depth(i) for i in range(8)] == [0, 1, 0, 2, 0, 1, 0, 3]
    assert ft.parent(0) == 1 and ft.parent(2) == 1 and ft.parent(1) == 3 and ft.parent(5) == 3
    assert ft.sibling(0) == 2 and ft.sibling(1) == 5 and ft.sibling(4) == 6
    assert ft.children(3) == (1, 5) and ft.children(0) is None
    assert ft.span(3) == (0, 6) and ft.span(4) == (4, 4)


def test_full_roots() -> None:
    assert ft.full_roots(0) == []
    assert ft.full_roots(1) == [0]
    assert ft.full_roots(2) == [1]
    assert ft.full_roots(3) == [1, 4]
    assert ft.full_roots(7) == [3, 9, 12]
    assert ft.full_roots(8) == [7]


@given(st.integers(min_value=1, max_value=1 << 40))
def test_roots_cover_exactly_the_blocks(length: int) -> None:
    roots = ft.full_roots(length)
    covered = 0
    for r in roots:
        lo, hi = ft.span(r)
        assert lo == 2 * covered  # contiguous, left to right
        covered += ft.leaves_under(r)
        assert hi == 2 * (covered - 1)
    assert covered == length


@given(st.integers(min_value=0, max_value=1 << 40))
def test_parent_and_sibling_agree(i: int) -> None:
    p = ft.parent(i)
    kids = ft.children(p)
    assert kids is not None and i in kids and ft.sibling(i) in kids
    assert ft.index(ft.depth(i), ft.offset(i)) == i
