"""Bronze written by delta-rs is read by Spark + Delta (the silver job's reader)."""

import random

import pytest

from bronze.ship import Shipper
from pipelines.setup.prepare import setup
from tests.truth import Witness
from tests.integration.workload import archive, insert

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_spark_reads_every_bronze_row_and_the_recorded_progress(source_db, config, spark):
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        with source_db.connect() as conn:
            insert(conn, random.Random(9), 40)
            archive(conn, 0.5)
        Shipper(config).run(once=True)
        witnessed = witness.transactions()
    finally:
        witness.drop()
    df = spark.read.format("delta").load(config.bronze_path)
    got = {(r.commit_lsn, r.seq): r.data for r in df.select("commit_lsn", "seq", "data").collect()}
    expected = {(c, i): d for c, rows in witnessed.items() for i, d in enumerate(rows)}
    assert got == expected
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{config.bronze_path}`").first()
    assert detail.properties["delta.appendOnly"] == "true"
    assert (detail.minReaderVersion, detail.minWriterVersion) == (1, 2)
