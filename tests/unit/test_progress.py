"""A long command's progress (``core.progress.ProgressBar``): in a log (a job's output, a
pipe) a line now and then saying how far, against the estimate where there is one."""

from __future__ import annotations

import logging

from core import progress


def test_a_log_gets_a_line_now_and_then_with_the_estimate(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    with caplog.at_level(logging.INFO, logger="lakecdc.progress"):
        with progress.ProgressBar("loading public.big", 1_000_000, log_every_s=5.0) as bar:
            for _ in range(30):                 # 30 s of chunks, one a second
                now[0] += 1.0
                bar(10_000)
    lines = [r.getMessage() for r in caplog.records if r.name == "lakecdc.progress"]
    assert len(lines) == 6
    assert lines[0] == "loading public.big: 50,000 of ~1,000,000 rows"
    assert lines[-1] == "loading public.big: 300,000 of ~1,000,000 rows"
