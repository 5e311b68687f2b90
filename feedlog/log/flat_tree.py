"""Flat-tree indexing (hypercore's `flat-tree`): a binary tree laid out in order.

Block i is node 2i; a node at depth d with offset o (its position among nodes
of depth d) has index (o << (d + 1)) + (1 << d) - 1. Pure integer math.
"""

from __future__ import annotations


def index(depth: int, offset: int) -> int:
    return (offset << (depth + 1)) + (1 << depth) - 1


def depth(i: int) -> int:
    """Number of trailing one bits: leaves (even indices) have depth 0."""
    return ((i + 1) & -(i + 1)).bit_length() - 1


def offset(i: int) -> int:
    return i >> (depth(i) + 1)


def parent(i: int) -> int:
    d = depth(i)
    return index(d + 1, offset(i) >> 1)


def sibling(i: int) -> int:
    d = depth(i)
    return index(d, offset(i) ^ 1)


def span(i: int) -> tuple[int, int]:
    """First and last leaf *node* index covered by node i."""
    d = depth(i)
    if d == 0:
        return i, i
    o = offset(i)
    return o << (d + 1), ((o + 1) << (d + 1)) - 2


def children(i: int) -> tuple[int, int] | None:
    d = depth(i)
    if d == 0:
        return None
    o = offset(i)
    return index(d - 1, o * 2), index(d - 1, o * 2 + 1)


def full_roots(length: int) -> list[int]:
    """Indices of the roots of the full subtrees covering blocks [0, length), left to right."""
    if length < 0:
        raise ValueError("length must be >= 0")
    roots: list[int] = []
    start = 0  # first block covered by the next root
    remaining = length
    while remaining:
        factor = 1 << (remaining.bit_length() - 1)  # largest power of two <= remaining
        roots.append(2 * start + factor - 1)
        start += factor
        remaining -= factor
    return roots


def leaves_under(i: int) -> int:
    """Number of blocks under node i."""
    return 1 << depth(i)
