"""Every code block of the docs (README.md and every page under docs/) runs as written, in order, as a
reader following the page would.

Each page is its own reader: its blocks run in one shell session (tests/readme_blocks.py) in a fresh
directory that holds only a link to the project's `.venv` (a reader runs them from a clone, with the
venv activated); `data/` stays relative. So a page stands on its own: what it uses, it makes (a page
that needs a feed creates one first), and no page depends on another having run. The only changes to
what a reader pastes: the page's fixed loopback ports become free ones, and /tmp/ becomes the test's
directory. Shell blocks (`sh`) run with `set -euo pipefail`; Python blocks (`python`) each run as a
script, so each must stand on its own. A block that only shows something is marked on its page: a
`text` or `console` block (output, a file tree), or a `<!-- not run: why -->` line above the fence;
the test prints what it did not run and why. Any other block, or an unmarked block with another info
string, fails the test.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from pathlib import Path

import pytest

from .readme_blocks import LOOPBACK_PORT, RUNS, SHOWN, Block, Outcome, Session, blocks, substitute

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose blocks run: the README and every page of the docs site (mkdocs.yml's docs_dir)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: the virtualenv running the tests (`.venv`, or tools/run's $FEEDLOG_VENV): the reader's `.venv`
VENV = Path(sys.prefix)
#: one block may take this long (the Spark section's, five Spark jobs, took 196 s at load 12 on 2 cores)
BLOCK_TIMEOUT_S = float(os.environ.get("FEEDLOG_README_BLOCK_TIMEOUT", "480"))
#: one page: blocks not started by then are reported as not reached
TOTAL_TIMEOUT_S = 1500.0


#: where the kernel picks ports for outgoing connections and for bind(0) (Linux's default range)
EPHEMERAL = range(32768, 61000)


def _ephemeral() -> range:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return EPHEMERAL


def _free_port(taken: set[int], rng: random.Random) -> int:
    """A free loopback port below the kernel's ephemeral range. A page's servers start up to two
    minutes after their ports are chosen, and meanwhile any process on the machine (the suite's
    other workers: gRPC clients, Spark, bind(0) in other tests) may be given an ephemeral port: one
    of them once took peer B's port, which then failed with "the port is in use"."""
    below = _ephemeral().start
    for _ in range(200):
        port = rng.randrange(20_000, below) if below > 21_000 else 0
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            got = int(s.getsockname()[1])
        if got not in taken:
            taken.add(got)
            return got
    raise RuntimeError("no free loopback port below the ephemeral range after 200 tries")


def test_blocks_parse_with_markers() -> None:
    """The parser finds fences, indented ones included, and the marker on the line above."""
    md = "a\n<!-- not run: needs a cluster -->\n```sh\nx\n```\n\n- item\n\n  ```python\n  y = 1\n  ```\n"
    got = blocks(md)
    assert [(b.line, b.lang, b.text, b.not_run) for b in got] == [
        (3, "sh", "x\n", "needs a cluster"),
        (9, "python", "y = 1\n", None),
    ]
    assert blocks(md, "docs/x.md")[1].where == "docs/x.md:9 (python)"
    with pytest.raises(ValueError, match=r"docs/x\.md:1: a code fence is never closed"):
        blocks("```sh\nx\n", "docs/x.md")


def test_substitute_only_ports_and_tmp(tmp_path: Path) -> None:
    text = "serve --listen 127.0.0.1:7000 -p 7000 /tmp/walk 17000 7000.5 grpc://h:70001"
    got = substitute(text, {"7000": 40001}, tmp_path)
    assert got == f"serve --listen 127.0.0.1:40001 -p 40001 {tmp_path}/walk 17000 7000.5 grpc://h:70001"


