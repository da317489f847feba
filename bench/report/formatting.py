"""How the report writes a figure: thousands separated, two decimals, ``n/a`` or ``-`` for
one not measured."""

from __future__ import annotations


def _n(x) -> str:
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.2f}"
    return f"{int(x):,}" if x is not None else "n/a"


def _or_dash(x) -> str:
    """``_n``, or ``-`` for a figure not measured."""
    return "-" if x is None else _n(x)


def _whole(x: float | None) -> int | None:
    """A count's median (half-way between two counts), to the nearest whole."""
    return None if x is None else round(x)


def _ms(x: float | None) -> str:
    """Seconds to the millisecond (the gold half's figures, whose ratio is a target)."""
    return "n/a" if x is None else f"{x:.3f}"


def _cpu(used: dict | None) -> str:
    """A catch-up's CPU seconds per part (``bench.cpu``), ``-`` in an older result."""
    if not used:
        return "-"
    return (f"{_n(used['total'])} (Postgres {_n(used['postgres'])}, Python "
            f"{_n(used['lakecdc_python'])}, JVM {_n(used['jvm'])}, bench {_n(used['bench'])})")
