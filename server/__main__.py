"""`python -m feedlog_server ...` is `feedlog serve ...`, and ends as `feedlog` does (feedlog/leave.py)."""

from feedlog.leave import leave

from .serve import main

leave(main())
