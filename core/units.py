"""Quantities written for people."""

from __future__ import annotations


def byte_size(n: int | None) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.5 MB``; ``-`` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"
