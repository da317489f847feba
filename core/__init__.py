"""The core every layer builds on; it imports no layer and no wiring.

- ``errors``: ``UserError`` (one sentence, exit 2), ``redact`` for DSNs;
- ``lsn``: LSN parsing and formatting;
- ``config``: ``Config``, the environment and flags every command reads;
- ``captured``: the captured tables, the dims, the identity columns, message prefixes;
- ``layout``: where every table and checkpoint lives under the lakehouse root;
- ``postgres``: every connection to Postgres (``connect``, ``Unreachable``) and every
  logical message lakecdc writes (``emit_message``);
- ``locks``: advisory locks (the gold writer, the shipper) and who holds them;
- ``storage``: where the lakehouse is (local or S3), how each engine reaches it, how a
  table is named across engines (``delta_rs_uri``, ``gold_key``); ``store_checks``: that
  the lakehouse can be reached and written;
- ``spark``: the one Spark session factory;
- ``commits``: lakecdc's metadata in Delta commits, and delta-rs commits carrying it;
  ``tables``: creating its Delta tables;
- ``checkpoints``: reading a streaming checkpoint's offsets and commits;
- ``switches``: fault points for the kill tests and guards switched off (negative controls);
- ``progress``: a progress bar or log line for long counts and copies; ``units``: byte
  sizes for people.

The dependency rule (checked by ``make test``, ``[tool.importlinter]`` in pyproject.toml):
``pipelines`` (wiring) → ``gold`` → ``silver`` → ``bronze`` → ``core``, each importing only
what is below it, and ``gold`` never importing ``bronze``.
"""
