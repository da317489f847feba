"""The checks that the lakehouse can be reached and written, each failure one sentence.

- ``check_writable`` (before ``setup`` writes anything): a probe written where delta-rs
  writes - a local directory, S3 (``core.storage.Lakehouse.check``), or Azure and GCS through
  delta-rs's own object store (``check_object_store``, its errors told apart by
  ``explain_store_error``);
- ``check_spark_writable`` (``LAKECDC_WRITER=spark``): a probe written and read back by Spark;
- ``require_spark_reach``: a Spark session outside Databricks refused for an Azure lakehouse.

Where the lakehouse is and how each engine reaches it is ``core.storage``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import urlparse

from core.errors import UserError
from core.storage import (
    ONLY_SPARK,
    WRITE_BUFFER,
    Lakehouse,
    cloud,
    is_remote,
    is_s3,
    on_databricks,
    spark_path,
)

# A probe of an object store gives up after this long instead of delta-rs's default three
# minutes of retries: a wrong endpoint or a missing token service is one sentence quickly.
PROBE_OPTIONS = {"timeout": "20s", "connect_timeout": "5s", "max_retries": "1",
                 "retry_timeout": "20s"}


def check_writable(uri: str, lakehouse: Lakehouse | None = None) -> None:
    """Fail with one sentence if the lakehouse root cannot be written.

    Local: the directory is created and a probe file written. S3: the credentials are
    found, the bucket exists and a probe object is written under the prefix
    (``Lakehouse.check``). Azure and GCS: the same, through delta-rs's own object store
    (``check_object_store``). Another scheme (``dbfs:/``, ``wasbs://``...) is refused: not
    every engine lakecdc runs can write it. ``lakehouse`` carries the endpoint and region
    from the configuration; without it boto3 reads the standard AWS environment itself.
    """
    if is_s3(uri):
        (lakehouse or Lakehouse(uri)).check()
        return
    if cloud(uri):
        check_object_store(uri)
        return
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file"):
        raise UserError(f"the lakehouse {uri} is on {scheme}:, which lakecdc cannot write: "
                        "use s3://, abfss://, gs:// or a path every process reaches "
                        "(docs/databricks.md, \"Which workspace you have\").")
    root = Path(uri.removeprefix("file://"))
    probe = root / f".lakecdc-write-probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"the lakehouse path {root} is not writable ({exc.strerror}); choose "
                        "another LAKECDC_LAKEHOUSE / --lakehouse or fix its permissions.") from None


def check_spark_writable(spark, uri: str) -> None:
    """``LAKECDC_WRITER=spark``: fail with one sentence unless Spark can write and read back
    under the lakehouse root ``uri`` - the only engine holding its credentials then (Unity
    Catalog external locations). The probe (one row of Parquet) is overwritten by the next
    check rather than deleted: Spark has no public delete of a path. A local root keeps
    ``check_writable``'s checks first (it creates the directory)."""
    from core.errors import first_line

    if not is_remote(uri):
        check_writable(uri)
    probe = spark_path(f"{uri.rstrip('/')}/_lakecdc/write_probe", on_databricks())
    try:
        spark.range(1).write.mode("overwrite").parquet(probe)
        if spark.read.parquet(probe).count() != 1:
            raise RuntimeError("the probe written could not be read back")
    except Exception as exc:
        raise UserError(f"Spark cannot write the lakehouse {uri} ({first_line(exc)[:300]}); "
                        "grant this cluster write access to it (with LAKECDC_WRITER=spark, "
                        "Spark's own storage settings are the ones used).") from None


_STORE = {"azure": ("Azure", "container", "AZURE_STORAGE_ACCOUNT_NAME with "
                    "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or a service "
                    "principal (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID)"),
          "gcs": ("Google", "bucket", "GOOGLE_APPLICATION_CREDENTIALS (or "
                  "GOOGLE_SERVICE_ACCOUNT) to a service account key file, or run on a "
                  "cluster with a service account")}


def check_object_store(uri: str) -> None:
    """Azure or GCS: list under the prefix (credentials, the container or bucket), then
    write and delete a probe object, with delta-rs's own object store - the client every
    delta-rs writer then uses, reading the same variables. Each failure is one sentence;
    retries are cut short (``PROBE_OPTIONS``)."""
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    parsed = urlparse(uri)
    store = cloud(uri)
    _, noun, _ = _STORE[store]
    if not parsed.netloc or (store == "azure" and parsed.scheme != "az"
                             and not parsed.netloc.split("@")[0]):
        example = ("abfss://container@account.dfs.core.windows.net/prefix" if store == "azure"
                   else "gs://bucket/prefix")
        raise UserError(f"the lakehouse URI {uri} has no {noun}: write it as {example} "
                        "(LAKECDC_LAKEHOUSE or --lakehouse).")
    probe = f".lakecdc-write-probe-{uuid.uuid4().hex}"
    try:
        fs = pafs.PyFileSystem(DeltaStorageHandler(uri.rstrip("/"), dict(PROBE_OPTIONS)))
        fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
        with fs.open_output_stream(probe, buffer_size=WRITE_BUFFER) as out:
            out.write(b"ok")
        fs.delete_file(probe)
    except (OSError, ValueError, RuntimeError) as exc:
        raise UserError(explain_store_error(uri, str(exc))) from None


def explain_store_error(uri: str, message: str) -> str:
    """The one sentence for an object store's failure on the lakehouse ``uri``: the object
    store's errors are text, so the known cases are told apart by the service's own codes
    in it."""
    store = cloud(uri)
    cloud_name, noun, how = _STORE[store]
    parsed = urlparse(uri)
    container = parsed.netloc.split("@")[0]
    # Only the service's answer counts: the URI (a container named "missing") must not.
    text = message.replace(uri, "").lower()
    # Azure's and GCS's codes; fake-gcs-server says "no bucket named" (with a 500).
    if "containernotfound" in text or "nosuchbucket" in text or "no bucket named" in text \
            or "404 not found" in text:
        return (f"the {cloud_name} {noun} {container} of the lakehouse {uri} does not exist: "
                "create it, or point LAKECDC_LAKEHOUSE / --lakehouse at an existing "
                f"{noun}.")
    if "token request" in text or "metadata" in text or "credential" in text:
        return f"no {cloud_name} credentials found for the lakehouse {uri}: set {how}; " \
               + ONLY_SPARK
    if "authenticationfailed" in text or "failed to authenticate" in text \
            or "401" in text or "invalid_grant" in text:
        return f"{cloud_name} rejected the credentials for the lakehouse {uri}: check {how}."
    if "403" in text or "permission" in text or "privileges" in text:
        return (f"access to the lakehouse {uri} was denied to the {cloud_name} credentials "
                f"found: grant them read, write and delete on the {noun} under the prefix.")
    if "error sending request" in text or "connect" in text or "dns" in text:
        return (f"cannot reach {cloud_name} storage for the lakehouse {uri}: check the "
                "network and any endpoint setting (AZURE_STORAGE_ENDPOINT; a service account "
                "file's gcs_base_url).")
    first = message.strip().splitlines()[0][:200] if message.strip() else "unknown error"
    return f"{cloud_name} storage refused the lakehouse {uri} ({first}); check the {noun} " \
           "and the credentials."




def require_spark_reach(lakehouse: Lakehouse | None, databricks: bool) -> None:
    """A Spark session for an Azure lakehouse outside Databricks is refused with one
    sentence: lakecdc loads no ABFS connector into a local Spark (Hadoop's ABFS driver needs
    the DFS endpoint no emulator serves, so it could not be tested here), and without one
    every Spark read would fail at its first batch. GCS has its connector (``spark_conf``)."""
    if databricks or lakehouse is None or lakehouse.cloud != "azure":
        return
    raise UserError(f"Spark outside Databricks cannot reach the lakehouse {lakehouse.root}: "
                    "run the Spark stages (stream, mirrors, verify, quality, backfill) on "
                    "Databricks, whose runtime has the connector (docs/storage.md); ship, "
                    "push, status and maintain run anywhere.")
