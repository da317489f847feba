"""``core.engine.delta_rs.DeltaRs``: the default engine's reads and commits on a real local
Delta table (Spark's is checked against the same protocol in
tests/integration/test_spark_writes.py)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from core.commits import commit_metadata
from core.engine.choose import engine_for
from core.engine.delta_rs import DeltaRs

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string())])


@pytest.fixture()
def table(tmp_path) -> tuple[DeltaRs, str]:
    engine, path = DeltaRs(), str(tmp_path / "t")
    engine.create(path, SCHEMA, {"delta.appendOnly": "false"}, comment="a test table")
    return engine, path


def test_create_is_idempotent_and_states_its_properties(table):
    engine, path = table
    engine.create(path, SCHEMA)
    assert engine.exists(path) and engine.version(path) == 0
    assert engine.properties(path)["delta.appendOnly"] == "false"
    assert not engine.exists(path + "/inside")


def test_read_with_a_condition_answers_in_the_tables_own_types(table):
    engine, path = table
    engine.append(path, pa.table({"k": [1, 2, 3], "name": ["a", "b", "c"]}, schema=SCHEMA))
    found = engine.read(path, ["name"], "k >= 2 AND name <> 'c'")
    assert isinstance(found, pa.Table) and found.schema == pa.schema([("name", pa.string())])
    assert found.column("name").to_pylist() == ["b"]
    assert engine.read(path, version=0).num_rows == 0          # time travel
    assert engine.count(path) == 3


def test_a_merge_that_changes_no_row_still_records_its_app_version_and_metadata(table):
    engine, path = table
    engine.append(path, pa.table({"k": [1], "name": ["a"]}, schema=SCHEMA))
    meta = commit_metadata("silver", batch_id=7)
    counts = engine.merge(path, pa.table({"k": [1], "name": ["a"]}, schema=SCHEMA),
                          "t.k = s.k", update={"name": "s.name"},
                          update_when="t.name <> s.name", meta=meta, app=("lakecdc-x", 7))
    assert counts == {"num_target_rows_updated": 0, "num_target_rows_inserted": 0,
                      "num_target_rows_deleted": 0}
    assert engine.recorded(path).version_of("lakecdc-x") == 7
    assert engine.commits(path, "silver", limit=1)[0].meta["batch_id"] == 7


def test_delta_rs_skips_no_recorded_write_its_writers_check_first(table):
    engine, path = table
    rows = pa.table({"k": [1], "name": ["a"]}, schema=SCHEMA)
    assert engine.append(path, rows, app=("lakecdc-y", 1))
    assert engine.append(path, rows, app=("lakecdc-y", 1))     # written again
    assert engine.count(path) == 2


def test_the_engine_pickles_without_its_handles(table):
    """Spark Connect pickles a ``foreachBatch`` writer, and the mirrors' holds an engine."""
    engine, path = table
    engine.append(path, pa.table({"k": [1], "name": ["a"]}, schema=SCHEMA))
    copy = pickle.loads(pickle.dumps(engine))
    assert copy.storage_options == engine.storage_options and copy.count(path) == 1


def test_the_configuration_chooses_the_engine(tmp_path):
    from core.config import Config

    assert engine_for(Config(lakehouse=str(tmp_path))).name == "delta-rs"
