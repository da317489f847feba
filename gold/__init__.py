"""Gold: silver change rows → ``gold/service_stats`` counts → the dashboard's Postgres.
Imports ``silver`` and ``core``, never ``bronze``.

- ``deltas``: pure transforms, silver rows → signed deltas per key (docs/gold.md);
- ``plan``: what one batch applies, from its contribution lines (pure Python);
- ``apply``: the gold half of the stream's batch - complete transactions only, idempotent
  MERGE, ``_pending``;
- ``start``: gold's start-up: tables, checkpoint refusals, the writer;
- ``asof``: gold's position, and gold as of an earlier source LSN;
- ``push``: gold's change data feed → Postgres ``service_stats`` (``lakecdc push``),
  JVM-free (delta-rs + psycopg).

The stream that drives them is ``pipelines.run.stream`` (one pass: bronze → silver → gold).
"""
