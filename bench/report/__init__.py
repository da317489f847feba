"""The benchmark report: PNG plots and ``docs/benchmarks.md``, from the result document.

Everything here is a pure function of ``results.json`` (``bench.measure.run_all``), so the
report can be regenerated from a stored result: ``python -m bench.report RESULTS.json
[REPORT.md]``. The prose is the template ``bench/report.md.tmpl``; every number in it is
filled in. Its parts:

- ``targets``: the targets (``TARGETS``, the freshness rates), their verdicts, ``summary``;
- ``plots``: the PNG plots;
- ``table_rows``: the Markdown tables, row by row;
- ``template_values``: the template's values, section by section;
- ``prose``: the analysis text per target, met or missed;
- ``render``: ``write`` and ``main`` (``__main__``);
- ``formatting``: how a figure is written.

The names below are the report's interface, importable from ``bench.report``.
"""

from __future__ import annotations

from bench.report.plots import plot_freshness, plot_gold_scaling, plot_throughput
from bench.report.prose import ANALYSIS, analysis, saturation
from bench.report.render import main, write
from bench.report.table_rows import (
    QUERY,
    catch_up_rows,
    fresh_progress,
    fresh_stages,
    pass_table,
    writer_rows,
)
from bench.report.targets import (
    FAST_P95_S,
    FAST_RATE,
    SLOW_P95_S,
    SLOW_RATE,
    TARGETS,
    all_exact,
    gold_run_at,
    largest_gold,
    run_at,
    summary,
    verdicts,
)

__all__ = [
    "ANALYSIS", "FAST_P95_S", "FAST_RATE", "QUERY", "SLOW_P95_S", "SLOW_RATE", "TARGETS",
    "all_exact", "analysis", "catch_up_rows", "fresh_progress", "fresh_stages",
    "gold_run_at", "largest_gold", "main", "pass_table", "plot_freshness",
    "plot_gold_scaling", "plot_throughput", "run_at", "saturation", "summary", "verdicts",
    "write", "writer_rows",
]
