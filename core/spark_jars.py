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

One artifact Spark's packages cannot name: ``spark.jars.packages`` takes
``group:artifact:version`` and no classifier (SPARK-20075), and Google's GCS connector is
used as its ``shaded`` jar. ``classified_jar`` resolves it with the same resolver, Ivy (the
jar in Spark's own ``jars`` folder), from the same kind of repository (Maven's layout: Maven
Central by Ivy's own default, or ``spark.jars.repositories``, or the user's whole
``spark.jars.ivySettings``), into Spark's Ivy cache, and records it the same way. Only the
artifact is fetched, not its POM: the connector's POM imports some 450 others (its parent
and Google's BOMs), which Ivy took 90 s to read for a jar whose dependencies are inside it.

The records are small text files under ``~/.ivy2.5.2/lakecdc/`` (``RECORDS``), one per set
of packages and settings, named by their digest, written whole (a file of its own, renamed
into place). Delete the folder to make the next start resolve again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse
from xml.sax.saxutils import quoteattr

from core.errors import UserError

log = logging.getLogger("lakecdc.spark")

IVY_HOME = Path.home() / ".ivy2.5.2"         # Spark 4's Ivy home (``spark.jars.ivy`` unset)
RECORDS = IVY_HOME / "lakecdc"
PACKAGES = "spark.jars.packages"
JARS = "spark.jars"
# Every local jar a started session has: its own ``spark.jars`` and those Ivy resolved.
LOCAL_JARS = "spark.repl.local.jars"
# What Spark's resolution depends on, besides the packages: a change to any of them is a
# record of its own.
RESOLUTION_KEYS = (PACKAGES, "spark.jars.excludes", "spark.jars.repositories",
                   "spark.jars.ivy", "spark.jars.ivySettings")
# The XML namespace of Maven's attributes in an Ivy module descriptor (``m:classifier``): a
# name Ivy matches, not an address it reaches.
IVY_MAVEN_NAMESPACE = "http://ant.apache.org/ivy/maven"


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
    ``started_jars`` is the started session's ``LOCAL_JARS``: ``conf``'s own jars, then the
    resolved ones (Spark puts them in that order; its ``spark.jars`` lists the resolved ones
    only where ``conf`` has no jars of its own). Nothing is recorded where it cannot be
    written, and the next start resolves again."""
    own = {_file(jar) for jar in (conf.get(JARS) or "").split(",") if jar}
    resolved = [path for path in (_file(jar) for jar in started_jars.split(",") if jar)
                if path not in own]
    if not resolved or not all(os.path.isfile(path) for path in resolved):
        return
    _write(record_path(conf), resolved)


def classified_jar(coordinate: str, sha256: str, conf: dict[str, str]) -> str:
    """The local file of the Maven artifact ``group:artifact:version:classifier``, a jar,
    for ``spark.jars``: from its record when a start before resolved it, else resolved by
    Ivy (``ivy_command``), checked against ``sha256`` and recorded. ``conf``'s repositories
    and Ivy settings are used as Spark would use them for its packages, and are part of the
    record's key. ``UserError`` if it cannot be resolved or is not the expected file."""
    key = {name: conf.get(name, "") for name in RESOLUTION_KEYS} | {PACKAGES: coordinate}
    recorded = _read(record_path(key))
    if recorded:
        return recorded[0]
    with tempfile.TemporaryDirectory(prefix="lakecdc-ivy-") as work:
        command = ivy_command(coordinate, conf, Path(work))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"cannot run Ivy to resolve {coordinate} for Spark ({exc}): "
                            "lakecdc needs Java 17 (JAVA_HOME or java on the PATH).") from None
        listed = Path(work, "path.txt")
        jar = listed.read_text().strip() if done.returncode == 0 and listed.exists() else ""
    if not jar or not os.path.isfile(jar):
        said = [line.strip() for line in (done.stdout + done.stderr).splitlines()
                if line.strip() and not line.startswith(".")]
        raise UserError(f"cannot resolve {coordinate} for Spark from its Maven repository "
                        f"({said[-1] if said else f'Ivy exited {done.returncode}'}): let this "
                        "machine reach Maven Central, or name a mirror in "
                        "spark.jars.repositories.")
    digest = hashlib.sha256()
    with open(jar, "rb") as found:
        while chunk := found.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise UserError(f"the file resolved for {coordinate}, {jar}, is not the expected one "
                        f"(SHA-256 {digest.hexdigest()}): delete it and check the repository "
                        "or mirror it came from.")
    _write(record_path(key), [jar])
    log.info("resolved %s for Spark into %s", coordinate, jar)
    return jar


def ivy_command(coordinate: str, conf: dict[str, str], work: Path) -> list[str]:
    """The Ivy run that resolves ``coordinate`` (``group:artifact:version:classifier``, no
    dependencies) into Spark's Ivy cache and writes its file's path to ``work/path.txt``.
    Ivy is the jar Spark itself resolves packages with; its settings, written to ``work``,
    are ``conf``'s ``spark.jars.ivySettings`` where it names a file, else one Maven-layout
    resolver per ``spark.jars.repositories`` entry, then Ivy's default one (Maven Central),
    each reading no POM."""
    from pyspark.find_spark_home import _find_spark_home

    ivy = sorted(Path(_find_spark_home(), "jars").glob("ivy-*.jar"))
    if not ivy:
        raise UserError(f"Spark's jars ({_find_spark_home()}/jars) hold no Ivy jar to resolve "
                        f"{coordinate} with: reinstall pyspark, or point SPARK_HOME at a "
                        "whole Spark.")
    group, artifact, version, classifier = coordinate.split(":")
    (work / "ivy.xml").write_text(
        f'<ivy-module version="2.0" xmlns:m="{IVY_MAVEN_NAMESPACE}">'
        '<info organisation="lakecdc" module="spark-jars"/><dependencies>'
        f'<dependency org={quoteattr(group)} name={quoteattr(artifact)} '
        f'rev={quoteattr(version)} transitive="false">'
        f'<artifact name={quoteattr(artifact)} type="jar" ext="jar" '
        f'm:classifier={quoteattr(classifier)}/></dependency></dependencies></ivy-module>')
    settings = conf.get("spark.jars.ivySettings")
    if not settings:
        roots = [r.strip() for r in conf.get("spark.jars.repositories", "").split(",")
                 if r.strip()]
        resolvers = "".join(
            f'<ibiblio name="repo{i}" m2compatible="true" usepoms="false" '
            f'root={quoteattr(root)}/>' for i, root in enumerate(roots))
        settings = str(work / "ivysettings.xml")
        Path(settings).write_text(
            '<ivysettings><settings defaultResolver="chain"/><resolvers>'
            f'<chain name="chain">{resolvers}'
            '<ibiblio name="maven" m2compatible="true" usepoms="false"/>'
            '</chain></resolvers></ivysettings>')
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") \
        else "java"
    cache = Path(conf.get("spark.jars.ivy") or IVY_HOME) / "cache"
    return [str(java), "-cp", str(ivy[-1]), "org.apache.ivy.Main",
            "-settings", settings, "-ivy", str(work / "ivy.xml"), "-cache", str(cache),
            "-cachepath", str(work / "path.txt")]


def _write(target: Path, paths: list[str]) -> None:
    """Record ``paths`` at ``target``, whole; nothing where it cannot be written (a home
    folder this user cannot write: the next start resolves again)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".",
                                         delete=False) as out:
            out.write("\n".join(paths) + "\n")
        os.replace(out.name, target)
    except OSError as exc:
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
