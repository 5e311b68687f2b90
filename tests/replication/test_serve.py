"""`python -m feedlog_server` is `feedlog serve`, with the server package's own entry point (no CLI loaded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedlog.replication.client import FeedClient
from feedlog.rpc import Tls
from feedlog_server.rpc import EXIT_LIMIT_S

from .certs import make_pki
from .test_shutdown import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "FEEDLOG_PEER_TOKEN"} | {
    "PYTHONPATH": str(ROOT),
    "PYTHONUNBUFFERED": "1",
    "COLUMNS": "100",  # argparse wraps help to the terminal's width
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=60)


def test_python_m_feedlog_server_takes_exactly_what_feedlog_serve_takes() -> None:
    server, cli = run("-m", "feedlog_server", "--help"), run("-m", "feedlog", "serve", "--help")
    assert server.returncode == cli.returncode == 0
    assert server.stdout.startswith("usage: feedlog serve ") and "--write-token-file" in server.stdout
    assert server.stdout == cli.stdout


def test_the_server_entry_point_loads_no_cli_and_answers_mistakes_in_one_line(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from feedlog_server.serve import main\n"
        "code = main(sys.argv[1:])\n"
        "print(code, sorted(m for m in sys.modules if m.startswith('feedlog.cli')))\n"
    )
    for args, code, needle in (
        (["--data", str(tmp_path / "d"), "--write-rate", "fast"], 2, "rate like"),
        (["--data", str(tmp_path / "d"), "--compact-every", "soon"], 2, "--compact-every 'soon'"),
        (["--data", str(tmp_path / "d"), "--compact-every=0.5m"], 2, "--compact-every '0.5m'"),
        (["--listen", "127.0.0.1:0"], 2, "--data"),
        (["--data", str(tmp_path / "d"), "--tls-cert", "missing.pem", "--tls-key", "missing.key"], 2, "TLS file"),
    ):
        p = run("-c", probe, *args)
        assert p.stdout.split() == [str(code), "[]"], p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_serve_tls_with_only_the_server_certificate(tmp_path: Path) -> None:
    # README: `serve` takes --tls-cert F --tls-key F; --tls-ca is only for the peers it follows
    pki = make_pki(tmp_path / "pki")
    port, data = free_port(), tmp_path / "d"
    tls = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    proc = subprocess.Popen(
        [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", f"127.0.0.1:{port}", *tls],
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 30
        key = None
        while key is None:
            try:
                token = (data / "_peer" / "write-token").read_text().strip()
                with FeedClient(f"127.0.0.1:{port}", tls=Tls.from_files(str(pki.ca)), timeout=2, token=token) as c:
                    key = c.create().key
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        # communicate, not wait: it drains the server's stderr, which, unread, could fill the pipe
        # and block the server's last writes (it once did not exit within 30 s of SIGTERM in a full run)
        try:
            _, log = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, log = proc.communicate()
            # the events say how far it got: "signal", then "stopped" once the server and the feeds closed
            pytest.fail(f"the peer did not exit within 30 s of SIGTERM; its log:\n{log[-3000:]}")
        assert proc.returncode == 0, log[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert '"event":"serving"' in log and '"tls":true' in log and len(key) == 32


def test_a_stopped_server_exits_even_when_a_thread_would_keep_it_alive(tmp_path: Path) -> None:
    """After a clean stop, the process exits within `EXIT_LIMIT_S` even if a thread that does not end
    would hold the interpreter open, and says which threads were left, with their stacks."""
    probe = (
        "import logging, os, signal, sys, threading, time\n"
        "from feedlog_server.app import PeerServer\n"
        "from feedlog_server.events import configure\n"
        "configure(logging.INFO)\n"
        "from feedlog_server.rpc import serve_forever\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='never-ends').start()\n"
        "threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "serve_forever(PeerServer(sys.argv[1], '127.0.0.1:0'))\n"
    )
    t = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "d")], capture_output=True, text=True, timeout=60, env=ENV
    )
    took = time.monotonic() - t
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"event":"stopped"' in done.stderr and '"event":"exit_stuck"' in done.stderr
    assert "never-ends" in done.stderr and "Thread 0x" in done.stderr  # the thread, and every stack
    assert took < 1.0 + EXIT_LIMIT_S + 15, took
