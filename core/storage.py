"""Where the lakehouse lives - a local path or S3 - and what each engine needs to reach it.

Users write one root, ``LAKECDC_LAKEHOUSE`` (``./lakehouse``, ``/data/lakehouse``,
``s3://bucket/prefix``). Two engines read and write the tables under it, and this module is
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

It also checks that the root can be written (``check_writable``, before ``setup`` writes
anything) and names a gold table the same way whichever engine spells its path
(``gold_key``).

Credentials are never copied into options or configuration: delta-rs, boto3 and Hadoop each
take them from the standard AWS chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, a profile, or the instance role).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from core.errors import UserError

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


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


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
    def bucket(self) -> str:
        return urlparse(self.root).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.root).path.strip("/")

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.startswith("http://"))

    def delta_rs_options(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs; None for a local lakehouse."""
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

    def spark_conf(self) -> dict[str, str]:
        """Session settings for Hadoop's s3a connector (empty for a local lakehouse)."""
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
        import boto3
        from botocore.config import Config as BotoConfig
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        session = boto3.session.Session(region_name=self.region)
        if session.get_credentials() is None:
            raise UserError(f"no AWS credentials found for the lakehouse {self.root}: set "
                            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                            "or run with an instance profile.")
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


def check_writable(uri: str, lakehouse: Lakehouse | None = None) -> None:
    """Fail with one sentence if the lakehouse root cannot be written.

    Local: the directory is created and a probe file written. S3: the credentials are
    found, the bucket exists and a probe object is written under the prefix
    (``Lakehouse.check``). Another scheme (``abfss://``, ``gs://``, ``dbfs:/``) is refused:
    not every engine lakecdc runs can write it. ``lakehouse`` carries the endpoint and region from the
    configuration; without it boto3 reads the standard AWS environment itself.
    """
    if is_s3(uri):
        (lakehouse or Lakehouse(uri)).check()
        return
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file"):
        raise UserError(f"the lakehouse {uri} is on {scheme}:, which lakecdc cannot write "
                        "yet: use s3:// or a path every process reaches (docs/databricks.md, "
                        "\"Which workspace you have\").")
    root = Path(uri.removeprefix("file://"))
    probe = root / f".lakecdc-write-probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"the lakehouse path {root} is not writable ({exc.strerror}); choose "
                        "another LAKECDC_LAKEHOUSE / --lakehouse or fix its permissions.") from None
