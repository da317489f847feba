"""slot → bronze: the JVM-free shipper (psycopg 3 + pyarrow + deltalake). Imports only
``core``.

- ``ship``: the delivery rule and the loop; ``batch_rows``: one peek's rows on their way
  into a commit; ``session_loss``: which errors mean "reconnect", and why;
- ``slot``: the replication slot (peek, advance, state); ``heartbeat``: heartbeats that let
  an idle slot advance;
- ``records``: peek rows → bronze records (pure); ``buffer``: memory bounded by spilling;
- ``table``: the bronze Delta table and its progress;
- ``source``: checks and preparation of the source database; ``not_null``: NOT NULL on the
  identity columns; ``failover``: is the source still bronze's history, is the slot;
- ``backfill``: the snapshot backfill (the protocol and its run), with ``backfill_source``
  (the source's chunks and watermark messages), ``backfill_staging`` (the staging table)
  ``backfill_emitter`` (the shipper's side) and ``backfill_marks`` (its pure parts:
  watermarks, the window rule, read rows).
"""
