"""The console's rules as pure functions: what a stranger's text becomes, and which tokens pass."""

from __future__ import annotations

import base64
import hashlib

from feedlog.console.pages import authorized, presented_token, shown
from feedlog.console.reads import MAX_PAGE, page_size


def test_shown_makes_controls_and_bidi_visible_and_elides_long_text() -> None:
    assert shown("a\u202eb\u2066c\x1b[31m\nd") == "a\\u202eb\\u2066c\\x1b[31m\\nd"
    assert shown(None) == ""
    long = shown("x" * 1000, 10)
    assert long.startswith("x" * 10 + "…") and "1,000 characters" in long


def test_tokens_bearer_or_basic_password_compared_by_digest() -> None:
    token = "t" * 20
    hashes = [hashlib.sha256(token.encode()).digest()]
    basic = base64.b64encode(f"anyone:{token}".encode()).decode()
    assert presented_token(f"Bearer {token}") == token and presented_token(f"Basic {basic}") == token
    assert authorized(hashes, f"Bearer {token}") and authorized(hashes, f"basic {basic}")
    for bad in (
        None,
        "",
        "Bearer",
        f"Bearer {token}x",
        "Basic !!!",
        "Basic " + base64.b64encode(token.encode()).decode(),
    ):
        assert not authorized(hashes, bad)


def test_page_sizes_are_capped() -> None:
    assert page_size(None) == 25 and page_size(0) == 1 and page_size(10**9) == MAX_PAGE
