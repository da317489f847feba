"""Where the lakehouse lives - a local path, S3, ADLS Gen2 or GCS - and what each engine
needs to reach it.

Users write one root, ``LAKECDC_LAKEHOUSE`` (``./lakehouse``, ``/data/lakehouse``,
``s3://bucket/prefix``, ``abfss://container@account.dfs.core.windows.net/prefix``,
``gs://bucket/prefix``). Two engines read and write the tables under it, and this module is
the one place that turns the root into each engine's terms:

- **delta-rs** (shipper, setup, push, status; no JVM; and in the stream, gold's and the
  mirrors' MERGEs and silver's small appends) takes ``s3://`` URIs with storage options:
  the endpoint and region, and plain HTTP allowed when the endpoint is ``http://`` (a local
  S3-compatible server). Commits use S3's put-if-absent (conditional writes), so
  no DynamoDB lock is needed; every lakecdc table has a single writer anyway.
- **Spark outside Databricks** reaches S3 through Hadoop's ``s3a`` connector: paths become
  ``s3a://`` (``spark_path``), the session loads ``hadoop-aws`` of the Hadoop version inside
  pyspark plus the AWS SDK v2 modules it calls (``SPARK_PACKAGES``), and the ``fs.s3a.*``
  settings come from ``spark_conf``. On Databricks the runtime's own S3 access applies:
  paths stay ``s3://`` and nothing is loaded.
- **ADLS Gen2 and GCS** (``abfss://``, ``abfs://``, ``az://``; ``gs://``): delta-rs's object
  store reads the standard variables of each cloud itself (``AZURE_STORAGE_ACCOUNT_NAME``
  with ``AZURE_STORAGE_ACCOUNT_KEY``, a SAS token or a service principal's
  ``AZURE_CLIENT_ID`` / ``AZURE_CLIENT_SECRET`` / ``AZURE_TENANT_ID``; a managed identity;
  ``GOOGLE_SERVICE_ACCOUNT`` or ``GOOGLE_APPLICATION_CREDENTIALS``, or the machine's service
  account), so its options carry nothing; an emulator's endpoint comes the same way
  (``AZURE_STORAGE_ENDPOINT`` with ``AZURE_ALLOW_HTTP``; a service account file's
  ``gcs_base_url``). On Databricks Spark uses the runtime's ABFS and GCS connectors and the
  cluster's credentials.
- **Spark outside Databricks on GCS** loads Google's Hadoop connector, its shaded jar
  (``GCS_CONNECTOR``, resolved once by ``core.spark_jars``), and ``spark_conf`` turns the same
  Google variables delta-rs reads, in delta-rs's order, into the connector's ``fs.gs.*``
  settings (``gcs_spark_conf``). Delta commits there through its GCS log store, which
  delta-spark picks for ``gs://`` itself (put-if-absent). **On ADLS Gen2** it is refused
  with one sentence (``core.store_checks.require_spark_reach``) rather than failing at its
  first read: Hadoop's ABFS driver speaks the DFS endpoint, which no emulator serves, so it
  could not be tested here.

It also names a gold table the same way whichever engine spells its path (``gold_key``).
The checks that the root can be reached and written (``check_writable``, before ``setup``
writes anything) are in ``core.store_checks``.

Credentials are never copied into options or configuration: delta-rs, boto3 and Hadoop each
take them from the standard chain of the cloud (for AWS ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a profile, or the instance role). For GCS
Hadoop is given the key file's path, never the key.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from core.errors import UserError
from core.extras import require

# The Hadoop inside pyspark 4.1.1 (pyspark/jars/hadoop-client-api-3.4.2.jar) and the AWS SDK
# v2 version hadoop-project 3.4.2 builds against. tests/bundle checks the first against the
# installed pyspark, so an upgrade of pyspark that moves Hadoop fails loudly.
HADOOP_VERSION = "3.4.2"
AWS_SDK_VERSION = "2.29.52"
# hadoop-aws declares the 640 MB shaded SDK ``bundle``; the S3A code uses only these SDK
# modules (S3 client, STS for assumed roles, transfer manager for uploads and copies), about
# 15 MB with their dependencies, resolved once into the Ivy cache.
SPARK_PACKAGES = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
    f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:sts:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
)
SPARK_EXCLUDES = "software.amazon.awssdk:bundle"
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"

# Google's Hadoop connector for gs:// (GoogleCloudDataproc/hadoop-connectors), the jar with
# the ``shaded`` classifier: its Google client libraries (Guava, protobuf, gRPC...) are renamed
# inside, so they cannot clash with those in pyspark's jars. The 4.0 line is built against
# HADOOP_VERSION, the Hadoop inside pyspark, and needs Java 17 as Spark 4 does. 3.0.4 (built
# against Hadoop 3.3.6) appends, but Parquet's vectored reads of a data file (a MERGE's, a
# query's) fail with it: it calls a VectoredReadUtils method whose signature Hadoop 3.4.1
# changed (NoSuchMethodError, seen here against fake-gcs-server). 4.0.4 is the newest with files on
# Maven Central (4.0.5 to 4.0.9 are in its metadata, without jars).
# Spark's ``spark.jars.packages`` takes group:artifact:version and no classifier, so
# ``core.spark_jars.classified_jar`` resolves this one with Spark's Ivy and checks it against
# the SHA-256 below (taken from the file whose SHA-1 is Maven Central's published one,
# 7ffdc04d...).
GCS_CONNECTOR = "com.google.cloud.bigdataoss:gcs-connector:4.0.4:shaded"
GCS_CONNECTOR_SHA256 = "dfb5832738686436e597026a8e4bab01aa22e75ebfb15d37d096981f6599d73c"
GCS_FILESYSTEM = "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"
# Hadoop's FileContext API (Spark's streaming checkpoints) goes through this one.
GCS_ABSTRACT_FILESYSTEM = "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS"


# The schemes delta-rs's object store takes for each cloud (ADLS Gen2's ``abfss://`` is
# what Databricks and Hadoop write; ``az://`` and ``abfs://`` name the same store).
AZURE_SCHEMES = ("abfss", "abfs", "az")
GCS_SCHEMES = ("gs",)


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def cloud(uri: str) -> str | None:
    """``"azure"`` or ``"gcs"`` for a root on those stores (S3 has ``is_s3``), else None."""
    scheme = urlparse(uri).scheme
    if scheme in AZURE_SCHEMES:
        return "azure"
    if scheme in GCS_SCHEMES:
        return "gcs"
    return None


def canonical(uri: str) -> str:
    """One spelling per S3 location (``s3://``), e.g. for names that must match across
    engines (locks, progress rows)."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def spark_path(uri: str, on_databricks: bool = False) -> str:
    """The path Spark must be given for ``uri``: ``s3a://`` for S3 outside Databricks."""
    if on_databricks or not uri.startswith("s3://"):
        return uri
    return "s3a://" + uri[len("s3://"):]


@dataclass(frozen=True)
class Lakehouse:
    """The lakehouse root and how to reach it (``endpoint_url``/``region``: S3 only)."""

    root: str
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def from_config(cls, config) -> "Lakehouse":
        return cls(config.lakehouse, config.s3_endpoint_url, config.s3_region)

    @property
    def is_s3(self) -> bool:
        return is_s3(self.root)

    @property
    def cloud(self) -> str | None:
        return cloud(self.root)

    @property
    def bucket(self) -> str:
        return urlparse(self.root).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.root).path.strip("/")

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.startswith("http://"))

    def delta_rs_options(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs; None for a local lakehouse. Empty for Azure and
        GCS: their object stores read every setting from the cloud's own variables."""
        if self.cloud:
            return {}
        if not self.is_s3:
            return None
        options = {}
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.plain_http:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.region:
            options["AWS_REGION"] = self.region
        return options

    @property
    def spark_filesystem(self) -> str | None:
        """The Hadoop FileSystem class a Spark outside Databricks must load for this root;
        None where Hadoop's own serves it (a local path) or lakecdc loads none (Azure)."""
        if self.is_s3:
            return S3A_FILESYSTEM
        return GCS_FILESYSTEM if self.cloud == "gcs" else None

    def spark_conf(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """Session settings for Hadoop's s3a connector, or for the GCS connector from the
        Google variables in ``environ`` (``gcs_spark_conf``); empty for a local or Azure root."""
        if self.cloud == "gcs":
            return gcs_spark_conf(environ)
        if not self.is_s3:
            return {}
        conf = {
            "spark.hadoop.fs.s3a.impl": S3A_FILESYSTEM,
            "spark.jars.excludes": SPARK_EXCLUDES,
            # Delta commits through Spark's S3 log store: safe with one writing driver per
            # table, which lakecdc has.
        }
        if self.endpoint_url:
            # A non-AWS endpoint (MinIO, moto...): path-style addressing, no bucket DNS.
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint_url
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = \
                "false" if self.plain_http else "true"
        if self.region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = self.region
        return conf

    def check(self) -> None:
        """Fail with one sentence unless the bucket exists and these credentials can write
        under the prefix (a probe object is written and deleted)."""
        if not self.bucket:
            raise UserError(f"the lakehouse URI {self.root} has no bucket: write it as "
                            "s3://bucket/prefix (LAKECDC_LAKEHOUSE or --lakehouse).")
        require("s3")
        import boto3
        from botocore.config import Config as BotoConfig
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        session = boto3.session.Session(region_name=self.region)
        if session.get_credentials() is None:
            raise UserError(f"no AWS credentials found for the lakehouse {self.root}: set "
                            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                            "or run with an instance profile; " + ONLY_SPARK)
        client = session.client("s3", endpoint_url=self.endpoint_url, config=BotoConfig(
            connect_timeout=5, read_timeout=20, retries={"max_attempts": 2},
            s3={"addressing_style": "path" if self.endpoint_url else "auto"}))
        probe = "/".join(p for p in (self.prefix, f".lakecdc-write-probe-{uuid.uuid4().hex}")
                         if p)
        try:
            client.head_bucket(Bucket=self.bucket)
            client.put_object(Bucket=self.bucket, Key=probe, Body=b"ok")
            client.delete_object(Bucket=self.bucket, Key=probe)
        except ClientError as exc:
            raise UserError(self._explain(exc.response.get("Error", {}).get("Code", ""),
                                          exc)) from None
        except EndpointConnectionError as exc:
            raise UserError(f"cannot reach S3 at {self.endpoint_url or 'AWS'} for the "
                            f"lakehouse {self.root} ({exc}); check AWS_ENDPOINT_URL and the "
                            "network.") from None
        except BotoCoreError as exc:
            raise UserError(f"cannot use the lakehouse {self.root} ({exc}); check the AWS "
                            "settings (AWS_ENDPOINT_URL, AWS_REGION, credentials).") from None

    def _explain(self, code: str, exc: Exception) -> str:
        if code in ("404", "NoSuchBucket"):
            return (f"the S3 bucket {self.bucket} of the lakehouse {self.root} does not "
                    "exist: create it, or point LAKECDC_LAKEHOUSE / --lakehouse at an "
                    "existing bucket.")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken"):
            return (f"S3 rejected the AWS credentials ({code}) for the lakehouse "
                    f"{self.root}: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or "
                    "refresh the session token.")
        if code in ("403", "AccessDenied"):
            return (f"access to the lakehouse {self.root} was denied to the AWS credentials "
                    "found: grant them s3:ListBucket on the bucket and s3:GetObject, "
                    "s3:PutObject and s3:DeleteObject under the prefix.")
        return f"S3 refused the lakehouse {self.root} ({exc}); check the bucket and its policy."


def gcs_spark_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """The GCS connector's settings (its gcs/CONFIGURATION.md, 4.0.4) from the variables
    delta-rs's object store reads, taken in delta-rs's order, so both engines use the same
    account and endpoint:

    - a service account file (``GOOGLE_SERVICE_ACCOUNT``, or ``GOOGLE_SERVICE_ACCOUNT_PATH``):
      Hadoop signs with its key (``SERVICE_ACCOUNT_JSON_KEYFILE``), or with nothing when the
      file says ``disable_oauth`` (an emulator: ``UNAUTHENTICATED``); the file's
      ``gcs_base_url``, where an emulator's API is, becomes ``fs.gs.storage.root.url``;
    - else Google's application default credentials (``APPLICATION_DEFAULT``):
      ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's own file, then the machine's service
      account, delta-rs's chain too. The connector's default (``COMPUTE_ENGINE``) would go
      straight to the metadata server.

    A key given as JSON text (``GOOGLE_SERVICE_ACCOUNT_KEY``, as the bundle passes it on
    Databricks) the connector cannot take, and lakecdc writes no key to disk: refused with
    one sentence. Hadoop gets the key file's path, and needs it at that path on every
    machine of a cluster."""
    conf = {"spark.hadoop.fs.gs.impl": GCS_FILESYSTEM,
            "spark.hadoop.fs.AbstractFileSystem.gs.impl": GCS_ABSTRACT_FILESYSTEM}
    variable = next((name for name in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH")
                     if environ.get(name)), None)
    if variable is None:
        if environ.get("GOOGLE_SERVICE_ACCOUNT_KEY"):
            raise UserError("Spark outside Databricks reads a Google service account key only "
                            "from a file: write the key of GOOGLE_SERVICE_ACCOUNT_KEY to a file "
                            "only you can read and set GOOGLE_SERVICE_ACCOUNT (or "
                            "GOOGLE_APPLICATION_CREDENTIALS) to its path instead.")
        return {**conf, "spark.hadoop.fs.gs.auth.type": "APPLICATION_DEFAULT"}
    path = os.path.abspath(environ[variable])
    try:
        key = json.loads(Path(path).read_text())
        if not isinstance(key, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise UserError(f"the Google service account file {path} ({variable}) cannot be read "
                        f"({reason}): point {variable} at a service account's JSON key "
                        "file.") from None
    if key.get("gcs_base_url"):
        conf["spark.hadoop.fs.gs.storage.root.url"] = key["gcs_base_url"]
    if key.get("disable_oauth") is True:
        return {**conf, "spark.hadoop.fs.gs.auth.type": "UNAUTHENTICATED"}
    return {**conf, "spark.hadoop.fs.gs.auth.type": "SERVICE_ACCOUNT_JSON_KEYFILE",
            "spark.hadoop.fs.gs.auth.service.account.json.keyfile": path}


def filesystem(uri: str, storage_options: dict | None = None):
    """A pyarrow filesystem for a table's files and the table's root in it: the local
    filesystem, or delta-rs's object store (S3, with the same ``storage_options``)."""
    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), os.path.abspath(parsed.path if parsed.scheme else uri)
    from deltalake.fs import DeltaStorageHandler

    return pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options)), ""


