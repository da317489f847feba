"""The docs' rules, checked on the Markdown itself.

Every measured figure (a speed, a latency, a ratio, a peak memory, a CPU time) is quoted in
one place: the benchmark pages the bench generates, which carry the date of their run. Any
other page links to the section that holds the figure. Targets, limits and defaults are not
measured figures: a figure right after a target word ("≤ 1 s", "at most", "target") passes,
so does a rate the benchmarks drive or aim at (``DRIVEN``), and so do the lines of
``ALLOWED``. And every relative link between the repository's Markdown pages points at a
file that exists and, with ``#anchor``, at one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report import FAST_RATE, SLOW_RATE, TARGETS

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# Written by the bench from its results, with the date of their run: the one place for a
# measured figure (docs/benchmarks.md's header, and bench/aging.py, aged.py, kept_log.py,
# deployed.py, which write the others).
GENERATED = {ROOT / "docs/benchmarks.md",
             *(ROOT / "docs/benchmarks" / f"{name}.md"
               for name in ("aging", "aged", "kept_log", "deployed"))}

NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURES = {
    "a speed": re.compile(rf"{NUMBER}\s?k?\s(?:changes|rows)/s\b"),
    "a ratio": re.compile(rf"{NUMBER}\s?[×x](?![\w\d]|\s*\d)"),
    "a latency": re.compile(rf"\b(?:p50|p95|p99|max)\b(?:\s*/\s*(?:p95|p99|max))*"
                            rf"(?: of| was| is| were)?:?\s+\**{NUMBER}"
                            rf"(?:(?:\s*[/,]|\s+and)\s+{NUMBER})*\s?m?s\b"),
    "a peak memory": re.compile(rf"\b(?:peak(?:ed)?|RSS|resident)\b[^.;:]{{0,20}}?"
                                rf"\b{NUMBER}\s?[KMG]B\b"),
    "a CPU time": re.compile(rf"{NUMBER}\s?(?:CPU[- ]s(?:econds)?\b|core-µs)"),
    "a time taken": re.compile(rf"\btook\s+(?:about\s+)?{NUMBER}\s?(?:µs|ms|s|minutes)\b"),
}
# Words that make the figure after them a target, a limit or a default, not a measurement.
TARGET = re.compile(r"(?:[≤≥<>]|\bat most|\bat least|\btarget(?:s|ed)?\b|\bdefault\b|"
                    r"\bbound(?:s|ed)?\b|\blimit\b|\bunder\b|\bwithin\b|\bup to\b)"
                    r"[^.;]{0,12}$")
# Rates that are inputs or targets, not measurements (changes/s or rows/s): the
# freshness runs' two rates, the targets' limits, the neighbour tables' 100 rows/s, and the
# 300 changes/s of the soak's and the aged benchmark's traffic.
DRIVEN = {FAST_RATE, SLOW_RATE, 100.0, 300.0,
          *(float(t[3]) for t in TARGETS if t[5] == " changes/s")}
# Lines that quote a figure as sample output of a command, as (page, the line's text).
ALLOWED = {
    ("docs/backfill.md", "backfill run 20261121T081132Z-ef7b86: public.notifications 200,000 "
                         "rows in 20 chunks; complete in 9.5s, 20,964 rows/s."),
}


def _driven(kind: str, figure: str) -> bool:
    """Whether ``figure`` is a speed, one of the rates in ``DRIVEN``."""
    if kind != "a speed":
        return False
    number, thousands = re.match(rf"({NUMBER})\s?(k?)", figure).groups()
    return float(number.replace(",", "")) * (1000 if thousands else 1) in DRIVEN


def _prose(text: str):
    """The page's lines outside fenced code blocks, with their line numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def measured_figures(text: str, name: str) -> list[str]:
    """Each measured figure the page ``name`` quotes in ``text``, as "line: kind: figure"."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if (name, line.strip()) in ALLOWED:
            continue
        for kind, pattern in FIGURES.items():
            for match in pattern.finditer(line):
                if not (TARGET.search(line[:match.start()])
                        or _driven(kind, match.group(0))):
                    found.append(f"{number}: {kind}: {match.group(0)}")
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_only_the_generated_benchmark_pages_quote_measured_figures(page):
    assert measured_figures(page.read_text(), page.relative_to(ROOT).as_posix()) == [], (
        "a measured figure belongs on the generated benchmark pages (docs/benchmarks.md, "
        "docs/benchmarks/*.md): link to its section instead")


def test_a_figure_put_back_is_found_and_a_target_is_not():
    text = ("The dashboard's p95 was 0.30 s at 2,000 changes/s, p50 / max 0.1 / 0.4 s.\n"
            "The stream ran at 62,226 changes/s, 0.76× `pg_recvlogical`.\n"
            "Its peak RSS was 256 MB; the parse took 2.0 s, 13.4 CPU seconds.\n"
            "The targets: p95 ≤ 1 s, ≥ 1.2× `pg_recvlogical`, at most 512 MB.\n"
            "At 10 MB/s × 4 h, a 64 MB memory budget, every 0.5 s, 2k changes/s.\n")
    found = measured_figures(text, "docs/page.md")
    assert [f.split(": ", 1)[0] for f in found] == ["1", "1", "2", "2", "3", "3", "3"]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings (and its explicit ``<a id>``s)."""
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", page.read_text()))
    for _, line in _prose(page.read_text()):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_between_the_pages_points_at_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for number, line in _prose(page.read_text()):
            line = re.sub(r"`[^`]*`", "", line)
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(ROOT)}:{number}: {target}"
                if not linked.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                    broken.append(f"{where} (no such heading)")
    assert broken == []
