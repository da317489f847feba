"""Progress of long counts and copies: a bar on a terminal, a log line now and then otherwise."""

from __future__ import annotations

import logging
import sys
import time

import click

log = logging.getLogger("lakecdc.progress")


class ProgressBar:
    """``with ProgressBar("counting", total) as p: p(n)`` - ``total`` may be an estimate."""

    def __init__(self, label: str, total: int | None, unit: str = "rows",
                 log_every_s: float = 10.0) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self.log_every_s = log_every_s
        self._bar = None
        self._last_log = time.monotonic()

    def __enter__(self) -> "ProgressBar":
        if sys.stderr.isatty():
            self._bar = click.progressbar(length=max(self.total or 0, 1), label=self.label,
                                          file=sys.stderr, show_pos=True)
            self._bar.__enter__()
        return self

    def __call__(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            if self.done > self._bar.length:
                self._bar.length = self.done
            self._bar.update(n)
        elif time.monotonic() - self._last_log >= self.log_every_s:
            self._last_log = time.monotonic()
            of = f" of ~{self.total:,}" if self.total else ""
            log.info("%s: %s%s %s", self.label, f"{self.done:,}", of, self.unit)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
