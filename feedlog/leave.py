"""Ending a command's process once it has said everything: `leave(code)`.

The interpreter's own shutdown is skipped (`os._exit` after flushing stdout and
stderr). Two things went wrong in it, intermittently and only under load:
pyarrow 25/26 can abort in its C++ static destructors after a command that read
Parquet ("terminate called without an active exception", exit 134 after complete
output), and a peer started as `python -m feedlog_server` stayed alive after a
clean stop on SIGTERM (twice in full test runs; never when its command went
through here). Nothing of feedlog's needs atexit: files are closed by their
`with` blocks, servers stopped, and a Spark JVM exits when its gateway pipe to
this process closes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Flush stdout and stderr and end the process with `code`, without the interpreter's shutdown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that left (`| head`), or a closed stream
            stream.flush()
    os._exit(code)
