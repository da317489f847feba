"""``python -m bench.report RESULTS.json [REPORT.md]``: the report again from a stored
result (``bench.report.render.main``)."""

from __future__ import annotations

import sys

from bench.report.render import main

if __name__ == "__main__":
    sys.exit(main())
