"""Silver layer: bronze's raw wal2json rows as typed change rows (``silver.parse``, pure
transforms) written to Delta one micro-batch at a time by ``silver.writer`` (driven by
``pipelines.stream``); schemas in ``silver.schema``."""
