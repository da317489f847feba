"""Mirrors and maintenance where every write goes through Spark (``LAKECDC_WRITER=spark``):
every command runs with the Spark writer (``setup``, ``ship``, ``stream``, then
the mirrors, ``maintain`` and ``verify``). The source is read with psycopg and each mirror
with delta-rs (never through lakecdc):

- each mirror equals its source through TOAST-omitted columns, key moves (twice in one
  batch), deletes, a TRUNCATE and an added column, and every MERGE after its initial rows
  was committed by Spark (``engineInfo``), with lakecdc's metadata;
- ``maintain --once`` compacts the mirrors with Spark's ``OPTIMIZE`` and the mirrors stay
  exact; ``status`` and the metrics' state read each table's size and last maintenance
  through Spark; ``verify`` passes;
- a mirror batch replayed (its checkpoint put back) commits nothing and stays exact; with
  the mirrors' replay guard off (``mirror_txn``, a negative control) the same replay moves
  the twice-moved row again from a row that is gone, and loses its TOASTed body.

One test proves all of it on one source and lakehouse: the Spark writer's ``setup`` and
first batch through every layer cost most of a minute, and the replay needs exactly what
the second batch already is (a delete, a row moved twice with its body left out). The
replay's drift is then wiped by the third batch's TRUNCATE, and everything after is
checked against the source as before.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
from deltalake import DeltaTable

from core.layout import mirror_path
from tests.integration.test_mirrors import (
    CAPTURED,
    SCHEMA_SQL,
    TABLE,
    assert_mirror_is_source,
    mirror_rows,
    traffic,
)
from tests.tests_support import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK = {"LAKECDC_WRITER": "spark"}
# The counted tables captured, as always, but not mirrored: nothing here changes them, so
# their mirrors would be empty ones that only add their own load, maintenance and verify
# comparison to each phase (seconds each). Empty mirrors through Spark are loaded and
# followed in test_spark_writes_tables, compared by verify in test_mirrors.
MIRRORED = {"LAKECDC_TABLES": ",".join(CAPTURED), "LAKECDC_MIRRORS": TABLE}


def layers(cli_here, env) -> None:
    """bronze, silver and gold, through Spark too (``env``: a lakehouse keeps the writer it
    was set up with)."""
    for stage in (["ship", "--once"], ["stream", "--once"]):
        done = cli_here(stage, env)
        assert done.returncode == 0, done.stderr[-3000:]


def spark_mirrors(cli_here, env, *, guards: str = "") -> str:
    more = {"LAKECDC_UNSAFE_DISABLE_GUARDS": guards} if guards else {}
    done = cli_here(["mirrors", "--once"], {**env, **SPARK, **more})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def commits(config) -> list[dict]:
    """The mirror's history, oldest first."""
    return DeltaTable(mirror_path(config.lakehouse, TABLE)).history()[::-1]


def move_twice(conn) -> tuple:
    """A row's key moved A -> B -> C in one batch, its TOASTed body left out of both."""
    k1, k2 = conn.execute("SELECT k1, k2 FROM typed_rows WHERE body IS NOT NULL "
                          "ORDER BY k1 LIMIT 1").fetchone()
    for step in (1, 2):
        conn.execute("UPDATE typed_rows SET k1 = %s, small = %s WHERE k1 = %s AND k2 = %s",
                     [-step, step, k1 if step == 1 else -1, k2])
    return (-2, k2)


