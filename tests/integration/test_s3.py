"""The lakehouse on S3: moto's S3 server on a free port, buckets made with boto3.

- The real CLI (``setup``, the continuous ``run`` killed mid-batch and mid-flight, then
  ``run --once``) on ``s3://bucket/lakehouse``: the shipper writes bronze with delta-rs,
  Spark reads and writes ``s3a://`` through hadoop-aws, and gold read back from S3 equals
  a ``GROUP BY`` of the source exactly.
- Missing credentials and a missing bucket end ``setup`` with one sentence and exit 2.
- The URI mapping and option building, and the pinned Hadoop version against pyspark's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable

from core.layout import SILVER
from core.storage import HADOOP_VERSION, Lakehouse, canonical, spark_path
from tests.tests_support import cli_env, error_line, free_port, listening, run_cli, wait_for
from tests.truth import check_gold, dashboard_counts, source_truth
from tests.integration.workload import mixed

REGION = "us-east-1"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server in a process of its own: in this one, a delta-rs call that keeps
    the GIL while it waits on the server (loading a table's log) would starve the server's
    thread until the request timed out."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: listening(port), timeout=60, interval=0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _aws_env(endpoint: str, credentials: bool = True) -> dict[str, str]:
    """The AWS part of a process's environment. Nothing outside this machine is consulted:
    no shared config files, no instance metadata service."""
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true",
           "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
           "AWS_CONFIG_FILE": "/nonexistent/config"}
    if credentials:
        env.update(AWS_ACCESS_KEY_ID="lakecdc-test", AWS_SECRET_ACCESS_KEY="lakecdc-test")
    return env


def _env(config, lakehouse: str, endpoint: str, credentials: bool = True) -> dict[str, str]:
    env = {k: v for k, v in cli_env(config).items() if not k.startswith("AWS_")}
    env.update(_aws_env(endpoint, credentials), LAKECDC_LAKEHOUSE=lakehouse)
    return env


@pytest.fixture
def bucket(s3_endpoint):
    name = f"lakecdc-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION,
                      aws_access_key_id="lakecdc-test", aws_secret_access_key="lakecdc-test")
    s3.create_bucket(Bucket=name)
    return s3, name


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.long
def test_continuous_run_on_s3_killed_mid_batch_and_mid_flight_ends_exact_in_every_layer(
        source_db, config, s3_endpoint, bucket, traffic, tmp_path, monkeypatch):
    """``lakecdc run`` (continuous, the real CLI in its own process group) on an S3
    lakehouse under traffic: the driver dies with ``kill -9`` semantics right after a
    batch's silver append (its gold step and Spark's commit not written, object-store
    writes mid-way), the group gets SIGKILL; restarted, killed again once gold has moved;
    then drained with ``run --once``: every layer is in the bucket, written by its own
    engine (delta-rs or Spark via s3a), and gold read back from S3 with the options
    lakecdc gives delta-rs, and the dashboard, equal the source. (One test for the
    whole pipeline on S3: a ``setup`` and ``run --once`` of their own would repeat the
    first start and the drain here, a JVM more.)"""
    from tests.soak import Positions, Soak

    s3, name = bucket
    for key, value in _aws_env(s3_endpoint).items():    # delta-rs here, and each run
        monkeypatch.setenv(key, value)
    on_s3 = config.with_(lakehouse=f"s3://{name}/lakehouse")
    env = _env(config, on_s3.lakehouse, s3_endpoint)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    purged = mixed(source_db.dsn, seed=63)

    soak = Soak(on_s3, tmp_path)
    assert soak.cycle(fault="after_silver_append:1").exit_code == 137
    silver = DeltaTable(on_s3.table_path(SILVER))
    assert json.loads(silver.history(1)[0]["userMetadata"])["batch_id"] == 0
    gold = Positions.read(on_s3).gold
    soak.cycle(until=lambda: Positions.read(on_s3).gold > gold, then_s=1)
    assert traffic() > 0
    purged.update(mixed(source_db.dsn, seed=64))
    soak.drain()
    check_gold(on_s3.lakehouse, source_db.dsn, on_s3.dashboard, purged)

    # Every layer is in the bucket, written by its own engine (delta-rs or Spark via s3a).
    lakehouse = on_s3.lakehouse
    for table in ("bronze/wal2json_changes", "silver/changes", "gold/service_stats"):
        listed = s3.list_objects_v2(Bucket=name, Prefix=f"lakehouse/{table}/_delta_log/")
        assert listed.get("KeyCount", 0) > 0, f"{table} is not on S3"

    options = Lakehouse(lakehouse, s3_endpoint, REGION).delta_rs_options()
    credentials = {"AWS_ACCESS_KEY_ID": "lakecdc-test", "AWS_SECRET_ACCESS_KEY": "lakecdc-test"}
    rows = DeltaTable(f"{lakehouse}/gold/service_stats",
                      storage_options={**options, **credentials}).to_pyarrow_table().to_pylist()
    gold = Counter({(r["service_id"], r["template_id"], r["notification_type"],
                     r["notification_status"]): r["count"] for r in rows if r["count"]})
    truth = Counter({k: v for k, v in source_truth(source_db.dsn, purged).items() if v})
    assert sum(truth.values()) > 0
    assert gold == truth, (
        f"gold on S3 differs from the source on {len(set(gold) ^ set(truth))} keys")
    assert Counter({k: v for k, v in dashboard_counts(source_db.dsn).items() if v}) == gold


@pytest.mark.integration
def test_setup_without_credentials_is_one_sentence_and_exit_2(config, s3_endpoint, bucket):
    _, name = bucket
    result = run_cli(["setup"], _env(config, f"s3://{name}/lakehouse", s3_endpoint,
                                     credentials=False))
    assert "no AWS credentials" in error_line(result)


@pytest.mark.integration
def test_setup_with_a_missing_bucket_is_one_sentence_and_exit_2(config, s3_endpoint, bucket):
    s3, _ = bucket
    missing = f"lakecdc-missing-{uuid.uuid4().hex[:8]}"
    result = run_cli(["setup"], _env(config, f"s3://{missing}/lakehouse", s3_endpoint))
    line = error_line(result)
    assert f"bucket {missing}" in line and "does not exist" in line
    assert missing not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_spark_paths_and_engine_options():
    assert spark_path("s3://b/lake/gold/service_stats") == "s3a://b/lake/gold/service_stats"
    assert spark_path("s3://b/lake", on_databricks=True) == "s3://b/lake"
    assert spark_path("/data/lakehouse/gold") == "/data/lakehouse/gold"
    assert canonical("s3a://b/lake") == "s3://b/lake"
    local = Lakehouse("/data/lakehouse")
    assert local.delta_rs_options() is None and local.spark_conf() == {}
    minio = Lakehouse("s3://b/lake", "http://127.0.0.1:9000", "eu-west-2")
    assert minio.delta_rs_options() == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                        "AWS_ALLOW_HTTP": "true", "AWS_REGION": "eu-west-2"}
    conf = minio.spark_conf()
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    aws = Lakehouse("s3://b/lake", None, "eu-west-2")
    assert "spark.hadoop.fs.s3a.endpoint" not in aws.spark_conf()
    assert "AWS_ALLOW_HTTP" not in aws.delta_rs_options()


def test_hadoop_aws_matches_the_hadoop_inside_pyspark():
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    versions = {p.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
                for p in jars.glob("hadoop-client-api-*.jar")}
    assert versions == {HADOOP_VERSION}, \
        f"pyspark ships Hadoop {versions}; update HADOOP_VERSION and AWS_SDK_VERSION"
