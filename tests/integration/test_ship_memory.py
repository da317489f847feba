"""The shipper's memory does not grow with the size of a transaction.

``lakecdc ship --once`` drains one transaction of 200,000 inserts (~180 MB of wal2json) in a
child process whose own peak RSS is the kernel's high-water mark of its memory
(``bench.decode.ship_once``: not ``wait4``'s, which reports this test process's size for a
child it spawned), against the same command with nothing to ship. The difference is what the
transaction cost: ~50 MB (187 → 239 MB); the shipper that wrote bronze with delta-rs's
writer and 16 MB chunks held ~220 MB more than its base for it (182 → 403 MB).
"""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable

from bench.decode import ship_once
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env
from tests.integration.workload import multi_row_insert

pytestmark = pytest.mark.integration

ROWS = 200_000
MAX_GROWTH_MB = 150


def ship_once_peak_rss_mb(config) -> float:
    return ship_once(config, env=cli_env(config)).peak_rss_mb


def test_peak_rss_through_a_200k_row_transaction_stays_near_the_base(source_db, config):
    setup(config)
    base = ship_once_peak_rss_mb(config)            # imports, checks, an empty peek
    with source_db.connect() as conn:
        multi_row_insert(conn, random.Random(4), ROWS)      # one statement: one transaction
    big = ship_once_peak_rss_mb(config)

    table = DeltaTable(config.bronze_path).to_pyarrow_table(columns=["tx_changes"])
    assert table.num_rows == ROWS
    assert set(table.column("tx_changes").to_pylist()) == {ROWS}
    assert big - base < MAX_GROWTH_MB, (
        f"peak RSS {big:.0f} MB through a {ROWS}-row transaction, {big - base:.0f} MB above "
        f"the {base:.0f} MB of a run with nothing to ship")
