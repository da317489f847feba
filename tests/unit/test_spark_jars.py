"""``core.spark_jars``: what a Spark start takes instead of resolving its packages again."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from core import spark_jars
from core.errors import UserError
from core.spark_jars import JARS, PACKAGES, classified_jar, record_path, remember, start_conf

DELTA = "io.delta:delta-spark_4.1_2.13:4.4.0"


@pytest.fixture
def jars(tmp_path, monkeypatch):
    """Two resolved jars on disk, and the records kept in a folder of this test's."""
    monkeypatch.setattr(spark_jars, "RECORDS", tmp_path / "records")
    folder = tmp_path / "ivy" / "jars"
    folder.mkdir(parents=True)
    files = [folder / "io.delta_delta-spark_4.1_2.13-4.4.0.jar",
             folder / "io.delta_delta-storage-4.4.0.jar"]
    for file in files:
        file.write_bytes(b"PK")
    return [str(file) for file in files]


def test_without_a_record_the_start_resolves(jars):
    conf = {PACKAGES: DELTA, "spark.ui.enabled": "false"}
    assert start_conf(conf) == conf


def test_a_recorded_start_takes_the_files_after_its_own_jars_and_resolves_nothing(jars, tmp_path):
    own = str(tmp_path / "connector.jar")
    conf = {PACKAGES: DELTA, "spark.jars.excludes": "software.amazon.awssdk:bundle",
            JARS: own, "spark.ui.enabled": "false"}
    # The started session's spark.jars: the conf's own jar, then the resolved ones, as URLs.
    remember(conf, ",".join([f"file://{own}", *(f"file://{jar}" for jar in jars)]))
    assert record_path(conf).read_text().splitlines() == jars
    assert start_conf(conf) == {JARS: ",".join([own, *jars]), "spark.ui.enabled": "false"}


def test_a_record_is_per_packages_and_ivy_settings(jars):
    remember({PACKAGES: DELTA}, ",".join(jars))
    assert PACKAGES not in start_conf({PACKAGES: DELTA})
    for other in ({PACKAGES: DELTA + ",org.apache.hadoop:hadoop-aws:3.4.2"},
                  {PACKAGES: DELTA, "spark.jars.repositories": "https://mirror.example/m2"},
                  {PACKAGES: DELTA, "spark.jars.excludes": "a:b"}):
        assert start_conf(other) == other, other


def test_a_record_with_a_file_gone_is_resolved_again(jars):
    conf = {PACKAGES: DELTA}
    remember(conf, ",".join(jars))
    Path(jars[1]).unlink()
    assert start_conf(conf) == conf


def test_nothing_is_recorded_for_files_that_are_not_there(jars, tmp_path):
    conf = {PACKAGES: DELTA}
    remember(conf, ",".join([*jars, str(tmp_path / "missing.jar")]))
    remember(conf, "")
    assert not record_path(conf).exists()
    assert start_conf(conf) == conf


def test_a_conf_without_packages_is_taken_as_it_is(jars):
    remember({PACKAGES: DELTA}, ",".join(jars))
    conf = {JARS: jars[0]}
    assert start_conf(conf) == conf


def test_a_folder_that_cannot_be_written_records_nothing_and_raises_nothing(jars, tmp_path,
                                                                             monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setattr(spark_jars, "RECORDS", blocked / "records")
    conf = {PACKAGES: DELTA}
    remember(conf, ",".join(jars))
    assert start_conf(conf) == conf


# The classified artifact: resolved by Spark's own Ivy (a real JVM) from a Maven-layout
# repository in a folder of the test's, named as a user names a mirror.
THING = "org.example:thing:1.0:shaded"


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A Maven repository holding THING's jar (and no POM: none is read), and Spark's Ivy
    cache and the records in folders of this test's."""
    monkeypatch.setattr(spark_jars, "RECORDS", tmp_path / "records")
    folder = tmp_path / "repo" / "org" / "example" / "thing" / "1.0"
    folder.mkdir(parents=True)
    content = b"PK\x03\x04 a jar's bytes"
    (folder / "thing-1.0-shaded.jar").write_bytes(content)
    conf = {"spark.jars.repositories": (tmp_path / "repo").as_uri(),
            "spark.jars.ivy": str(tmp_path / "ivy")}
    return conf, hashlib.sha256(content).hexdigest(), folder


def test_a_classified_jar_is_resolved_by_ivy_checked_and_recorded(repository, tmp_path):
    conf, sha256, folder = repository
    jar = classified_jar(THING, sha256, conf)
    assert jar.startswith(str(tmp_path / "ivy" / "cache")) and jar.endswith("thing-1.0-shaded.jar")
    assert Path(jar).read_bytes() == (folder / "thing-1.0-shaded.jar").read_bytes()
    # The next start takes the record: with the repository gone, Ivy could resolve nothing.
    shutil.rmtree(tmp_path / "repo")
    assert classified_jar(THING, sha256, conf) == jar


def test_a_classified_jar_of_another_digest_is_refused_and_not_recorded(repository):
    conf, _, _ = repository
    with pytest.raises(UserError, match="is not the expected one"):
        classified_jar(THING, "0" * 64, conf)
    assert not list(spark_jars.RECORDS.glob("*.jars"))


def test_a_classified_jar_that_is_nowhere_is_one_sentence(repository, tmp_path):
    """The user's own Ivy settings, naming only the test's repository, are used whole."""
    conf, sha256, _ = repository
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(
        '<ivysettings><settings defaultResolver="mine"/><resolvers><ibiblio name="mine" '
        f'm2compatible="true" usepoms="false" root="{(tmp_path / "repo").as_uri()}"/>'
        '</resolvers></ivysettings>')
    missing = "org.example:thing:2.0:shaded"
    with pytest.raises(UserError, match=f"cannot resolve {missing} for Spark"):
        classified_jar(missing, sha256, {**conf, "spark.jars.ivySettings": str(settings)})
    assert classified_jar(THING, sha256, {**conf, "spark.jars.ivySettings": str(settings)})
