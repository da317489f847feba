"""The catalog settings (``LAKECDC_CATALOG``, ``LAKECDC_SCHEMA``) and the pure parts of
registering by name: quoting and comparing locations."""

import pytest

from core.catalog_names import location, quoted, same_location
from core.config import Config
from core.errors import UserError


def test_catalog_and_schema_are_unset_by_default_and_read_from_the_environment():
    assert not Config.load(env={}).registers
    assert not Config.load(env={"LAKECDC_CATALOG": " ", "LAKECDC_SCHEMA": ""}).registers
    config = Config.load(env={"LAKECDC_CATALOG": "main", "LAKECDC_SCHEMA": "lakecdc_prod"})
    assert config.registers and (config.catalog, config.catalog_schema) == \
        ("main", "lakecdc_prod")


@pytest.mark.parametrize("env, fragment", [
    ({"LAKECDC_CATALOG": "main"}, "go together"),
    ({"LAKECDC_SCHEMA": "lakecdc"}, "go together"),
    ({"LAKECDC_CATALOG": "main`; DROP TABLE x; --", "LAKECDC_SCHEMA": "s"}, "LAKECDC_CATALOG="),
    ({"LAKECDC_CATALOG": "main", "LAKECDC_SCHEMA": "a.b"}, "LAKECDC_SCHEMA="),
    ({"LAKECDC_CATALOG": "1st", "LAKECDC_SCHEMA": "s"}, "not starting with a digit"),
])
def test_a_catalog_or_schema_that_is_not_a_plain_name_is_refused(env, fragment):
    with pytest.raises(UserError, match=fragment) as refused:
        Config.load(env=env)
    assert "\n" not in str(refused.value)


def test_names_are_backquoted_part_by_part():
    assert quoted("main", "lakecdc", "gold_service_stats") == \
        "`main`.`lakecdc`.`gold_service_stats`"
    assert quoted("a`b") == "`a``b`"


@pytest.mark.parametrize("a, b", [
    ("file:/data/lh/gold/service_stats", "/data/lh/gold/service_stats"),
    ("file:///data/lh/gold/service_stats/", "/data/lh/./gold/service_stats"),
    ("s3://bucket/lh/gold/service_stats", "s3a://bucket/lh/gold/service_stats/"),
])
def test_one_location_in_two_spellings_is_the_same(a, b):
    assert same_location(a, b)


@pytest.mark.parametrize("a, b", [
    ("file:/data/lh/gold/service_stats", "/data/other/gold/service_stats"),
    ("s3://bucket/lh/gold/service_stats", "s3://other-bucket/lh/gold/service_stats"),
    ("s3://bucket/lh/gold/service_stats", "abfss://bucket/lh/gold/service_stats"),
    ("/data/lh/gold/service_stats", "/data/lh/gold/service_stats_old"),
])
def test_different_locations_differ(a, b):
    assert not same_location(a, b)


def test_a_local_location_is_made_absolute_and_a_uri_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert location("lakehouse/bronze/wal2json_changes") == \
        str(tmp_path / "lakehouse/bronze/wal2json_changes")
    assert location("s3://bucket/lh/bronze/wal2json_changes") == \
        "s3://bucket/lh/bronze/wal2json_changes"
