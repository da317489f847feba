"""The report's entry: ``write`` draws the plots and fills the template
(``bench/report.md.tmpl``) into the Markdown report; ``main`` is ``python -m bench.report
RESULTS.json [REPORT.md]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from string import Template

from bench.report.plots import plot_freshness, plot_gold_scaling, plot_throughput
from bench.report.prose import _saturation_text, analysis
from bench.report.template_values import _values

# The template sits beside the package: bench/report.md.tmpl.
TEMPLATE = Path(__file__).parent.with_name("report.md.tmpl")


def write(doc: dict, out: Path, report_path: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    made = {"img_throughput": plot_throughput(doc, out / "throughput.png"),
            "img_freshness": plot_freshness(doc, out / "freshness.png"),
            "img_gold": plot_gold_scaling(doc, out / "gold_scaling.png")}
    images = {k: _relative(v, report_path.parent) for k, v in made.items()}
    images["results_json"] = _relative(out / "results.json", report_path.parent)
    template = Template(TEMPLATE.read_text())
    values = _values(doc, images)
    values["saturation"] = _saturation_text(doc, values)
    values["analysis"] = analysis(doc, values)
    report_path.write_text(template.substitute(values))
    return report_path


def _relative(path: Path, start: Path) -> str:
    import os
    return os.path.relpath(path.resolve(), start.resolve())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results = Path(argv[0])
    report_path = Path(argv[1]) if len(argv) > 1 else results.parent / "benchmarks.md"
    write(json.loads(results.read_text()), results.parent, report_path)
    print(report_path)
    return 0
