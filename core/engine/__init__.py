"""The storage engine: how lakecdc reads and writes its Delta tables, chosen once.

Two engines implement one interface (``core.engine.api.Engine``):

- ``core.engine.delta_rs.DeltaRs``: delta-rs, the default. No JVM: the shipper, the push,
  ``status`` and ``verify`` run without Spark, and a writer keeps its handle on a table
  between its commits (``core.handle``).
- ``core.engine.spark_delta.SparkDelta``: Spark's Delta (``LAKECDC_WRITER=spark``), where only
  Spark reaches storage (Unity Catalog external locations, a governed workspace).

``core.engine.choose`` picks one from the configuration; every other module takes the
engine it is handed and never asks which it is. Both record the same commit metadata and
app transactions (``core.commits``), so either reads what the other wrote. Spark's own
jobs (the stream's query, ``mapInArrow`` parses, quality suites, ``reprocess-silver``) are
not storage operations and stay Spark's.
"""
