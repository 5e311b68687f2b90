"""`python -m feedlog_server ...` is `feedlog serve ...`."""

import sys

from feedlog.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
