"""The lakehouse on ADLS Gen2 (``abfss://``): Azurite's Blob service on a free port.

- The real CLI's delta-rs commands on ``abfss://<container>@devstoreaccount1.dfs.core.
  windows.net/lakehouse``: ``setup`` (probe, slot, exact baseline), ``ship --once``,
  ``status`` and ``maintain --once``. Bronze read back from Azurite holds every witnessed
  transaction exactly once (I1, against a second slot), and the baseline equals a
  ``GROUP BY`` of the source at the slot's point.
- Spark outside Databricks is refused with one sentence: Hadoop's ABFS driver speaks the
  DFS endpoint, which Azurite does not serve, so the stream's side is untested here
  (docs/storage.md).
- Missing credentials and a missing container end ``setup`` with one sentence and exit 2,
  before anything is made.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from deltalake import DeltaTable

from core.storage import Lakehouse, cloud, spark_path
from tests.cloud_servers import (AZURITE_ACCOUNT, AZURITE_KEY, azurite, blob_names,
                                 make_container)
from tests.tests_support import cli_env, error_line, run_cli
from tests.truth import Witness, check_bronze, source_truth
from tests.integration.workload import mixed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def blob_endpoint(tmp_path_factory):
    with azurite(tmp_path_factory.mktemp("azurite")) as endpoint:
        yield endpoint


@pytest.fixture
def container(blob_endpoint):
    name = f"lakecdc-{uuid.uuid4().hex[:12]}"
    make_container(blob_endpoint, name)
    return name


def _azure_env(endpoint: str, credentials: bool = True) -> dict[str, str]:
    """The Azure part of a process's environment, as a cluster would have it: the account,
    its key, and (an emulator only) the endpoint and plain HTTP."""
    env = {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ENDPOINT": endpoint,
           "AZURE_ALLOW_HTTP": "true"}
    if credentials:
        env["AZURE_STORAGE_ACCOUNT_KEY"] = AZURITE_KEY
    return env


def _env(config, lakehouse: str, endpoint: str, credentials: bool = True) -> dict[str, str]:
    env = {k: v for k, v in cli_env(config).items() if not k.startswith("AZURE_")}
    env.update(_azure_env(endpoint, credentials), LAKECDC_LAKEHOUSE=lakehouse)
    return env


def _root(container: str) -> str:
    return f"abfss://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/lakehouse"


def test_the_delta_rs_commands_on_azure_are_exact(source_db, config, blob_endpoint, container,
                                                  monkeypatch):
    for key, value in _azure_env(blob_endpoint).items():     # delta-rs in this process
        monkeypatch.setenv(key, value)
    lakehouse = _root(container)
    env = _env(config, lakehouse, blob_endpoint)
    mixed(source_db.dsn, seed=71)                   # rows that exist before the slot
    truth = Counter({k: v for k, v in source_truth(source_db.dsn).items() if v})
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    baseline = DeltaTable(f"{lakehouse}/gold/_baseline").to_pyarrow_table().to_pylist()
    counted = Counter({(r["service_id"], r["template_id"], r["notification_type"],
                        r["notification_status"]): r["count"] for r in baseline if r["count"]})
    assert sum(truth.values()) > 0 and counted == truth, \
        "the baseline on Azure differs from the source at the slot's point"

    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        mixed(source_db.dsn, seed=72)
        shipped = run_cli(["ship", "--once"], env)
        assert shipped.returncode == 0 and "shipped" in shipped.stdout, shipped.stderr[-3000:]
        check_bronze(f"{lakehouse}/bronze/wal2json_changes", witness.transactions())
    finally:
        witness.drop()

    status = run_cli(["status", "--json"], env)     # 5: only bronze holds changes yet
    assert status.returncode == 5, status.stderr[-3000:]
    assert json.loads(status.stdout), status.stdout[-2000:]
    maintained = run_cli(["maintain", "--once"], env)
    assert maintained.returncode == 0, maintained.stderr[-3000:]
    for table in ("bronze/wal2json_changes", "gold/_baseline"):
        assert blob_names(blob_endpoint, container, f"lakehouse/{table}/_delta_log/"), \
            f"{table} is not in the container"


def test_spark_outside_databricks_is_refused_with_one_sentence(config, blob_endpoint,
                                                               container):
    env = _env(config, _root(container), blob_endpoint)
    error_line(run_cli(["stream", "--once"], env), "Spark outside Databricks", "abfss://")


def test_setup_without_credentials_is_one_sentence_and_exit_2(source_db, config,
                                                              blob_endpoint, container):
    """As a bundle deploys it without a key: AZURE_STORAGE_ACCOUNT_KEY set but empty."""
    env = _env(config, _root(container), blob_endpoint, credentials=False)
    result = run_cli(["setup"], {**env, "AZURE_STORAGE_ACCOUNT_KEY": ""})
    error_line(result, "no Azure credentials", "AZURE_STORAGE_ACCOUNT_KEY", "LAKECDC_WRITER=spark")
    assert blob_names(blob_endpoint, container, "") == []
    with source_db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0


def test_setup_with_a_missing_container_is_one_sentence_and_exit_2(config, blob_endpoint):
    missing = f"lakecdc-missing-{uuid.uuid4().hex[:8]}"
    line = error_line(run_cli(["setup"], _env(config, _root(missing), blob_endpoint)))
    assert f"container {missing}" in line and "does not exist" in line


def test_azure_uris_reach_delta_rs_unchanged():
    root = "abfss://lake@acct.dfs.core.windows.net/lakecdc"
    assert cloud(root) == "azure" and cloud("az://lake/x") == "azure"
    assert cloud("gs://b/x") == "gcs" and cloud("s3://b/x") is None and cloud("/x") is None
    assert spark_path(root) == root and spark_path(root, on_databricks=True) == root
    assert Lakehouse(root).delta_rs_options() == {} and Lakehouse(root).spark_conf() == {}


def test_setup_with_a_wrong_key_is_one_sentence_and_exit_2(config, blob_endpoint, container):
    env = _env(config, _root(container), blob_endpoint)
    env["AZURE_STORAGE_ACCOUNT_KEY"] = AZURITE_KEY[:-8] + "AAAAAA=="
    error_line(run_cli(["setup"], env), "Azure rejected the credentials")
