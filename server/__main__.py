"""`python -m feedlog_server ...` is `feedlog serve ...`."""

import sys

from .serve import main

sys.exit(main())
