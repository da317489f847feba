"""A Spark start after the first takes the Delta jars the first one resolved
(``core.spark_jars``): Ivy does not run again, and Delta works. Each start is a process of
its own, as each ``lakecdc`` command is; their records are kept in this test's folder, so
the first start here resolves whatever other starts recorded. The starts have a jar of
their own in ``spark.jars`` besides, as a ``gs://`` lakehouse's have the GCS connector:
Spark then lists the resolved jars elsewhere than in ``spark.jars``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tests_support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.spark]

START = """
import sys
from pathlib import Path
from core import spark_jars
from core.spark import get_or_create

spark_jars.RECORDS = Path(sys.argv[1])
import pyspark
own = sorted(Path(pyspark.__file__).parent.glob("jars/ivy-*.jar"))[-1]
spark = get_or_create("spark-start-test", output=sys.argv[2],
                      extra_conf={"spark.jars": str(own)})
spark.range(3).write.format("delta").mode("append").save(sys.argv[3])
print(spark.read.format("delta").load(sys.argv[3]).count())
"""
REPORT = ":: resolution report ::"


def test_a_second_start_takes_the_jars_the_first_resolved_and_delta_works(tmp_path):
    records = tmp_path / "records"

    def start(n: int) -> tuple[int, str]:
        log = tmp_path / f"spark-{n}.log"
        result = subprocess.run([sys.executable, "-c", START, str(records), str(log),
                                 str(tmp_path / "table")], cwd=ROOT, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return int(result.stdout.split()[-1]), log.read_text()

    rows, first = start(1)
    assert rows == 3 and REPORT in first, first[-3000:]     # no record yet: Ivy resolves
    (record,) = records.iterdir()
    jars = record.read_text().split()
    assert any("delta-spark" in jar for jar in jars) and all(j.endswith(".jar") for j in jars)
    assert not any("/ivy-" in jar for jar in jars), jars         # its own jar is not recorded
    rows, second = start(2)
    assert rows == 6 and REPORT not in second and ":: resolving" not in second, second[-3000:]
