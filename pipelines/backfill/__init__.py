"""Repairs: gold rebuilt from a fresh baseline, silver reprocessed from bronze (``rebuild``).
The snapshot backfill into bronze is bronze's own (``bronze.snapshot_backfill``)."""
