"""The console's heavy pages (a feed's activity, a key's history, a table's audit) are computed a few
at a time, and the activity holds no values: review found up to 40 threads each holding up to 1M
rows with their values. A real console in process (uvicorn on loopback), so a test can hold a gate."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from feedlog.console import catalog as catalog_mod
from feedlog.console import reads
from feedlog.console.pages import create_app
from feedlog.console.serve import bind
from feedlog.errors import InvalidArgument, ResourceExhausted
from feedlog.lake import insight
from feedlog.lake.feeds import parse_sources
from tests.conftest import wait_until

from .conftest import World


@pytest.fixture(scope="module")
def base(world: World) -> Iterator[str]:
    import uvicorn

    cat = catalog_mod.build([str(world.feed)], [world.peer_url], [str(world.table)])
    sock = bind("127.0.0.1:0")
    server = uvicorn.Server(uvicorn.Config(create_app(cat), lifespan="off", log_level="warning", access_log=False))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        wait_until(lambda: server.started, what="the console")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


def get(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


def test_one_audit_at_a_time_and_the_next_is_told_when_to_retry(base: str) -> None:
    with reads.AUDIT():  # an audit in progress
        status, headers, body = get(base + "/tables/0/audit")
        assert status == 503 and headers["retry-after"] == "2" and "busy" in body
        assert get(base + "/tables/0")[0] == 200  # the light pages are not held up
    assert get(base + "/tables/0/audit")[0] == 200


def test_heavy_pages_beyond_the_gate_get_503_and_the_feed_page_still_shows_its_entries(base: str) -> None:
    with reads.HEAVY(), reads.HEAVY():  # the gate's room, all taken
        for path in ("/feeds/0/activity.svg", "/feeds/0/keys?key=" + quote("/cfg/mode"), "/feeds/1/keys?key=/s/3"):
            status, headers, _ = get(base + path)
            assert status == 503 and headers["retry-after"] == "2", path
        status, _, body = get(base + "/feeds/0")
        assert status == 200 and "No activity" in body and "busy" in body and "/reading/59" in body
        with pytest.raises(ResourceExhausted, match="busy"):
            reads.HEAVY().__enter__()
    for path in ("/feeds/0/activity.svg", "/feeds/0/keys?key=" + quote("/cfg/mode"), "/feeds/1/keys?key=/s/3"):
        assert get(base + path)[0] == 200, path


def test_the_activity_is_read_without_values_within_a_byte_budget(
    base: str, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = parse_sources(str(world.feed))
    full, policies = insight.read_feeds(sources)
    lean, lean_policies = insight.read_feeds(sources, columns=reads.ACTIVITY_COLUMNS, max_bytes=1 << 20)
    assert "value" in full.column_names and "value" not in lean.column_names
    assert lean.num_rows == full.num_rows and lean_policies == policies
    now = 1_900_000_000_000
    assert insight.activity(lean, 60_000, policies, now) == insight.activity(full, 60_000, policies, now)
    assert insight.recent(lean, policies, now) == insight.recent(full, policies, now)
    # beyond the budget: one line that says where to go instead, not the rows
    with pytest.raises(InvalidArgument, match="bytes of rows"):
        insight.read_feeds(sources, columns=reads.ACTIVITY_COLUMNS, max_bytes=100)
    monkeypatch.setattr(reads, "MAX_ACTIVITY_BYTES", 100)
    monkeypatch.setattr(reads, "ROWS", reads._Rows())
    status, _, body = get(base + "/feeds/0/activity.svg")
    assert status == 400 and "bytes of rows" in body


def test_the_kept_rows_are_bounded_in_bytes(world: World) -> None:
    cat = catalog_mod.build([str(world.feed)], [world.peer_url])
    kept = reads._Rows(keep=4, max_bytes=1)  # room for one feed's rows at most
    for ref in cat.feeds:
        kept.get(ref)
    assert len(kept._kept) == 1
