"""The wiring: how lakecdc runs, stringing the layers together. Imports everything; nothing
imports it.

- ``cli`` (``logs``: its log lines): the ``lakecdc`` command; ``run``: every stage in one
  process; ``stream``: the one streaming query, bronze → silver → gold;
- ``setup_source``: ``lakecdc setup``; ``baseline``, ``consistent``, ``source_truth``: the
  source's counts at a consistent point;
- ``rebuild``: ``backfill rebuild-gold`` and ``reprocess-silver``; ``verify``
  (``verify_report``): gold and the dashboard against the source;
- ``status``, ``metrics`` (``metrics_state``), ``inputs``: what each layer holds, waits for;
- ``quality``: Great Expectations gates; ``query``: ``lakecdc sql``;
- ``demo`` (``demo_plot``, ``traffic``): ``lakecdc demo``.
"""
