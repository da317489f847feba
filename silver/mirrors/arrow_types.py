"""A mirror column's values typed from their text in Arrow, without Spark, for the kinds
whose text Arrow's own cast reads exactly as the mirrors' Spark typing does
(``silver.mirrors.mirror_types.typed``, the rule; ``silver.mirrors.type_map``, the kinds).

Postgres prints these kinds in one form each, which both engines read alike: integers and
booleans, floats (``NaN`` and ``±Infinity`` too, with numbers as text), decimals of the
column's own scale, ``YYYY-MM-DD`` dates, and ISO timestamps with an offset of ``+HH`` or
``+HH:MM`` (with time zone: an instant) or none (without). Any column in which Arrow
refuses a value (an offset with seconds, a year past 9999, ``infinity``, text Spark's cast
would trim first) is left to Spark whole (None here): Spark converts it, or stops the
mirror with its one sentence, exactly as before. A decimal's ``NaN`` is NULL, as in
``typed`` (the known loss of ``silver.mirrors.type_map.loses_specials``).

Why: a continuous mirrors' batch types a few hundred rows per table, and a Spark job for
them took 0.2-0.6 s a table on 2 cores (docs/silver.md, "How fresh"); Arrow takes
milliseconds. Bytea and arrays stay Spark's. ``tests/unit/test_mirror.py`` holds both
engines to the same values on the same texts.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from silver.mirrors.type_map import kind_arrow, mirror_kind

ARROW_KINDS = ("int", "long", "float", "double", "boolean", "date", "decimal", "timestamp",
               "timestamp_ntz")


def arrow_typed(texts: pa.Array | pa.ChunkedArray, pg_type: str
                ) -> pa.Array | pa.ChunkedArray | None:
    """``texts`` (a column's values as text, NULL for SQL NULL) in the mirror type of
    ``pg_type``; None where Spark must type the column (a kind Arrow leaves to it, or a
    value Arrow's cast refuses). Pure."""
    kind = mirror_kind(pg_type)
    if kind[0] not in ARROW_KINDS:
        return None
    if kind[0] == "decimal":
        texts = pc.if_else(pc.equal(texts, "NaN"), pa.scalar(None, pa.string()), texts)
    try:
        return pc.cast(texts, kind_arrow(kind))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
