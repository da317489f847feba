"""The jars Spark resolves for ``spark.jars.packages``, remembered from one start to the next.

Spark resolves ``spark.jars.packages`` through Ivy at every JVM start, even when every jar is
in Ivy's cache already: it reads the cache's module descriptors, resolves the graph again
and prints its report, a second or more of every ``lakecdc`` command that starts Spark
(docs/operations.md, "Spark's jars").

So the first start resolves the packages as before (from Maven Central, into Ivy's cache),
and ``remember`` records the local files Spark resolved them to. A later start with the
same packages and the same Ivy settings (``start_conf``) passes those files as
``spark.jars`` instead, which is what Spark itself does with what it resolves: on the
driver's class path, and fetched from the driver by a cluster's executors. A record
whose files are not all there any more is ignored, and that start resolves again.

The records are small text files under ``~/.ivy2.5.2/lakecdc/`` (``RECORDS``), one per set
of packages and settings, named by their digest, written whole (a file of its own, renamed
into place). Delete the folder to make the next start resolve again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger("lakecdc.spark")

IVY_HOME = Path.home() / ".ivy2.5.2"         # Spark 4's Ivy home (``spark.jars.ivy`` unset)
RECORDS = IVY_HOME / "lakecdc"
PACKAGES = "spark.jars.packages"
JARS = "spark.jars"
# What Spark's resolution depends on, besides the packages: a change to any of them is a
# record of its own.
RESOLUTION_KEYS = (PACKAGES, "spark.jars.excludes", "spark.jars.repositories",
                   "spark.jars.ivy", "spark.jars.ivySettings")


def record_path(conf: dict[str, str]) -> Path:
    """Where the jars resolved for ``conf``'s packages and Ivy settings are recorded (under
    ``RECORDS``, read when called)."""
    key = "\n".join(f"{name}={conf.get(name, '')}" for name in RESOLUTION_KEYS)
    return RECORDS / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.jars"


def start_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` as a JVM's start takes it: when a start before recorded the jars of these
    packages (and every one of those files is still there), the packages' settings are
    replaced by those files, after ``conf``'s own ``spark.jars``; else ``conf`` itself."""
    if not conf.get(PACKAGES):
        return conf
    recorded = _read(record_path(conf))
    if recorded is None:
        return conf
    out = {name: value for name, value in conf.items() if name not in RESOLUTION_KEYS}
    out[JARS] = ",".join(jar for jar in (conf.get(JARS), *recorded) if jar)
    return out


def remember(conf: dict[str, str], started_jars: str) -> None:
    """After a start that resolved ``conf``'s packages: record the files it resolved them to.
    ``started_jars`` is the started session's ``spark.jars``: ``conf``'s own jars, then the
    resolved ones (Spark puts them in that order). Nothing is recorded where it cannot be
    written, and the next start resolves again."""
    own = {_file(jar) for jar in (conf.get(JARS) or "").split(",") if jar}
    resolved = [path for path in (_file(jar) for jar in started_jars.split(",") if jar)
                if path not in own]
    if not resolved or not all(os.path.isfile(path) for path in resolved):
        return
    target = record_path(conf)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".",
                                         delete=False) as out:
            out.write("\n".join(resolved) + "\n")
        os.replace(out.name, target)
    except OSError as exc:          # a home folder this user cannot write: resolve each time
        log.debug("cannot record Spark's resolved jars in %s: %s", target.parent, exc)


def _read(record: Path) -> list[str] | None:
    try:
        paths = [line for line in record.read_text().splitlines() if line]
    except OSError:
        return None
    return paths if paths and all(os.path.isfile(path) for path in paths) else None


def _file(jar: str) -> str:
    """A ``spark.jars`` entry (a path or a ``file:`` URL) as a local path."""
    parsed = urlparse(jar)
    return unquote(parsed.path) if parsed.scheme == "file" else jar
