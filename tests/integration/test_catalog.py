"""Tables registered by name (``LAKECDC_CATALOG``, ``LAKECDC_SCHEMA``) on real Postgres 15 +
wal2json, Spark and Delta.

Two halves. In this process, on the suite's Spark session: what ``setup`` registers, that a
second ``setup`` changes nothing, that ``tables add`` (a shipper running) registers the new
table's mirror, and the refusals (a session whose catalog forgets names, a missing schema, a
name pointing elsewhere), each before anything was changed. That session's catalog is
Spark's in-memory one, which the CLI refuses: those tests call ``setup`` and ``add_table``
with the persistence check passed over, and one test runs the CLI to see the refusal itself.

In new processes, with Spark's Hive metastore in an embedded Derby database under the test's
directory (``hive-site.xml`` in ``SPARK_CONF_DIR``): ``setup`` registers the lakehouse, and
after a run (this process, by path) another process, ``lakecdc sql``, reads bronze, silver
and gold by name: what it finds equals the data at the paths, and gold the source's own
``GROUP BY``.
"""

from __future__ import annotations

import csv
import io
import signal
import subprocess
import sys
import uuid

import pytest

from core.catalog_names import Catalog, same_location
from core.errors import UserError
from core.layout import mirror_path
from core.locks import is_held, ship_lock_name
from pipelines.setup.prepare import setup
from pipelines.setup.capture import add_table
from tests.integration.workload import mixed
from tests.tests_support import ROOT, cli_env, one_sentence, run_cli, wait_for
from tests.truth import source_truth

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SERVICES = """
CREATE TABLE services (id integer PRIMARY KEY, name text NOT NULL);
INSERT INTO services SELECT i, 'service ' || i FROM generate_series(1, 25) i;
CREATE TABLE templates (id integer PRIMARY KEY, service_id integer, name text);
INSERT INTO templates SELECT i, i % 25 + 1, 'template ' || i FROM generate_series(1, 40) i;
"""
LAKEHOUSE_NAMES = ("bronze_wal2json_changes", "silver_changes", "silver_quarantine",
                   "gold_service_stats")
MIRROR_NAMES = ("silver_public_notifications", "silver_public_notification_history",
                "silver_public_services")


@pytest.fixture
def schema(spark):
    """A schema of its own in the session's catalog, dropped with what the test put in it."""
    name = f"lakecdc_{uuid.uuid4().hex[:10]}"
    spark.sql(f"CREATE SCHEMA `{name}`")
    yield name
    spark.sql(f"DROP SCHEMA IF EXISTS `{name}` CASCADE")


@pytest.fixture
def in_memory(monkeypatch):
    """``setup`` on the suite's session: its in-memory catalog is refused by the CLI (see
    ``test_a_catalog_that_forgets_names_is_refused_before_anything_changes``)."""
    monkeypatch.setattr("pipelines.setup.register.require_persistent", lambda spark: None)


def _slot_exists(source_db, slot: str) -> bool:
    with source_db.connect() as conn:
        return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                            [slot]).fetchone() is not None


def test_a_catalog_that_forgets_names_is_refused_before_anything_changes(
        source_db, config, lakecdc):
    code, _, err = lakecdc(config, "setup", env={"LAKECDC_CATALOG": "spark_catalog",
                                                 "LAKECDC_SCHEMA": "default"})
    one_sentence(code, err, "keeps table names in memory only")
    assert not _slot_exists(source_db, config.slot)


