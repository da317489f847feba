"""Gold: silver change rows → ``gold/service_stats`` counts → the dashboard's Postgres.

- ``gold.deltas``: pure transforms, silver rows → signed deltas per key (DESIGN §2);
- ``gold.apply``: the foreachBatch body - complete transactions only, idempotent MERGE;
- ``gold.start``: gold's start-up: tables, checkpoint refusals, the writer;
- ``gold.push``: gold's change data feed → Postgres ``service_stats`` (``lakecdc push``),
  JVM-free (delta-rs + psycopg).

The stream that drives them is ``pipelines.stream`` (one pass: bronze → silver → gold).
"""

