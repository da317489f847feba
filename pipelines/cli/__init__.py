"""The ``lakecdc`` command line: a thin room on top of the others. ``main`` holds the root
group and the entry points; each other module is one command group and calls the room it
is named for (``run``: ship, stream, mirrors, push, run; ``setup``; ``tables``;
``verify``: verify, quality; ``backfill``; ``observe``: status, metrics, sql; ``maintain``;
``demo``).
``context`` is what they share."""

from pipelines.cli.main import cli, entry, main, process_entry

__all__ = ["cli", "entry", "main", "process_entry"]
