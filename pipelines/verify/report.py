"""The verdict of ``lakecdc verify`` and how it is shown: pure, no I/O (see
``pipelines.verify.reconcile``).

A ``Verdict`` holds, for one source LSN, the truth and each layer's counts *as of that LSN*
(``service_stats`` keys → count, zero counts dropped: a key missing is a key at 0). It
compares them, renders a readable text report with a diff table, and a JSON document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.captured import DIMS
from core.lsn import fmt

Key = tuple[str, str, str, str]

TABLE_ROWS = 20            # differing keys shown in the text diff
DOCUMENT_ROWS = 1000       # differing keys listed per layer in the JSON document


def nonzero(counts) -> dict[Key, int]:
    return {tuple(k): int(v) for k, v in counts.items() if v}


@dataclass(frozen=True)
class LayerCounts:
    """One layer (gold, dashboard) as of the verification LSN, and where it was read."""

    name: str
    counts: dict[Key, int]
    # Shown as they are (e.g. version, watermark): how the as-of counts were derived.
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    lsn: int                        # the consistent point: truth and layers are as of it
    marker: int                     # LSN of the marker transaction the layers had to pass
    truth: dict[Key, int]
    purged: int                     # history rows purged since gold's baseline (in truth)
    layers: tuple[LayerCounts, ...]
    pipeline: str = ""              # how the layers got past the marker
    # Each mirror against its source table (``pipelines.verify.mirror_check.MirrorCheck``).
    mirrors: tuple = ()

    def differences(self, layer: LayerCounts) -> dict[Key, tuple[int, int]]:
        """Keys whose count differs from the truth: key → (truth, layer)."""
        keys = set(self.truth) | set(layer.counts)
        return {k: (self.truth.get(k, 0), layer.counts.get(k, 0)) for k in sorted(keys)
                if self.truth.get(k, 0) != layer.counts.get(k, 0)}

    @property
    def counts_exact(self) -> bool:
        """Gold and the dashboard (what ``--repair`` rebuilds)."""
        return not any(self.differences(layer) for layer in self.layers)

    @property
    def exact(self) -> bool:
        return self.counts_exact and all(m.exact for m in self.mirrors)

    def drifted(self) -> list[str]:
        return [layer.name for layer in self.layers if self.differences(layer)] + \
            [f"mirror {m.table}" for m in self.mirrors if not m.exact]


def _keys(n: int) -> str:
    return f"{n:,} key" + ("" if n == 1 else "s")


def _line(v: Verdict, layer: LayerCounts) -> str:
    diff = v.differences(layer)
    state = "exact" if not diff else \
        f"{_keys(len(diff))} {'differs' if len(diff) == 1 else 'differ'}"
    detail = ", ".join(f"{k.replace('_', ' ')} {val}" for k, val in layer.detail.items())
    return (f"{layer.name}: {state}, {_keys(len(layer.counts))}, "
            f"{sum(layer.counts.values()):,} notifications as of LSN {fmt(v.lsn)}"
            + (f" ({detail})" if detail else ""))


def _rows(n: int) -> str:
    return f"{n:,} row" + ("" if n == 1 else "s")


def _mirror_line(m) -> str:
    where = f"(version {m.version}, holding its changes up to LSN {fmt(m.holds)})"
    lost = (f"; known loss: {_rows(m.lost)} of the source held NaN or ±Infinity, which the "
            "mirror holds as NULL") if m.lost else ""
    how = "" if m.sampled is None else \
        f" (every key; {_rows(m.sampled)} of a sample compared column by column)"
    if m.exact:
        state = "equal to the source" if m.lost else "exact"
        return f"mirror {m.table}: {state}, {_rows(m.rows)}{how} {where}{lost}"
    keys = "; ".join(", ".join(str(v) for v in k) for k in m.keys)
    return (f"mirror {m.table}: {_rows(m.differing)} differ from the source's {_rows(m.rows)}"
            f"{how} {where}; keys: {keys}{lost}")


def render(v: Verdict, rows: int = TABLE_ROWS) -> str:
    """The text report: the point, one line per layer, then a diff table on drift."""
    lines = [f"source: consistent point LSN {fmt(v.lsn)}, marker {fmt(v.marker)}"
             + (f"; {v.pipeline}" if v.pipeline else ""),
             f"truth: {_keys(len(v.truth))}, {sum(v.truth.values()):,} notifications"
             + (f" (including {v.purged:,} purged from history since gold's baseline)"
                if v.purged else "")]
    lines += [_line(v, layer) for layer in v.layers]
    lines += [_mirror_line(m) for m in v.mirrors]
    differing = sorted(set().union(*(v.differences(layer) for layer in v.layers)))
    if not differing:
        return "\n".join(lines)
    header = [*DIMS, "truth", *(layer.name for layer in v.layers)]
    table = [[*k, f"{v.truth.get(k, 0):,}", *(f"{layer.counts.get(k, 0):,}" for layer in
                                              v.layers)] for k in differing[:rows]]
    table.append(["total", "", "", "", f"{sum(v.truth.values()):,}",
                  *(f"{sum(layer.counts.values()):,}" for layer in v.layers)])
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    numeric = range(len(DIMS), len(header))

    def fmt_row(r):
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    lines += ["", fmt_row(header), *(fmt_row(r) for r in table)]
    if len(differing) > rows:
        lines.append(f"(showing {rows} of {len(differing):,} differing keys; "
                     "`lakecdc verify --json` lists more)")
    return "\n".join(lines)


def document(v: Verdict, rows: int = DOCUMENT_ROWS) -> dict:
    """The ``--json`` document."""
    doc = {"lsn": fmt(v.lsn), "marker": fmt(v.marker), "exact": v.exact,
           "pipeline": v.pipeline,
           "truth": {"keys": len(v.truth), "total": sum(v.truth.values()),
                     "purged_from_history": v.purged}}
    for layer in v.layers:
        diff = v.differences(layer)
        doc[layer.name] = {
            "exact": not diff, "keys": len(layer.counts), "total": sum(layer.counts.values()),
            **layer.detail, "differing_keys": len(diff),
            "differences": [{**dict(zip(DIMS, k)), "truth": t, layer.name: c}
                            for k, (t, c) in list(diff.items())[:rows]]}
    if v.mirrors:
        doc["mirrors"] = [{"table": m.table, "exact": m.exact, "rows": m.rows,
                           "version": m.version, "holds_up_to": fmt(m.holds),
                           "differing_rows": m.differing, "keys": [list(k) for k in m.keys],
                           "known_loss_rows": m.lost, "sampled_rows": m.sampled}
                          for m in v.mirrors]
    return doc


def drift_sentence(v: Verdict) -> str:
    """One sentence for ``lakecdc: drift: …`` (stderr, exit 1)."""
    parts = [f"{layer.name} on {_keys(len(v.differences(layer)))}"
             for layer in v.layers if v.differences(layer)]
    mirrors = [f"the mirror of {m.table} on {_rows(m.differing)}"
               for m in v.mirrors if not m.exact]
    if not parts:
        return (f"{' and '.join(mirrors)} differ from the source at LSN {fmt(v.lsn)} (keys in "
                "the report); a mirror has no repair yet: report it, with the report.")
    return (f"{' and '.join(parts + mirrors)} differ from the source at LSN {fmt(v.lsn)}; "
            "`lakecdc verify --repair` (or `lakecdc backfill rebuild-gold`) rebuilds gold "
            "and the dashboard from a fresh baseline"
            + (" (not the mirrors)." if mirrors else "."))