# The buffer for a stream Python writes to on ``filesystem``: delta-rs's object store
# stream takes bytes, and pyarrow hands a Python ``write`` its own Buffer objects (refused:
# "'Buffer' object is not an instance of 'bytes'") unless a buffer in between writes them
# on as plain bytes. Writers inside pyarrow (Parquet) need none.
WRITE_BUFFER = 1 << 16


def under(root: str, name: str) -> str:
    """``name`` below the root ``filesystem`` returned (an object store's paths are relative
    to the URI it was opened on: ``root`` is empty there)."""
    return f"{root.rstrip('/')}/{name}" if root else name


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def delta_rs_uri(path: str) -> str:
    """What delta-rs is given for a table Spark knows as ``path``: its absolute local path,
    or its URI in one spelling (``s3://``)."""
    if is_remote(path):
        return canonical(path.rstrip("/"))
    return os.path.abspath(path.removeprefix("file://").removeprefix("file:"))


def gold_key(gold_path: str) -> str:
    """How the progress table names a gold table: its absolute path, or its URI."""
    return delta_rs_uri(gold_path)


# Where delta-rs finds no credentials, the cluster's Spark may hold them (on Databricks:
# Unity Catalog's external locations): said at the end of each "no credentials" sentence.
ONLY_SPARK = ("where only Spark holds them (a Unity Catalog external location), set "
              "LAKECDC_WRITER=spark.")


# The storage variables the bundle's cluster files set; an optional one left empty means
# unset: delta-rs would take an empty key for a key and never try the identity beside it.
BUNDLE_CLOUD_VARIABLES = ("AWS_REGION", "AZURE_STORAGE_ACCOUNT_NAME",
                          "AZURE_STORAGE_ACCOUNT_KEY", "GOOGLE_SERVICE_ACCOUNT_KEY")


def drop_empty_cloud_variables(environ) -> list[str]:
    """Remove ``BUNDLE_CLOUD_VARIABLES`` set to nothing from ``environ`` (the process's
    own, at the CLI's start, before any engine reads it); returns their names."""
    empty = [name for name in BUNDLE_CLOUD_VARIABLES if environ.get(name) == ""]
    for name in empty:
        del environ[name]
    return empty
