"""The console over HTTP, without a browser: what every response carries, what it refuses, that
strangers' text comes out inert, and that each page says what the CLI's --json says."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.console import reads

from .conftest import BIDI_KEY, HOSTILE_KEY, HOSTILE_VALUE, Console, World, cli_json


def text(body: bytes) -> str:
    return body.decode("utf-8")


def test_every_answer_has_the_security_headers_and_only_get_and_head_are_served(console: Console) -> None:
    for path in ("/feeds", "/feeds/0", "/tables/0", "/feeds/0/entries/1/proof.json", "/static/console.css", "/nope"):
        status, headers, _ = console.get(path)
        assert status in (200, 404), path
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        status, headers, _ = console.get("/feeds/0", method=method)
        assert status == 405 and headers["allow"] == "GET, HEAD", method
    status, headers, body = console.get("/feeds", method="HEAD")
    assert status == 200 and body == b""


def test_no_path_from_the_url_reaches_the_filesystem(console: Console) -> None:
    # feeds and tables are addressed by their index in the configured set; anything else is not found
    for path in ("/feeds/7", "/tables/3", "/feeds/..%2F..%2Fetc%2Fpasswd", "/static/..%2F..%2Fcatalog.py", "/feeds/-1"):
        status, _, body = console.get(path)
        assert status == 404, path
        assert b"root:" not in body and b"import" not in body


def test_strangers_text_is_escaped_and_made_visible(console: Console) -> None:
    status, _, body = console.get("/feeds/0?before=5")
    page = text(body)
    assert status == 200
    assert HOSTILE_KEY not in page and 'onmouseover="window' not in page and "<img src=x" not in page
    assert html.escape(HOSTILE_KEY, quote=True) in page  # shown, as text
    assert "\u202e" not in page and "invoice\\u202egpj.exe" in page  # the bidi override is a visible escape
    assert "\x1b" not in page and "\x07" not in page and "\x00" not in page
    # the key-history form and links carry the key URL-encoded, and the page for it escapes it too
    status, _, body = console.get("/feeds/0/keys?key=" + __import__("urllib.parse").parse.quote(BIDI_KEY))
    assert status == 200 and "\u202e" not in text(body) and "invoice\\u202egpj.exe" in text(body)


def test_feed_page_agrees_with_cat_json_and_pages_with_a_hard_cap(
    console: Console, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = cli_json(capsys, "cat", str(world.feed))
    assert isinstance(rows, list)
    status, _, body = console.get("/feeds/0?size=1000000")
    assert status == 200
    page = text(body)
    seqs = [int(s) for s in __import__("re").findall(r'data-seq="(\d+)"', page)]
    assert len(seqs) == min(len(rows), reads.MAX_PAGE)  # asked for a million: the cap
    assert seqs == sorted((r["seq"] for r in rows), reverse=True)[: len(seqs)]  # newest first
    by_seq = {r["seq"]: r for r in rows}
    cleared = [s for s, r in by_seq.items() if r.get("cleared")]
    assert cleared, "the forget entry cleared the earlier payload"
    for s in cleared:
        assert f'<tr class="entry cleared" data-seq="{s}">' in page
    forget = next(s for s, r in by_seq.items() if r.get("forget"))
    assert "forget: earlier entries of this key cleared" in page.split(f'data-seq="{forget}"')[1].split("</tr>")[0]
    # paging: the default page, then older ones until seq 1, every seq once
    seen: list[int] = []
    path = "/feeds/0"
    for _ in range(20):
        page = text(console.get(path)[2])
        seen += [int(s) for s in __import__("re").findall(r'data-seq="(\d+)"', page)]
        older = __import__("re").search(r'href="(/feeds/0\?before=\d+&amp;size=\d+)" id="older"', page)
        if older is None:
            break
        path = html.unescape(older.group(1))
    assert seen == sorted(by_seq, reverse=True)


def test_feeds_page_agrees_with_info_json(console: Console, world: World, capsys: pytest.CaptureFixture[str]) -> None:
    info = cli_json(capsys, "info", str(world.feed))
    peer_info = cli_json(capsys, "info", world.peer_url)
    assert isinstance(info, dict) and isinstance(peer_info, dict)
    page = text(console.get("/feeds")[2])
    for i in (info, peer_info):
        row = page.split(f'data-key="{i["key"]}"')[1].split("</tr>")[0]
        assert f'<td class="num length">{i["length"]:,}</td>' in row
        assert "verif" in row
    assert "truncate:1m" in page.split(f'data-key="{info["key"]}"')[1].split("</tr>")[0]


def test_the_downloaded_proof_checks_with_feedlog_alone(
    console: Console, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = (world.feed / "key").read_bytes().hex()
    status, headers, body = console.get("/feeds/0/entries/1/proof.json")
    assert status == 200 and headers["content-type"] == "application/json"
    assert headers["content-disposition"].startswith("attachment;")
    f = tmp_path / "proof.json"
    f.write_bytes(body)
    checked = cli_json(capsys, "check-proof", str(f), "--key", key)
    assert isinstance(checked, dict) and checked["ok"] and checked["seq"] == 1
    assert checked["entry"]["key"] == HOSTILE_KEY and bytes.fromhex(checked["entry"]["value"]).decode() == HOSTILE_VALUE
    # the same document `feedlog prove` writes
    capsys.readouterr()
    assert main(["prove", str(world.feed), "1"]) == 0
    assert json.loads(body) == json.loads(capsys.readouterr().out)
    # a changed block, or another key, is refused (exit 5: corruption or bad signature)
    doc = json.loads(body)
    doc["block"] = doc["block"][:-2] + ("00" if doc["block"][-2:] != "00" else "01")
    f.write_text(json.dumps(doc))
    assert main(["check-proof", str(f), "--key", key]) == 5
    f.write_bytes(body)
    assert main(["check-proof", str(f), "--key", "ab" * 32]) == 5
    # a cleared entry has no block to prove: said so, not a crash
    status, _, body = console.get("/feeds/0/entries/5/proof.json")
    assert status == 404 and b"cleared" in body


def test_peer_feed_pages_read_verified_entries(
    console: Console, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = cli_json(capsys, "cat", str(world.peer_feed))
    assert isinstance(rows, list)
    page = text(console.get("/feeds/1?size=10")[2])
    assert [int(s) for s in __import__("re").findall(r'data-seq="(\d+)"', page)] == list(range(30, 20, -1))
    assert "v29" in page and "signed length verified with the key" in page
    status, _, body = console.get("/feeds/1/keys?key=/s/3")
    assert status == 200 and b"v3<" in body


def test_table_pages_agree_with_table_history_json_and_the_audit_writes_nothing(
    console: Console, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    history = cli_json(capsys, "table", "history", str(world.table))
    assert isinstance(history, list)
    page = text(console.get("/tables/0")[2])
    versions = [int(v) for v in __import__("re").findall(r'data-version="(\d+)"', page)]
    assert versions == [h["version"] for h in history]
    for h in history:
        row = page.split(f'data-version="{h["version"]}"')[1].split("</tr>")[0]
        from feedlog.console.pages import iso

        assert iso(h["timestamp"]) in row and html.escape(h["operation"]) in row
        assert ("in-commit" in row) == (h["in_commit_timestamp"] is not None)
    key = (world.feed / "key").read_bytes().hex()
    assert f"{key[:16]}…</code> seqs 1..{67}" in page  # the feed range version 1 landed (commitInfo.feedlog)
    assert "last checkpoint" in page and "vacuum horizon" in page
    # one commit
    status, _, body = console.get("/tables/0/commits/1")
    assert status == 200 and b'id="commit-version">1<' in body and b"WRITE" in body

    def files() -> dict[str, tuple[int, int]]:
        out = {}
        for d, _dirs, names in os.walk(world.table):
            for n in names:
                st = os.stat(os.path.join(d, n))
                out[os.path.join(d, n)] = (st.st_size, st.st_mtime_ns)
        return out

    before = files()
    audit = cli_json(capsys, "audit", str(world.table))
    assert isinstance(audit, dict)
    status, _, body = console.get("/tables/0/audit")
    assert status == 200 and ("verified" in text(body)) == audit["ok"] and audit["ok"]
    assert files() == before  # on demand by a GET: nothing written


def test_beyond_loopback_needs_tls_and_a_token(world: World, tmp_path: Path) -> None:
    import subprocess
    import sys

    from .conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FEEDLOG_CONSOLE_TOKEN", None)
    base = [sys.executable, "-m", "feedlog", "console", "--data", str(world.feed)]
    p = subprocess.run([*base, "--listen", "0.0.0.0:0"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "TLS" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(
        [*base, "--listen", "0.0.0.0:0", "--insecure"], capture_output=True, text=True, env=env, timeout=60
    )
    assert p.returncode == 2 and "token" in p.stderr and "Traceback" not in p.stderr


def test_a_token_is_asked_for_and_checked(world: World, tmp_path: Path) -> None:
    import base64

    token = "console-token-0123456789"
    c = Console(["--data", str(world.feed)], env={"FEEDLOG_CONSOLE_TOKEN": token})
    try:
        status, headers, _ = c.get("/feeds")
        assert status == 401 and headers["www-authenticate"].startswith("Basic")
        bad = base64.b64encode(b"x:wrong-token-0123456789").decode()
        assert c.get("/feeds", headers={"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(f"anyone:{token}".encode()).decode()
        assert c.get("/feeds", headers={"Authorization": f"Basic {good}"})[0] == 200
        assert c.get("/feeds", headers={"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        c.close()
