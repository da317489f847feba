"""``lakecdc backfill rebuild-gold`` (being written): see ``rebuild_and_push``."""

from __future__ import annotations


def rebuild_and_push(pipeline):
    """Rebuild gold from a fresh consistent baseline plus silver after it, replace it in one
    commit, push everything. Returns a report with ``summary() -> str``. Holds the gold lock."""
    raise NotImplementedError
