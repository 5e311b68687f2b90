"""What the real `feedlog` command prints (issue 19 items 3 and 6): one error form, exit codes from the
table, progress and interruption reports, the header block, plurals, one JSON form, policies.

Every test runs the installed command in a subprocess (`python -m feedlog`), as a user or a script
would; peers and owners are real servers on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from feedlog.log import merkle
from feedlog.log.crypto import Verifier
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import TreeState
from feedlog.version import __version__
from feedlog_server.app import PeerServer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FEEDLOG_PROGRESS_EVERY": "5"}


@contextmanager
def interruptible() -> Iterator[None]:
    """Commands started inside take Ctrl-C as usual even when the suite itself was started with SIGINT
    ignored (a shell's background job, nohup): children inherit an ignored signal and Python leaves it
    ignored, so the command would finish instead of reporting the interruption. A handler, unlike
    SIG_IGN, is reset to the default by exec; set in this (main) thread, not in the child after fork."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def feedlog(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "feedlog", *args],
        capture_output=True,
        text=True,
        env=env or ENV,
        input=stdin,
        timeout=120,
    )


def one_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit `code` and exactly one stderr line in the one error form, holding every needle."""
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("feedlog: error: "), p.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def feed(tmp_path: Path) -> str:
    """A feed with `a` written twice (seqs 1, 2) and `b` once (seq 3)."""
    f = str(tmp_path / "feed")
    with Feed.create(f) as fd:
        fd.append([Write("a", b"1"), Write("a", b"2")])
        fd.put("b", b"3")
    return f


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServer]:
    p = PeerServer(tmp_path / "peer", "127.0.0.1:0").start()
    yield p
    p.stop(grace=1)


# ---- one error form, --version, exit codes ----------------------------------------------------------


def test_version_and_every_error_in_one_form(tmp_path: Path, feed: str) -> None:
    v = feedlog("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"feedlog {__version__}"
    # --help lists every exit code of the table (feedlog.errors.EXIT_CODES), each with its kind
    from feedlog.errors import EXIT_CODES

    help_text = " ".join(feedlog("--help").stdout.split())
    for kind, code in EXIT_CODES:
        assert f" {code} " in help_text, kind
    assert "`feedlog: error: ...`" in help_text and "130 interrupted" in help_text
    # argparse's own usage mistakes, at the top and in a subcommand, and the server's entry point
    one_error(feedlog("nonsense"), 2, "invalid choice", "(see feedlog --help)")
    one_error(
        feedlog("table", "create", str(tmp_path / "t")), 2, "table create: ", "--schema", "feedlog table create --help"
    )
    server = subprocess.run(
        [sys.executable, "-m", "feedlog_server", "--bogus"], capture_output=True, text=True, env=ENV, timeout=120
    )
    one_error(server, 2, "serve: ", "--data", "(see feedlog serve --help)")
    # a key that is not there: the same form (it was `feedlog: 'x' not found`)
    one_error(feedlog("get", feed, "nothing"), 3, "'nothing' not found")


def test_append_from_a_missing_or_broken_file_exits_with_its_kind(tmp_path: Path, feed: str) -> None:
    # a missing input file is NotFound (3), not the unmapped 1
    one_error(feedlog("append", feed, "--jsonl", str(tmp_path / "nosuch.jsonl")), 3, "nosuch.jsonl", "no such file")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"key": "k", "value": "v"}\n{"key": "\xff"}\n')
    one_error(feedlog("append", feed, "--jsonl", str(bad)), 2, "line 2: not UTF-8", "0 entries before it were appended")


# ---- cat: ranges and the header block ---------------------------------------------------------------


def test_cat_refuses_an_empty_or_past_the_end_range(feed: str) -> None:
    one_error(feedlog("cat", feed, "--from", "5", "--to", "2"), 2, "--from 5 --to 2")
    one_error(feedlog("cat", feed, "--from", "-1"), 2, "--from: invalid seq '-1'")
    one_error(feedlog("cat", feed, "--from", "9"), 3, "past the end", "0..3")
    at_end = feedlog("cat", feed, "--from", "4")  # nothing new yet: a poller's normal answer
    assert at_end.returncode == 0 and at_end.stdout == "" and at_end.stderr == ""


def test_cat_from_0_prints_the_header_so_the_signed_tree_can_be_rederived(feed: str) -> None:
    human = feedlog("cat", feed, "--from", "0", "--to", "1")
    assert human.returncode == 0
    first, second = human.stdout.splitlines()
    assert first.startswith("0\t(header: type entry)\t0x") and second.startswith("1\t")
    as_json = [json.loads(x) for x in feedlog("cat", feed, "--from", "0", "--json").stdout.splitlines()]
    assert as_json[0]["seq"] == 0 and as_json[0]["header"] is True and as_json[0]["type"] == "entry"
    assert [r["seq"] for r in as_json] == [0, 1, 2, 3]

    # from the CLI alone: every block's bytes, hashed into the tree the key signed
    raw = feedlog("cat", feed, "--from", "0", "--raw")
    blocks = [bytes.fromhex(line.split("\t")[1]) for line in raw.stdout.splitlines()]
    info = json.loads(feedlog("info", feed, "--json").stdout)
    _created, roots = merkle.append_leaves([], 0, blocks)
    assert len(blocks) == info["length"] == 4
    assert merkle.roots_hash(roots).hex() == info["tree_hash"]
    state = TreeState(info["length"], info["fork"], merkle.roots_hash(roots), bytes.fromhex(info["signature"]))
    assert Verifier(bytes.fromhex(info["key"])).verify(state.signature, state.signable())


# ---- get, plurals, table output ---------------------------------------------------------------------


def test_get_ends_its_line_unless_raw_and_counts_are_plural_right(feed: str) -> None:
    assert feedlog("get", feed, "b").stdout == "3\n"
    assert feedlog("get", feed, "b", "--raw").stdout == "3"
    compact = feedlog("compact", feed, "--overwritten")
    assert compact.returncode == 0 and compact.stdout.startswith("cleared 1 block ("), compact.stdout
    assert "1 blocks" not in compact.stdout
    verify = feedlog("verify", feed)
    assert verify.stdout.startswith("ok: 4 blocks (") and "1 cleared" in verify.stdout


def test_json_is_one_compact_line_per_document(feed: str) -> None:
    for args in (["info", feed], ["history", feed, "a"], ["cat", feed], ["verify", feed], ["get", feed, "a"]):
        out = feedlog(*args, "--json").stdout
        for line in out.splitlines():
            doc = json.loads(line)
            assert line == json.dumps(doc, separators=(",", ":")), (args, line)


def test_table_history_and_info_are_plain_text(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    assert (
        feedlog("table", "create", table, "--schema", "id:long", "--owner", str(tmp_path / "owner.db")).returncode == 0
    )
    history = feedlog("table", "history", table).stdout
    assert "(ict)" in history and "(ict )" not in history
    info = feedlog("table", "info", table).stdout
    owner = next(line for line in info.splitlines() if line.startswith("owner"))
    assert owner.split(None, 1)[1] == f"db={tmp_path / 'owner.db'}", owner


def test_a_refused_table_create_leaves_nothing(tmp_path: Path) -> None:
    from feedlog_server.owner import OwnerServer

    # an owner that does not answer: refused before anything is written
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    table = tmp_path / "t"
    one_error(feedlog("table", "create", str(table), "--schema", "id:long", "--owner", f"grpc://127.0.0.1:{port}"), 8)
    assert not table.exists()
    # an owner that refuses the table (outside its roots): what the attempt wrote is removed
    (tmp_path / "elsewhere").mkdir()
    owner = OwnerServer(str(tmp_path / "o.db"), "127.0.0.1:0", roots=[str(tmp_path / "elsewhere")]).start()
    try:
        table.mkdir()  # a directory the user made stays, empty again
        refused = feedlog("table", "create", str(table), "--schema", "id:long", "--owner", owner.endpoint)
        assert refused.returncode not in (0, 8) and refused.stderr.startswith("feedlog: error: "), refused.stderr
        assert table.is_dir() and list(table.iterdir()) == []
    finally:
        owner.stop()


# ---- timestamp policies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "shown"), [("truncate:7s", "truncate:7s"), ("truncate:60s", "truncate:1m"), ("fuzz:30s", "fuzz:30s")]
)
def test_a_policy_is_any_whole_number_of_a_unit_shown_canonically(tmp_path: Path, given: str, shown: str) -> None:
    created = feedlog("create", str(tmp_path / "f"), "--timestamps", given, "--json")
    assert created.returncode == 0 and json.loads(created.stdout)["timestamps"] == shown


@pytest.mark.parametrize(
    "bad", ["FUZZ:30s", "Truncate:1s", "fuzz:0s", "truncate:1ms", "truncate: 1s", "fuzz:30S", "1s"]
)
def test_a_policy_in_any_other_form_is_refused_with_the_form(tmp_path: Path, bad: str) -> None:
    one_error(feedlog("create", str(tmp_path / "f"), "--timestamps", bad), 2, "truncate:<n><unit>", "s, m, h or d")
    assert not (tmp_path / "f").exists()


# ---- peers: the policy a clone carries, push after compact, a busy port ----------------------------


def test_a_clone_and_info_on_the_peer_show_the_writers_policy(peer: PeerServer, tmp_path: Path) -> None:
    url = f"grpc://{peer.address}"
    auth = ("--token-file", str(peer.token_file))
    created = feedlog("create", url, "--timestamps", "fuzz:30s", "--ttl", "7d", "--json", *auth)
    key = json.loads(created.stdout)["key"]
    assert feedlog("put", f"{url}/{key}", "k", "v", *auth).returncode == 0
    remote = json.loads(feedlog("info", f"{url}/{key}", "--json").stdout)
    assert remote["timestamps"] == "fuzz:30s" and remote["ttl"] == "7d"
    assert "fuzz:30s" in feedlog("info", f"{url}/{key}").stdout
    cloned = feedlog("clone", f"{url}/{key}", str(tmp_path / "copy"), env={**ENV, "FEEDLOG_PROGRESS_EVERY": "0"})
    assert cloned.returncode == 0 and cloned.stdout == f"cloned 2 blocks into {tmp_path / 'copy'}\n"
    assert cloned.stderr.startswith("feedlog: clone: 2 of 2 blocks (100%), "), cloned.stderr
    local = json.loads(feedlog("info", str(tmp_path / "copy"), "--json").stdout)
    assert local["timestamps"] == "fuzz:30s" and local["ttl"] == "7d" and local["writable"] is False


def test_a_pushed_feed_keeps_its_policy_and_clones_and_followers_learn_it(peer: PeerServer, tmp_path: Path) -> None:
    from feedlog.errors import NotFound
    from feedlog.replication.client import FeedClient
    from feedlog.rpc import Address

    mine = str(tmp_path / "mine")
    assert feedlog("create", mine, "--timestamps", "truncate:1h", "--ttl", "2d").returncode == 0
    assert feedlog("put", mine, "k", "v").returncode == 0
    url = f"grpc://{peer.address}"
    assert feedlog("push", mine, url, "--token-file", str(peer.token_file)).returncode == 0
    key = json.loads(feedlog("info", mine, "--json").stdout)["key"]
    remote = json.loads(feedlog("info", f"{url}/{key}", "--json").stdout)
    assert (remote["length"], remote["timestamps"], remote["ttl"]) == (2, "truncate:1h", "2d")  # not truncate:1s
    assert feedlog("clone", f"{url}/{key}", str(tmp_path / "copy")).returncode == 0
    assert json.loads(feedlog("info", str(tmp_path / "copy"), "--json").stdout)["timestamps"] == "truncate:1h"

    # a following peer learns them from its upstream as the clone did (the peer only reports them)
    follower = PeerServer(tmp_path / "b", "127.0.0.1:0", follow=[Address.parse(f"{url}/{key}", need_feed=True)]).start()
    try:
        with FeedClient(follower.address) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.info(bytes.fromhex(key)).state.length == 2:
                        break
                except NotFound:  # not created yet
                    pass
                time.sleep(0.1)
        followed = json.loads(feedlog("info", f"grpc://{follower.address}/{key}", "--json").stdout)
        assert (followed["length"], followed["timestamps"], followed["ttl"]) == (2, "truncate:1h", "2d")
    finally:
        follower.stop(grace=1)


def test_a_replica_never_told_the_writers_policy_shows_none(tmp_path: Path) -> None:
    from feedlog.log.crypto import KeyPair
    from feedlog.log.feed import Feed

    Feed.create_replica(tmp_path / "r", KeyPair.generate().public_key).close()  # as from a peer that knows none
    assert "timestamps      -" in feedlog("info", str(tmp_path / "r")).stdout
    shown = json.loads(feedlog("info", str(tmp_path / "r"), "--json").stdout)
    assert shown["timestamps"] is None and shown["ttl"] is None


def test_push_after_compact_names_the_cleared_block_and_leaves_nothing_on_the_peer(peer: PeerServer, feed: str) -> None:
    url = f"grpc://{peer.address}"
    assert feedlog("compact", feed, "--overwritten").returncode == 0  # clears seq 1 (a, overwritten)
    pushed = feedlog("push", feed, url, "--token-file", str(peer.token_file))
    one_error(pushed, 2, "block 1 was cleared", "nothing was sent", "Push a feed before compacting it")
    key = json.loads(feedlog("info", feed, "--json").stdout)["key"]
    one_error(feedlog("info", f"{url}/{key}"), 3, "does not host")  # not even the header


def busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_a_busy_port_is_one_clean_line(tmp_path: Path) -> None:
    holder, port = busy_port()
    with holder:
        for args in (
            ["serve", "--data", str(tmp_path / "d"), "--listen", f"127.0.0.1:{port}"],
            ["owner", "serve", "--db", str(tmp_path / "o.db"), "--listen", f"127.0.0.1:{port}"],
        ):
            p = feedlog(*args)
            # no gRPC log line (`E... add_port.cc ... Failed to add port`) before it
            one_error(p, 8, f"cannot listen on 127.0.0.1:{port}", "in use")
    one_error(feedlog("serve", "--data", str(tmp_path / "d"), "--listen", "127.0.0.1:"), 2, "expected HOST:PORT")


# ---- progress and interruption ----------------------------------------------------------------------


def lines_of(n: int, start: int = 0) -> str:
    return "".join(json.dumps({"key": f"k{i}", "value": "v"}) + "\n" for i in range(start, start + n))


def read_until(stream: Callable[[], str], pattern: str, deadline: float) -> str:
    seen = ""
    while time.monotonic() < deadline:
        line = stream()
        if not line:
            break
        seen += line
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no {pattern!r} in {seen!r}")


def test_interrupted_append_says_what_landed_and_how_to_resume(tmp_path: Path, feed: str) -> None:
    env = {**ENV, "FEEDLOG_PROGRESS_EVERY": "0"}  # a report after every batch: the test sees them land
    with interruptible():
        p = subprocess.Popen(
            [sys.executable, "-m", "feedlog", "append", feed, "--jsonl", "-", "--batch", "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    assert p.stdin is not None and p.stderr is not None
    try:
        p.stdin.write("\n" + lines_of(1050))  # a blank first line: input lines and entries differ by one
        p.stdin.flush()
        seen = read_until(p.stderr.readline, r"1,000 entries", time.monotonic() + 60)
        assert seen.startswith("feedlog: append: ")  # the periodic one-line report (stderr is a pipe)
        p.send_signal(signal.SIGINT)  # while it waits for more input, 50 lines into the next batch
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130
    last = err.strip().splitlines()[-1]
    assert last.startswith("feedlog: interrupted: 1,000 entries durably appended (seq 4..1003)"), last
    assert "input lines 1..1,001 are in the feed" in last
    hint = last.split("to resume: ", 1)[1]
    assert hint == f"feedlog append {feed} --jsonl - --skip 1001 --batch 100 (with the same input on stdin)"

    # the hint, followed: every line once
    resumed = feedlog("append", feed, "--jsonl", "-", "--skip", "1001", "--json", stdin="\n" + lines_of(1200))
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["appended"] == 200
    keys = [json.loads(x)["key"] for x in feedlog("cat", feed, "--from", "4", "--json").stdout.splitlines()]
    assert keys == [f"k{i}" for i in range(1200)]


def test_quick_or_json_work_prints_no_progress(feed: str, tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(lines_of(50))
    quick = feedlog("append", feed, "--jsonl", str(jsonl))
    assert quick.returncode == 0 and quick.stderr == ""
    env = {**ENV, "FEEDLOG_PROGRESS_EVERY": "0"}
    for args in (["--json"], ["--quiet"]):
        p = feedlog("verify", feed, *args, env=env)
        assert p.returncode == 0 and p.stderr == "", args
    reported = feedlog("verify", feed, env=env)
    assert reported.stderr.startswith("feedlog: verify: 54 of 54 blocks (100%), "), reported.stderr


def test_interrupted_verify_says_how_far_it_got(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with Feed.create(big, fsync=False) as f:
        for n in range(40):
            f.append([Write(f"k{n}-{i}", b"v" * 64) for i in range(5000)])
    env = {**ENV, "FEEDLOG_PROGRESS_EVERY": "0"}
    with interruptible():
        p = subprocess.Popen(
            [sys.executable, "-m", "feedlog", "verify", str(big)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    assert p.stderr is not None
    try:
        read_until(p.stderr.readline, r"feedlog: verify: 4,096 of 200,001 blocks", time.monotonic() + 60)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and out == ""  # 200,001 blocks: seconds of work after the first 4,096
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"feedlog: interrupted: blocks 0\.\.[\d,]+ of 200,001 re-hashed and match the stored tree "
        r"\(the signed root is checked at the end: not yet\)",
        last,
    ), last


def test_the_table_commands_name_the_owner_variables_delta_reads() -> None:
    from feedlog.cli import table_cmds
    from feedlog.delta import managed

    # copied so that `feedlog get` does not load Delta and pyarrow (about a second) to print its help
    assert (table_cmds.OWNER_ENV, table_cmds.TOKEN_ENV) == (managed.OWNER_ENV, managed.TOKEN_ENV)


def length_of(feed: str) -> int:
    from feedlog.log.feed import Feed

    with Feed.open(feed, writable=False) as f:
        return f.length


def test_on_a_terminal_the_interruption_starts_its_own_line_after_the_bar(feed: str) -> None:
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with interruptible():
        p = subprocess.Popen(
            [sys.executable, "-m", "feedlog", "append", feed, "--jsonl", "-", "--batch", "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=ENV,
        )
    os.close(slave)
    screen = b""

    def read_for(seconds: float) -> None:
        nonlocal screen
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if select.select([master], [], [], left)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:  # the process closed the terminal
                    return

    assert p.stdin is not None
    try:
        p.stdin.write(lines_of(1000).encode())
        p.stdin.flush()
        # the first 1,000 landed (a loaded machine may take seconds just to start the command), then
        # past the bar's 2 s delay: the next batch draws it
        deadline = time.monotonic() + 120
        while length_of(feed) < 4 + 1000 and time.monotonic() < deadline:  # header + 3 + 1,000
            read_for(0.2)
        read_for(2.5)
        p.stdin.write(lines_of(100, 1000).encode())
        p.stdin.flush()
        deadline = time.monotonic() + 60
        while b"1,100 entries" not in screen and time.monotonic() < deadline:
            read_for(0.2)
        assert b"append: " in screen and b"1,100 entries" in screen, screen  # the bar
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        read_for(1)
    finally:
        p.kill()
        os.close(master)
    text = screen.decode().replace("\r\n", "\n")
    assert p.returncode == 130
    # after the bar's line, not on it, and with no blank line between
    assert "]\nfeedlog: interrupted: 1,100 entries durably appended" in text, text


def test_an_interrupted_clone_says_what_it_kept_and_how_to_continue(
    feed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a copy is a verified prefix whatever moment the interruption hits (Feed.store_signed): what it
    # says is read back from the copy itself; a clone too fast to interrupt on cue is read the same way
    from feedlog.cli.fmt import Progress
    from feedlog.cli.peer_cmds import _copy_interrupted

    assert _copy_interrupted(Progress("clone", enabled=False), feed) == 130
    assert (
        capsys.readouterr().err
        == f"feedlog: interrupted: 4 verified blocks kept in {feed}; to continue: feedlog pull {feed}\n"
    )
    assert _copy_interrupted(Progress("clone", enabled=False), str(tmp_path / "none")) == 130
    assert capsys.readouterr().err == "feedlog: interrupted: nothing copied\n"


def test_sizes_read_as_du_si_prints_them() -> None:
    from feedlog.cli.fmt import fmt_size

    assert [fmt_size(n) for n in (0, 999, 1000, 64 << 10, 1_311_099, 2_100_000_000)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "65.5 kB",
        "1.3 MB",
        "2.1 GB",
    ]
