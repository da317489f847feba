"""Creating lakecdc's Delta tables with Spark: the one way each gets its schema and
properties."""

from __future__ import annotations

from core.features import PLAIN


def create_table(spark, path: str, schema, properties: dict[str, str],
                 comment: str | None = None) -> None:
    """Create the Delta table at ``path`` with ``schema``, ``properties`` and ``comment``
    unless a table is there already (then nothing changes: idempotent). The table states
    the features delta-rs cannot handle off (``core.features.PLAIN``), whatever the
    session's defaults say."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if comment:
        builder = builder.comment(comment)
    for key, value in {**PLAIN, **properties}.items():
        builder = builder.property(key, value)
    builder.execute()
