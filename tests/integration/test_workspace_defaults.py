"""A workspace whose Spark defaults turn on deletion vectors, column mapping and row
tracking for every new table (``spark.databricks.delta.properties.defaults.*``, as
Databricks workspaces set them): ``setup``, ``run``, ``verify`` and ``quality`` are exact,
every table lakecdc made is plain; a table made with such a feature is refused with one
sentence and nothing half-applied, where without the check delta-rs read NULLs."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from core.features import unreadable
from core.spark import session_conf
from tests.integration.workload import mixed
from tests.tests_support import WORKSPACE_DEFAULTS, cli_env, error_line
from tests.truth import check_gold, dashboard_counts, source_truth

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def delta_tables(lakehouse: str) -> list[Path]:
    return sorted(p.parent for p in Path(lakehouse).rglob("_delta_log")
                  if DeltaTable.is_deltatable(str(p.parent)))


def test_setup_run_verify_and_quality_are_exact_under_the_workspace_defaults(
        source_db, config, spark, cli_here):
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all"}
    with session_conf(spark, WORKSPACE_DEFAULTS):
        assert cli_here(["setup"], env).returncode == 0
        purged = mixed(source_db.dsn, seed=41)
        done = cli_here(["run", "--once"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
        verified = cli_here(["verify"], env)
        assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
        assert "mirror public.notifications: exact" in verified.stdout, verified.stdout
        checked = cli_here(["quality"], env)
        assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    tables = delta_tables(config.lakehouse)
    assert {"wal2json_changes", "changes", "quarantine", "service_stats", "_quality"} \
        <= {p.name for p in tables}
    assert {str(p): unreadable(DeltaTable(str(p))) for p in tables} == \
        {str(p): [] for p in tables}


@pytest.mark.parametrize("checked", [True, False], ids=["table_features", "negative_control"])
def test_tables_made_under_the_defaults_without_lakecdc_s_properties_are_refused(
        source_db, config, spark, cli_here, monkeypatch, checked):
    """Tables made as before lakecdc stated their features (``core.spark_tables.PLAIN`` empty),
    under a workspace default of column mapping: refused with one sentence naming it, the
    dashboard given nothing. Without the check (``core.features.unreadable``), delta-rs
    read the column-mapped tables' rows as NULLs and the run could not end exact."""
    monkeypatch.setattr("core.spark_tables.PLAIN", {})
    if not checked:
        monkeypatch.setattr("core.features.unreadable", lambda table: [])
    env = cli_env(config)
    mapped = {"spark.databricks.delta.properties.defaults.columnMapping.mode": "name"}
    with session_conf(spark, mapped):
        set_up = cli_here(["setup"], env)
        purged = mixed(source_db.dsn, seed=43)
        done = cli_here(["run", "--once"], env) if set_up.returncode == 0 else set_up
    if checked:
        error_line(done, "columnMapping", "docs/databricks.md")
        assert not dashboard_counts(source_db.dsn)            # nothing half-applied
    else:   # set up without a word, then the push stages the NULLs delta-rs read
        assert set_up.returncode == 0, set_up.stderr[-3000:]
        truth = {k: v for k, v in source_truth(source_db.dsn, purged).items() if v}
        shown = {k: v for k, v in dashboard_counts(source_db.dsn).items() if v}
        assert "NotNullViolation" in done.stderr or shown != truth, done.stderr[-3000:]
