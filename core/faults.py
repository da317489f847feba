"""Fault points for crash tests: ``LAKECDC_FAULT="after_bronze_commit:3"`` makes the 3rd pass
through that point end the process at once with ``os._exit(137)``, as ``kill -9`` would: no
``finally`` blocks, no flushes, no clean disconnects.
"""

from __future__ import annotations

import os
from collections import Counter


class FaultPoints:
    def __init__(self, spec: str = "") -> None:
        self._at: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, nth = item.partition(":")
            self._at[name] = int(nth or 1)
        self._seen: Counter[str] = Counter()

    def hit(self, name: str) -> None:
        if name not in self._at:
            return
        self._seen[name] += 1
        if self._seen[name] == self._at[name]:
            os._exit(137)
