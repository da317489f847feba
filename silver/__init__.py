"""Silver layer: bronze's raw wal2json rows as typed change rows (``silver.parse``, pure
transforms) streamed into Delta by ``silver.stream``; schemas in ``silver.schema``."""
