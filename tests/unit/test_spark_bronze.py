"""Bronze through Spark, without Spark: what each commit's progress map records, and the
commands that refuse ``LAKECDC_WRITER=spark`` before they change anything."""

import pytest

from bronze.backfill import run_snapshot_backfill
from bronze.spark_table import progress_map
from bronze.table import Progress
from core.config import Config
from core.errors import UserError
from pipelines.setup.tables import add_table, remove_table


def test_each_commit_carries_every_app_version_recorded_before():
    first = progress_map("s", Progress(0, 100), {}, {"s:rebaseline": 100})
    second = progress_map("s", Progress(150, 160), first["apps"], {"lakecdc-backfill:r1": 2})
    assert second == {"slot": "s", "commit_lsn": 150, "end_lsn": 160,
                      "apps": {"lakecdc-backfill:r1": 2, "s": 150, "s:end_lsn": 160,
                               "s:rebaseline": 100}}


def test_a_newer_version_of_an_app_replaces_the_older():
    apps = progress_map("s", Progress(1, 2), {"s:captured": 3}, {"s:captured": 4})["apps"]
    assert apps["s:captured"] == 4


@pytest.mark.parametrize("command", [
    lambda c: run_snapshot_backfill(c),
    lambda c: add_table(c, "public.services"),
    lambda c: remove_table(c, "public.services")])
def test_commands_writing_with_delta_rs_alone_refuse_the_spark_writer(command, tmp_path):
    config = Config.load(env={"LAKECDC_WRITER": "spark"}, lakehouse=str(tmp_path),
                         source_dsn="postgresql://nowhere.invalid/x")
    with pytest.raises(UserError, match="LAKECDC_WRITER=spark"):
        command(config)
    with pytest.raises(Exception) as raised:       # delta-rs's writer: past that check
        command(config.with_(writer="delta-rs"))
    assert "LAKECDC_WRITER=spark" not in str(raised.value)