def test_session_is_one_terminal(tmp_path: Path) -> None:
    """Variables (exported or not) and the directory carry from block to block; a failing command
    fails its block (set -euo pipefail); a server left in the background is stopped at the end."""
    (tmp_path / "w").mkdir()
    session = Session(tmp_path / "w", tmp_path / "state", {"PATH": os.environ["PATH"]})

    def run(text: str, lang: str = "sh") -> Outcome:
        return session.run(Block(1, lang, text, None), text, timeout=60)

    try:
        assert run("A=1; export B=2; mkdir sub; cd sub; sleep 600 & echo $! > ../pid\n").code == 0
        ok = run('echo "$A $B $(basename "$PWD")"\n')
        assert (ok.code, ok.output) == (0, "1 2 sub\n")
        assert run("false | true\necho not reached\n").code == 1  # pipefail
        assert run("echo $UNSET\n").code == 1  # nounset
        assert run("import os; print(os.getcwd())\n", "python").output.strip() == str(tmp_path / "w" / "sub")
        pid = int((tmp_path / "w" / "pid").read_text())
        os.kill(pid, 0)  # still running between blocks
    finally:
        session.stop_all()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _runs(page: Path) -> bool:
    """Whether a page has a block to run (a page of prose alone, or of shown blocks, has nothing to test)."""
    return any(b.lang in RUNS and not b.not_run for b in blocks(page.read_text(), _name(page)))


#: the pages the slow test below runs, one reader each
RUNNABLE = [p for p in PAGES if _runs(p)]


def test_the_pages_are_the_readme_and_the_docs_site() -> None:
    names = [_name(p) for p in PAGES]
    assert names[0] == "README.md" and "docs/index.md" in names, names
    assert RUNNABLE[0] == PAGES[0], "the README's tour runs"


def test_every_block_is_marked_or_runs() -> None:
    """A fence without a known info string is a block nobody decided about: run it or mark it."""
    unknown = [
        b.where
        for page in PAGES
        for b in blocks(page.read_text(), _name(page))
        if b.lang not in RUNS and b.lang not in SHOWN and not b.not_run
    ]
    assert not unknown, f"blocks that neither run (```sh / ```python) nor say why not: {unknown}"


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_docs_run_as_written(page: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    markdown = page.read_text()
    taken: set[int] = set()
    rng = random.Random()
    ports = {p: _free_port(taken, rng) for p in sorted(set(LOOPBACK_PORT.findall(markdown)))}
    work = tmp_path / "clone"
    work.mkdir()
    (work / ".venv").symlink_to(VENV)  # a reader's clone after `tools/run` set it up
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FEEDLOG_", "PYSPARK_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    session = Session(work, tmp_path / "session", env)
    ran: list[Outcome] = []
    skipped: list[tuple[str, str]] = []
    unreached: list[str] = []
    deadline = time.monotonic() + TOTAL_TIMEOUT_S
    try:
        for b in blocks(markdown, _name(page)):
            if b.not_run or b.lang in SHOWN:
                skipped.append((b.where, b.not_run or f"shown, not run ({b.lang})"))
            elif b.lang not in RUNS:
                ran.append(Outcome(b, -1, "unmarked block with an unknown info string", 0.0))
            elif time.monotonic() > deadline:
                unreached.append(b.where)
            else:
                ran.append(session.run(b, substitute(b.text, ports, tmp_path), BLOCK_TIMEOUT_S))
    finally:
        session.stop_all()
    failed = [o for o in ran if o.code != 0]
    with capsys.disabled():
        print(f"\n{_name(page)}: ran {len(ran)} blocks ({len(failed)} failed), did not run {len(skipped)}:")
        for where, why in skipped:
            print(f"  not run: {where}: {why}")
        for o in ran:
            print(f"  {o.seconds:6.1f}s {o.block.where}: " + ("ok" if o.code == 0 else f"FAILED ({o.code})"))
    report = [
        f"{o.block.where} "
        + ("timed out" if o.code is None else f"exited {o.code}")
        + f" after {o.seconds:.0f}s:\n{o.block.text}--- output (last 3000 chars):\n{o.output[-3000:]}"
        for o in failed
    ]
    assert not failed and not unreached, "\n\n".join(report) + (f"\nnot reached: {unreached}" if unreached else "")
