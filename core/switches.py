"""Test hooks, handed to the stages as one object: fault points for crash tests and guards
switched off for negative controls. The default (``Switches()``, or ``NONE``) does nothing:
no fault point fires and every guard is on. ``Switches.from_config`` reads both from the
configuration (``LAKECDC_FAULT``, ``LAKECDC_UNSAFE_DISABLE_GUARDS``; ``core.config.GUARDS``
lists the guards and what each protects).

A fault point: ``LAKECDC_FAULT="after_bronze_commit:3"`` makes the 3rd pass through that point
end the process at once with ``os._exit(137)``, as ``kill -9`` would: no ``finally`` blocks,
no flushes, no clean disconnects.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable


class Switches:
    def __init__(self, faults: str = "", off: Iterable[str] = ()) -> None:
        self._at: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in faults.split(","))):
            name, _, nth = item.partition(":")
            self._at[name] = int(nth or 1)
        self._seen: Counter[str] = Counter()
        self.off = frozenset(off)

    @classmethod
    def from_config(cls, config) -> Switches:
        """The fault points and the guards switched off that ``config`` names."""
        return cls(config.faults, config.disabled_guards)

    def hit(self, point: str) -> None:
        """A fault point: the pass ``LAKECDC_FAULT`` names ends the process."""
        if point not in self._at:
            return
        self._seen[point] += 1
        if self._seen[point] == self._at[point]:
            os._exit(137)

    def on(self, guard: str) -> bool:
        """Whether ``guard`` is on: always, unless switched off (negative controls only)."""
        return guard not in self.off


NONE = Switches()       # no fault point, every guard on: the default of every stage
