"""Silver: bronze's raw wal2json rows as typed change rows. Imports only ``core``.

- ``schema``: the wal2json change and the silver tables;
- ``parse``: bronze → silver rows, pure DataFrame transforms;
- ``writer``: one micro-batch appended exactly once (driven by ``pipelines.run.stream``);
- ``reprocess``: a range of bronze parsed again into silver (``pipelines.backfill.rebuild`` runs it
  with the gold rebuild after it).
"""
