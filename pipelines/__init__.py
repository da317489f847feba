"""The wiring: how lakecdc runs, stringing the layers together. Imports everything; nothing
imports it. Its rooms import one way, top to bottom (docs/layout.md):

- ``cli``: the ``lakecdc`` command, one module per command group;
- ``demo`` (``lakecdc demo``) and ``verify`` (``verify``, ``quality``), apart from each other;
- ``backfill``: gold rebuilt, silver reprocessed;
- ``run``: the running pipeline (``run``, ``stream``, ``mirrors``);
- ``observe``: ``status``, metrics, log lines, ``sql``;
- ``maintain``: every table kept small by its own writer; ``lakecdc maintain``;
- ``setup``: ``setup`` and the captured set (``tables``);
- ``source``: the source at one consistent point (snapshot, counts, baselines).
"""