def setup_with_rows(source_db, config, cli_here, seed: int) -> dict:
    rng = random.Random(seed)
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
        traffic(conn, rng, 30)                      # initial rows, read by setup
    env = {**cli_env(config), **MIRRORED, **SPARK}
    setup = cli_here(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    with source_db.connect() as conn:
        traffic(conn, rng, 50)
    return env


@pytest.mark.long
def test_spark_mirrors_follow_the_source_replay_exactly_once_and_maintain_and_verify_keep_them_exact(  # noqa: E501
        source_db, config, cli_here, spark, tmp_path):
    env = setup_with_rows(source_db, config, cli_here, seed=3701)
    layers(cli_here, env)
    spark_mirrors(cli_here, env)
    assert_mirror_is_source(source_db, config)
    checkpoint = f"{config.lakehouse}/_checkpoints/mirrors"
    saved = tmp_path / "mirrors-checkpoint"             # before the second batch
    shutil.copytree(checkpoint, saved)

    rng = random.Random(3702)
    with source_db.connect() as conn:           # TOAST left alone, two moves in one batch
        conn.execute("UPDATE typed_rows SET small = 7")
        traffic(conn, rng, 20)
        conn.execute("DELETE FROM typed_rows WHERE k1 % 3 = 0")
        moved = move_twice(conn)
    layers(cli_here, env)
    spark_mirrors(cli_here, env)
    assert_mirror_is_source(source_db, config)
    assert mirror_rows(config, added=False)[moved][-1] is not None      # the body kept
    version = DeltaTable(mirror_path(config.lakehouse, TABLE)).version()

    def replay(**kwargs) -> None:
        shutil.rmtree(checkpoint)
        shutil.copytree(saved, checkpoint)              # the second batch runs again
        out = spark_mirrors(cli_here, env, **kwargs)
        assert f"{TABLE} (1 batches)" in out, out

    replay()                                            # the guard: nothing committed
    assert DeltaTable(mirror_path(config.lakehouse, TABLE)).version() == version
    assert_mirror_is_source(source_db, config)

    replay(guards="mirror_txn")                         # the negative control
    assert DeltaTable(mirror_path(config.lakehouse, TABLE)).version() > version
    assert mirror_rows(config, added=False)[moved][-1] is None          # the body lost
    with pytest.raises(AssertionError):
        assert_mirror_is_source(source_db, config)

    with source_db.connect() as conn:           # a TRUNCATE and a new column in one batch
        traffic(conn, rng, 10)
        conn.execute("TRUNCATE typed_rows")
        traffic(conn, rng, 20)
        conn.execute("ALTER TABLE typed_rows ADD COLUMN note text")
        traffic(conn, rng, 30, added=True)
    layers(cli_here, env)
    spark_mirrors(cli_here, env)
    assert_mirror_is_source(source_db, config, added=True)      # the drift truncated away
    merges = [c for c in commits(config) if c.get("operation") == "MERGE"]
    assert len(merges) >= 4, [c.get("operation") for c in commits(config)]
    assert all("Apache-Spark" in c.get("engineInfo", "") for c in merges), merges[-1]
    assert not any("delta-rs" in c.get("engineInfo", "") for c in commits(config))
    metas = [json.loads(c["userMetadata"]) for c in merges]
    assert any(m.get("truncated") for m in metas) and any(m.get("partial") for m in metas)

    # A mirror is rewritten whole by each MERGE (one live file); silver/changes, three
    # stream appends, is what compacts.
    silver = f"{config.lakehouse}/silver/changes"
    before = len(DeltaTable(silver).file_uris())
    assert before >= 3
    maintained = cli_here(["maintain", "--once"], {**env, **SPARK,
                                                   "LAKECDC_RETENTION_HOURS": "0"})
    assert maintained.returncode == 0, maintained.stderr[-3000:]
    line = next(ln for ln in maintained.stdout.splitlines() if ln.startswith("silver:"))
    assert f"{before} → 1 live files, {before} compacted" in line, (line, before)
    history = DeltaTable(silver).history(7)     # OPTIMIZE, SET, two vacuums' START, END
    assert any(c.get("operation") == "OPTIMIZE" and "Apache-Spark" in c.get("engineInfo", "")
               for c in history), [c.get("operation") for c in history]
    assert any(c.get("operation") == "VACUUM END" for c in commits(config))
    assert_mirror_is_source(source_db, config, added=True)

    # status reads the tables' sizes through Spark, and the maintenance from their history.
    status = cli_here(["status", "--json"], {**env, **SPARK})
    # Exit 5: a layer holds nothing yet - the dashboard, which nothing here pushed to.
    assert status.returncode == 5, status.stderr[-3000:]
    notes = {la["layer"]: la["note"] for la in json.loads(status.stdout)["layers"] if la["note"]}
    assert notes == {"dashboard": "nothing pushed yet"}, notes
    sizes = {t["table"]: t for t in json.loads(status.stdout)["tables"]}
    assert sizes["silver"]["live_files"] == 1 and sizes["silver"]["log_entries"] > 3, sizes
    assert all(t["last_maintained"] is not None for t in sizes.values()), sizes
    # The metrics' state, read as `run --metrics-port` reads it with this writer.
    from core.engine.spark_delta import SparkDelta
    from pipelines.observe.metrics_state import read_state

    state = read_state(config.with_(writer="spark"), engine=lambda: SparkDelta(spark))
    assert all(state.up.values()), state.errors
    assert len(state.tables) >= 6 and all(sizes[t["table"]] == t for t in state.tables)

    verified = cli_here(["verify"], {**env, **SPARK})
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert f"mirror {TABLE}: exact" in verified.stdout, verified.stdout
