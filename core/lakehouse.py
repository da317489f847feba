"""Where the Delta tables live: checks that the lakehouse root can be written."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from core.errors import UserError
from core.storage import Lakehouse, canonical, is_s3


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def gold_key(gold_path: str) -> str:
    """How the progress table names a gold table: its absolute path, or its URI."""
    if is_remote(gold_path):
        return canonical(gold_path.rstrip("/"))
    return os.path.abspath(gold_path.removeprefix("file://").removeprefix("file:"))


def check_writable(uri: str, lakehouse: Lakehouse | None = None) -> None:
    """Fail with one sentence if the lakehouse root cannot be written.

    Local: the directory is created and a probe file written. S3: the credentials are
    found, the bucket exists and a probe object is written under the prefix
    (``Lakehouse.check``). ``lakehouse`` carries the endpoint and region from the
    configuration; without it boto3 reads the standard AWS environment itself.
    """
    if is_s3(uri):
        (lakehouse or Lakehouse(uri)).check()
        return
    if is_remote(uri):
        return       # another object store: its engine reports its own errors
    root = Path(uri.removeprefix("file://"))
    probe = root / f".lakecdc-write-probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"the lakehouse path {root} is not writable ({exc.strerror}); choose "
                        "another LAKECDC_LAKEHOUSE / --lakehouse or fix its permissions.") from None
