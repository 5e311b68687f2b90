"""The console in a real browser: Debian's chromium, headless, driven by selenium through Debian's
chromedriver (never a browser or driver downloaded by selenium-manager: SE_OFFLINE=1 and the
driver's path given). Loads every page against real servers on loopback, clicks feed -> entry ->
proof and table -> commit, checks what the page says against the CLI's --json, checks that no
script ran for hostile data (and that it shows as text), and saves a screenshot of each page to
$FEEDLOG_SCREENSHOTS (default: the test's temporary directory)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import BIDI_KEY, HOSTILE_KEY, HOSTILE_VALUE, Console, World, cli_json

CHROMIUM = os.environ.get("FEEDLOG_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FEEDLOG_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'feedlog[dev]')"
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"no browser: {path} is missing (apt-get install {pkg}; .ci/run installs it where it can)"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must not fetch a browser or a driver
    profile = tempfile.mkdtemp(prefix="feedlog-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for f in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(f)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("FEEDLOG_SCREENSHOTS")
    out = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def shoot(driver: Any, shots: Path, name: str) -> None:
    # the whole page, not the window: the height the document needs (bounded)
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), 4000)
    driver.set_window_size(1280, max(height, 600))
    path = shots / f"{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 1000
    driver.set_window_size(1280, 1000)


def no_script_ran(driver: Any) -> None:
    """The hostile values set window.__pwned or open an alert if they ever run."""
    from selenium.common.exceptions import NoAlertPresentException

    assert driver.execute_script("return window.__pwned === undefined")
    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return
    raise AssertionError(f"an alert opened: {alert.text!r}")


def test_click_through_the_console_in_chromium(
    browser: Any, console: Console, world: World, shots: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    info = cli_json(capsys, "info", str(world.feed))
    assert isinstance(info, dict)

    # feeds: one row per feed, the numbers `feedlog info --json` gives
    d.get(console.url + "/")
    assert d.current_url.endswith("/feeds")
    row = d.find_element(By.CSS_SELECTOR, f'tr[data-key="{info["key"]}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.length").text == f"{info['length']:,}"
    assert "truncate:1m" in row.text and "verifies" in row.text
    assert len(d.find_elements(By.CSS_SELECTOR, "tr.feed")) == 2
    no_script_ran(d)
    shoot(d, shots, "feeds")

    # one feed: entries newest first, activity picture loaded (same origin, allowed by the CSP)
    row.find_element(By.CSS_SELECTOR, "a.feed-link").click()
    assert d.find_element(By.ID, "feed-key").text == info["key"]
    img = d.find_element(By.ID, "activity")
    assert d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
    cat = cli_json(capsys, "cat", str(world.feed))
    assert isinstance(cat, list)
    shown = [int(r.get_attribute("data-seq")) for r in d.find_elements(By.CSS_SELECTOR, "#entries tr.entry")]
    assert shown == sorted((r["seq"] for r in cat), reverse=True)[: len(shown)]
    shoot(d, shots, "feed")

    # the hostile entries, two pages down: shown as text, nothing ran
    d.find_element(By.ID, "older").click()
    d.find_element(By.ID, "older").click()
    entries = d.find_element(By.ID, "entries").text
    assert HOSTILE_KEY in entries and HOSTILE_VALUE in entries
    assert "invoice\\u202egpj.exe" in entries  # the bidi override made visible, not obeyed
    no_script_ran(d)
    d.execute_script(
        "document.querySelectorAll('#entries bdi')"
        ".forEach(e => e.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})))"
    )
    no_script_ran(d)
    assert not [e for e in d.get_log("browser") if "__pwned" in e.get("message", "")]
    shoot(d, shots, "feed-hostile")

    # an entry, then its proof: a download (not a page); the page offers the command that checks it
    d.find_element(By.CSS_SELECTOR, 'tr[data-seq="1"] a.seq').click()
    assert d.find_element(By.ID, "entry-key").text == HOSTILE_KEY
    assert d.find_element(By.ID, "entry-value").text == HOSTILE_VALUE
    link = d.find_element(By.ID, "proof-link")
    assert link.get_attribute("href").endswith("/feeds/0/entries/1/proof.json")
    no_script_ran(d)
    shoot(d, shots, "entry")
    status, headers, body = console.get("/feeds/0/entries/1/proof.json")
    assert status == 200 and "attachment" in headers["content-disposition"]
    proof = world.tmp / "downloaded-proof.json"
    proof.write_bytes(body)
    checked = cli_json(capsys, "check-proof", str(proof), "--key", info["key"])
    assert isinstance(checked, dict) and checked["ok"] and checked["entry"]["key"] == HOSTILE_KEY

    # a key's history, through the form (no script: a GET form)
    d.get(console.url + "/feeds/0")
    box = d.find_element(By.ID, "key-input")
    box.send_keys("/cfg/mode")
    box.submit()
    history = cli_json(capsys, "history", str(world.feed), "/cfg/mode")
    assert isinstance(history, list)
    rows = [int(r.get_attribute("data-seq")) for r in d.find_elements(By.CSS_SELECTOR, "#history tr.entry")]
    assert rows == sorted((r["seq"] for r in history), reverse=True)
    shoot(d, shots, "key")
    d.get(console.url + "/feeds/0/keys?key=/cfg/secret")
    assert "Forgotten at seq" in d.find_element(By.ID, "forgotten").text
    d.get(console.url + "/feeds/0/keys?key=" + __import__("urllib.parse").parse.quote(BIDI_KEY))
    assert "invoice\\u202egpj.exe" in d.find_element(By.ID, "history-key").text

    # tables -> table -> commit, against `feedlog table history --json`
    table_history = cli_json(capsys, "table", "history", str(world.table))
    assert isinstance(table_history, list)
    d.find_element(By.ID, "nav-tables").click()
    shoot(d, shots, "tables")
    d.find_element(By.CSS_SELECTOR, "a.table-link").click()
    versions = [int(r.get_attribute("data-version")) for r in d.find_elements(By.CSS_SELECTOR, "tr.commit")]
    assert versions == [h["version"] for h in table_history]
    assert d.find_element(By.ID, "table-version").text == str(table_history[0]["version"])
    shoot(d, shots, "table")
    d.find_element(By.CSS_SELECTOR, 'tr[data-version="1"] a.commit-link').click()
    assert d.find_element(By.ID, "commit-version").text == "1"
    assert d.find_element(By.ID, "commit-op").text == table_history[-2]["operation"]
    assert info["key"][:16] in d.find_element(By.ID, "provenance").text
    shoot(d, shots, "commit")

    # the audit, on demand
    d.back()
    d.find_element(By.ID, "audit-link").click()
    assert "verified" in d.find_element(By.ID, "verdict").text
    shoot(d, shots, "audit")
    no_script_ran(d)
