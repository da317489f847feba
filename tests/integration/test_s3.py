"""The lakehouse on S3: moto's S3 server on a free port, buckets made with boto3.

- The real CLI (``setup``, ``run --once``) on ``s3://bucket/lakehouse``: the shipper writes
  bronze with delta-rs, Spark reads and writes ``s3a://`` through hadoop-aws, and gold read
  back from S3 equals a ``GROUP BY`` of the source exactly.
- Missing credentials and a missing bucket end ``setup`` with one sentence and exit 2.
- The URI mapping and option building, and the pinned Hadoop version against pyspark's.
"""

from __future__ import annotations

import socket
import uuid
from collections import Counter
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable

from core.storage import HADOOP_VERSION, Lakehouse, canonical, spark_path
from tests.tests_support import cli_env, error_line, run_cli
from tests.truth import dashboard_counts, source_truth
from tests.integration.workload import mixed

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


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
def test_the_whole_pipeline_on_s3_is_exact(source_db, config, s3_endpoint, bucket):
    s3, name = bucket
    lakehouse = f"s3://{name}/lakehouse"
    env = _env(config, lakehouse, s3_endpoint)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    purged = mixed(source_db.dsn, seed=61)
    run = run_cli(["run", "--once"], env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]

    # Every layer is in the bucket, written by its own engine (delta-rs or Spark via s3a).
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
    assert gold == truth, f"gold on S3 differs from the source on {len(set(gold) ^ set(truth))} keys"
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