def test_setup_and_tables_add_register_every_table_once_and_refuse_names_pointing_elsewhere(
        source_db, config, spark, schema, in_memory, tmp_path):
    with source_db.connect() as conn:
        conn.execute(SERVICES)
    named = config.with_(catalog="spark_catalog", catalog_schema=schema, mirrors=None,
                         tables=(*config.tables, "public.services"))
    report = setup(named, spark_factory=lambda: spark)
    registered = [a for a in report.actions if a.startswith("registered ")]
    names = (*LAKEHOUSE_NAMES, *MIRROR_NAMES)
    assert [a.split()[1] for a in registered] == [f"spark_catalog.{schema}.{n}" for n in names]
    catalog = Catalog(spark, "spark_catalog", schema)
    paths = {**{n: f"{config.lakehouse}/{n.replace('_', '/', 1)}" for n in LAKEHOUSE_NAMES},
             "silver_public_services": mirror_path(config.lakehouse, "public.services")}
    for name, path in paths.items():
        assert same_location(catalog.location_of(name), path), (name, path)
    assert spark.table(f"spark_catalog.{schema}.silver_public_services").columns[:2] == \
        ["id", "name"]

    # Again: nothing new registered, nothing refused.
    again = setup(named, spark_factory=lambda: spark)
    assert not [a for a in again.actions if a.startswith("registered ")], again.actions
    assert any("already registered" in a for a in again.actions), again.actions

    # A table added while a shipper runs: `tables add` registers its mirror.
    log = tmp_path / "ship.log"
    ship = subprocess.Popen([sys.executable, "-m", "pipelines", "ship"],
                            env=cli_env(named), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))
    try:
        with source_db.connect() as conn:
            wait_for(lambda: ship.poll() is not None or is_held(
                conn, ship_lock_name(config.slot)), timeout=60)
        assert ship.poll() is None, log.read_text()[-3000:]
        added = add_table(named, "public.templates", spark_factory=lambda: spark)
    finally:
        ship.send_signal(signal.SIGTERM)
        assert ship.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert f"registered spark_catalog.{schema}.silver_public_templates at" in added, added
    assert same_location(catalog.location_of("silver_public_templates"),
                         mirror_path(config.lakehouse, "public.templates"))

    # A lakehouse whose name is taken by another table is refused before its slot exists;
    # so is a schema that does not exist.
    other = named.with_(lakehouse=str(tmp_path / "other"), slot=config.slot + "_o")
    with pytest.raises(UserError, match="bronze_wal2json_changes already points at") as refused:
        setup(other, spark_factory=lambda: spark)
    assert "\n" not in str(refused.value)
    missing = other.with_(catalog_schema=schema + "_nope")
    with pytest.raises(UserError, match=f"schema spark_catalog.{schema}_nope .*does not exist"):
        setup(missing, spark_factory=lambda: spark)
    assert not _slot_exists(source_db, other.slot)
    assert not (tmp_path / "other").exists()


def _hive_env(config, tmp_path) -> dict[str, str]:
    """The CLI's environment with a catalog, and Spark's Hive metastore in Derby under
    ``tmp_path`` (Derby's own log there too, not in the working directory)."""
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "hive-site.xml").write_text(f"""<configuration>
  <property><name>javax.jdo.option.ConnectionURL</name>
    <value>jdbc:derby:;databaseName={tmp_path}/metastore_db;create=true</value></property>
  <property><name>hive.metastore.warehouse.dir</name><value>{tmp_path}/warehouse</value></property>
</configuration>
""")
    env = cli_env(config)
    env.update({"LAKECDC_CATALOG": "spark_catalog", "LAKECDC_SCHEMA": "default",
                "LAKECDC_MIRRORS": "none", "SPARK_CONF_DIR": str(conf),
                "SPARK_SUBMIT_OPTS": (env.get("SPARK_SUBMIT_OPTS", "") +
                                      f" -Dderby.system.home={tmp_path}").strip()})
    return env


@pytest.mark.long
def test_names_persist_in_a_metastore_and_read_what_the_paths_hold(
        source_db, config, spark, cli_here, tmp_path):
    env = _hive_env(config, tmp_path)
    first = run_cli(["setup"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    for name in LAKEHOUSE_NAMES:
        assert f"registered spark_catalog.default.{name} at" in first.stdout, first.stdout
    purged = mixed(source_db.dsn, seed=37)

    # The pipeline writes by path, in this process (it never opens the metastore).
    done = cli_here(["run", "--once"], {k: v for k, v in env.items()
                                        if k.startswith("LAKECDC_")})
    assert done.returncode == 0, done.stderr[-3000:]

    # Another process finds the names, and reads through them what the paths hold.
    counted = {"bronze_wal2json_changes": "COUNT(*)", "silver_changes": "COUNT(*)",
               "gold_service_stats": "SUM(count)"}
    query = " UNION ALL ".join(f"SELECT '{n}' AS name, {f} AS n FROM {n}"
                               for n, f in counted.items())
    read = run_cli(["sql", query, "--format", "csv"], env)
    assert read.returncode == 0, read.stderr[-3000:]
    by_name = {r["name"]: int(r["n"] or 0) for r in csv.DictReader(io.StringIO(read.stdout))}

    def at_path(name: str) -> int:
        frame = spark.read.format("delta").load(f"{config.lakehouse}/"
                                                f"{name.replace('_', '/', 1)}")
        return (frame.groupBy().sum("count").first()[0] if name == "gold_service_stats"
                else frame.count())
    assert by_name == {n: at_path(n) for n in counted}
    assert by_name["gold_service_stats"] == sum(source_truth(source_db.dsn, purged).values())
