"""Bronze through Spark, without Spark: what each commit's progress map records."""

from bronze.spark_table import progress_map
from bronze.table import Progress


def test_each_commit_carries_every_app_version_recorded_before():
    first = progress_map("s", Progress(0, 100), {}, {"s:rebaseline": 100})
    second = progress_map("s", Progress(150, 160), first["apps"], {"lakecdc-backfill:r1": 2})
    assert second == {"slot": "s", "commit_lsn": 150, "end_lsn": 160,
                      "apps": {"lakecdc-backfill:r1": 2, "s": 150, "s:end_lsn": 160,
                               "s:rebaseline": 100}}


def test_a_newer_version_of_an_app_replaces_the_older():
    apps = progress_map("s", Progress(1, 2), {"s:captured": 3}, {"s:captured": 4})["apps"]
    assert apps["s:captured"] == 4
