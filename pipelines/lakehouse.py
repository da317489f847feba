"""Where the Delta tables live: checks that the lakehouse root can be written."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pipelines.errors import UserError


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def check_writable(uri: str) -> None:
    """Fail with one sentence if the local lakehouse root cannot be created and written."""
    if is_remote(uri):
        return
    root = Path(uri.removeprefix("file://"))
    probe = root / f".lakecdc-write-probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"the lakehouse path {root} is not writable ({exc.strerror}); choose "
                        "another LAKECDC_LAKEHOUSE / --lakehouse or fix its permissions.") from None
