"""The docs' fenced code blocks (README.md's and every docs/ page's), and a shell session that runs
one page's blocks in order as a reader would.

Pure parsing (`blocks`, `substitute`) apart from running (`Session`). A reader pastes a page's blocks
into one terminal, so the session carries what a terminal carries from one block to the next: shell
variables (exported or not), the working directory and background jobs. Each block runs in a fresh
`bash` with `set -euo pipefail` (a failing command fails its block), its own process group (so
every server it leaves in the background is found and stopped at the end) and its output in a file
(a background server holding a pipe would keep a reader waiting forever).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: info strings of blocks that run; `text` and `console` blocks show output or files and never run
RUNS = {"sh": "sh", "python": "python"}
SHOWN = {"text", "console"}
#: the marker, on the nearest non-blank line above a fence, of a block that is shown but not run
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)```(.*)$")
#: a port a page fixes (a loopback address's); each is replaced by a free one
LOOPBACK_PORT = re.compile(r"\b(?:127\.0\.0\.1|localhost):(\d{2,5})\b")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str  # the info string ("" when none)
    text: str  # dedented by the fence's indentation
    not_run: str | None  # the reason given by a `<!-- not run: ... -->` marker
    page: str = "README.md"  # the page it is on, as a path from the repository's root

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no info string'})"


def blocks(markdown: str, page: str = "README.md") -> list[Block]:
    """Every fenced block of `page`, in order. Raises ValueError on a fence that is never closed."""
    lines = markdown.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        prev = next((s for s in reversed(lines[:i]) if s.strip()), "")
        marker = NOT_RUN.match(prev)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: a code fence is never closed")
        out.append(Block(i + 1, lang, "\n".join(body) + "\n", marker.group(1) if marker else None, page))
        i = j + 1
    return out


def substitute(text: str, ports: Mapping[str, int], tmp: Path) -> str:
    """`text` with a page's fixed ports replaced by free ones and /tmp/ by the test's own
    directory: the only changes the docs test makes to what a reader would paste."""
    for fixed, free in ports.items():
        text = re.sub(rf"(?<![\d.]){fixed}(?!\d|\.\d)", str(free), text)
    return text.replace("/tmp/", f"{tmp}/")


@dataclass(frozen=True)
class Outcome:
    block: Block
    code: int | None  # None: timed out (its process group was killed)
    output: str
    seconds: float


# Run before a block's text: restore the terminal's state, save it again on exit.
_PROLOGUE = """\
__feedlog_initial=$(compgen -v)
cd -- "$(cat {state}/cwd)"
. {state}/vars.sh
__feedlog_save() {{
  set +e
  {{ export -p
    for __feedlog_v in $(comm -13 <(sort <<<"$__feedlog_initial") <(compgen -v | sort)); do
      case $__feedlog_v in __feedlog_*|BASH*|FUNCNAME|PIPESTATUS|_) ;; *) declare -p "$__feedlog_v" ;; esac
    done
  }} > {state}/vars.new 2>/dev/null
  mv {state}/vars.new {state}/vars.sh
  pwd > {state}/cwd
}}
trap __feedlog_save EXIT
set -euo pipefail
"""


class Session:
    """One terminal: blocks run in order in `cwd`, with `env`, sharing variables and directory."""

    def __init__(self, cwd: Path, state: Path, env: Mapping[str, str]) -> None:
        self.state, self.env = state, dict(env)
        state.mkdir(parents=True, exist_ok=True)
        (state / "cwd").write_text(str(cwd))
        (state / "vars.sh").write_text("")
        self.groups: list[int] = []  # every block's process group: its background jobs live there

    def run(self, block: Block, text: str, timeout: float) -> Outcome:
        n = len(self.groups)
        body = text
        if block.lang == "python":  # run by the session's python, in its directory and environment
            script = self.state / f"block-{n:02d}-line{block.line}.py"
            script.write_text(text)
            body = f'python "{script}"\n'
        script = self.state / f"block-{n:02d}-line{block.line}.sh"
        script.write_text(_PROLOGUE.format(state=self.state) + body)
        log = self.state / f"block-{n:02d}-line{block.line}.log"
        start = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group, found again by stop_all
            )
        self.groups.append(proc.pid)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait(timeout=30)
            code = None
        return Outcome(block, code, log.read_text(errors="replace"), time.monotonic() - start)

    def stop_all(self, grace: float = 15.0) -> None:
        """Stop what the blocks left running (servers started with `&`): SIGTERM, then SIGKILL."""
        for pgid in self.groups:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
            time.sleep(0.1)
        for pgid in self.groups:
            _kill_group(pgid)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already, or never ours
        os.killpg(pgid, sig)


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
