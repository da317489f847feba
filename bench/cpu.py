"""Where a measured interval's CPU went, per process, from ``/proc`` (Linux).

On this 2-core machine the catch-up is CPU-bound: the shipper's Postgres session decoding
the slot, ``lakecdc run``'s Python (shipping, parsing, pushing), its JVM and the bench's
own poll share two cores. ``CpuAccount`` sums each one's user and system time between two
points, so a figure comes with what it cost and who paid.

Processes that start and end between the two points (a session opened and closed) are not
seen; the bench's polls keep one session open for that reason.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] == pid:
                found.append(int(entry))
    return found


def parent_pid(pid: int) -> int:
    """The parent of a running process ``pid`` (a Postgres session's: its postmaster)."""
    stat = _stat(pid)
    if stat is None:
        raise RuntimeError(f"process {pid} is gone")
    return stat[0]


class CpuAccount:
    """CPU seconds per part between ``start()`` and ``stop()``: ``lakecdc_python`` (the run's
    process), ``jvm`` (its children), ``postgres`` (the source cluster's processes: its
    postmaster and the postmaster's children) and ``bench`` (this process)."""

    def __init__(self, run_pid: int, postmaster_pid: int) -> None:
        self.parts = {"lakecdc_python": lambda: [run_pid],
                      "jvm": lambda: _children(run_pid),
                      "postgres": lambda: [postmaster_pid, *_children(postmaster_pid)],
                      "bench": lambda: [os.getpid()]}
        self._start: dict[str, dict[int, float]] = {}

    def _now(self) -> dict[str, dict[int, float]]:
        now = {}
        for part, pids in self.parts.items():
            seconds = {pid: stat[1] for pid in pids() if (stat := _stat(pid)) is not None}
            now[part] = seconds
        return now

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        """CPU seconds per part since ``start``, and their ``total``."""
        used = {}
        for part, seconds in self._now().items():
            before = self._start.get(part, {})
            used[part] = round(sum(s - before.get(pid, 0.0) for pid, s in seconds.items()), 2)
        used["total"] = round(sum(used.values()), 2)
        return used
