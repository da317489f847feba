"""``tables add``, ``backfill snapshot``, ``tables`` and ``tables remove`` where every write
goes through Spark (``LAKECDC_WRITER=spark``): the captured set, the mirror the
load writes, the backfill's staging table and bronze are all written by Spark, and the
window rule reads bronze through it.

A table with a composite key and TOASTed bodies is added while a Spark shipper runs. The
first ``tables add`` crashes right after its first chunk (docs 1-5) is in the mirror, and
the rows are changed before the rerun loads the rest. The source is read with psycopg and
the lakehouse with delta-rs, never through lakecdc:

- the mirror equals the source: ten rows of the loaded chunk updated without their body
  (wal2json leaves the unchanged TOASTed value out) keep the body the chunk read, a
  rewritten row and a deleted one are as the source has them;
- every commit of the mirror was made by Spark;
- a ``backfill snapshot`` run reads the rows into the change stream, in two chunks, and the
  mirror stays equal; every staging commit was made by Spark, and a completed run's staged
  rows are gone;
- ``tables`` lists the mirror's rows; ``tables remove`` stores the table as removed (what
  that means for its mirror is ``test_tables_add``'s).
"""

from __future__ import annotations

import json
import random

import pytest
from deltalake import DeltaTable

from core.layout import BACKFILL_STAGING, CAPTURE_LIST, mirror_path
from tests.integration.test_tables_add import assert_docs_mirrored, change_docs, create_docs
from tests.tests_support import Crash, cli_env, crash_once_at, running_shipper

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def bronze_info_sum(config, key: str) -> int:
    """The sum of ``key`` over bronze's commits, from the metadata Spark recorded."""
    total = 0
    for commit in DeltaTable(config.bronze_path).history():
        meta = json.loads(commit.get("userMetadata") or "{}")
        total += int(meta.get("info", {}).get(key, 0))
    return total


def test_a_table_added_through_spark_alone_is_loaded_by_it_and_ends_exact(
        source_db, config, spark, cli_here, monkeypatch):
    from core.engine.spark_delta import SparkDelta
    from pipelines.setup.prepare import setup
    from pipelines.setup.capture import add_table

    rng = random.Random(3703)
    with source_db.connect() as conn:
        create_docs(conn, rng)
    config = config.with_(writer="spark", mirrors=None)
    setup(config, spark_factory=lambda: spark)
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all", "LAKECDC_WRITER": "spark"}

    with running_shipper(config, engine=SparkDelta(spark)):
        crash_once_at(monkeypatch, "after_mirror_chunk")
        with pytest.raises(Crash):
            add_table(config, "public.docs", chunk_rows=10, spark_factory=lambda: spark)
        with source_db.connect() as conn:           # after the first chunk was read
            change_docs(conn, rng)
        again = cli_here(["tables", "add", "public.docs", "--chunk-rows", "10"], env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "its 29 current rows loaded" in again.stdout, again.stdout
    drained = cli_here(["run", "--once"], env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert_docs_mirrored(source_db, config)
    mirror = DeltaTable(mirror_path(config.lakehouse, "public.docs")).history()
    assert all("Apache-Spark" in c.get("engineInfo", "") for c in mirror), mirror[0]

    # A backfill run reads the rows into the change stream, in two chunks.
    with running_shipper(config, engine=SparkDelta(spark)):
        read_again = cli_here(["backfill", "snapshot", "--table", "public.docs",
                               "--new-run", "--chunk-rows", "15"], env)
        assert read_again.returncode == 0, read_again.stderr[-3000:]
        assert "public.docs 29 rows in 2 chunks; complete" in read_again.stdout, \
            read_again.stdout
    assert bronze_info_sum(config, "lakecdc.backfill_rows") == 29
    drained = cli_here(["run", "--once"], env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert_docs_mirrored(source_db, config)

    staging = DeltaTable(config.table_path(BACKFILL_STAGING))
    history = staging.history()
    assert len(history) >= 4 and all("Apache-Spark" in c.get("engineInfo", "")
                                     for c in history), history[0]
    assert staging.to_pyarrow_dataset().to_table(columns=["kind"]).column(
        "kind").to_pylist().count("row") == 0

    listed = cli_here(["tables"], env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("public.docs "))
    assert "captured" in line and " 29 " in line, listed.stdout
    removed = cli_here(["tables", "remove", "public.docs"], env)
    assert removed.returncode == 0 and "kept as it was" in removed.stdout, removed.stderr
    stored = DeltaTable(config.table_path(CAPTURE_LIST)).to_pyarrow_table().to_pylist()
    assert {r["table_name"]: r["state"] for r in stored}["public.docs"] == "removed"
