"""core.commits: lakecdc's commit metadata, written and read back from a real Delta log
(delta-rs, no Spark)."""

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from core.commits import commit_metadata, floor_of, newest, parse_commit_metadata
from core.engine.delta_rs import read_commits_rs


def test_metadata_round_trips_and_other_layers_and_tools_are_foreign():
    text = commit_metadata(batch_id=7, commit_lsn=42, floor=40)
    assert parse_commit_metadata(text) == {"lakecdc": "gold", "batch_id": 7,
                                           "commit_lsn": 42, "floor": 40}
    assert parse_commit_metadata(text, "silver") is None
    assert parse_commit_metadata(commit_metadata("silver", batch_id=1), "silver")["batch_id"] == 1
    for foreign in (None, "", "not json", "[1, 2]", '{"lakecdc": "bronze"}', '{"x": 1}'):
        assert parse_commit_metadata(foreign) is None
    assert floor_of({"floor": "40"}) == 40
    assert floor_of({"floor": None}) is None and floor_of({}) is None


def _commit(path, user_metadata):
    custom = {"userMetadata": user_metadata} if user_metadata is not None else None
    write_deltalake(path, pa.table({"x": [1]}), mode="append",
                    commit_properties=CommitProperties(custom_metadata=custom))


def test_read_commits_rs_is_newest_first_and_numbered_right_at_any_version(tmp_path):
    path = str(tmp_path / "t")
    _commit(path, commit_metadata(batch_id=0, commit_lsn=10))
    _commit(path, commit_metadata(batch_id=1, commit_lsn=20))
    _commit(path, None)                                    # e.g. someone's OPTIMIZE
    _commit(path, commit_metadata("silver", batch_id=9))   # another layer's convention

    commits = read_commits_rs(path)
    assert [c.version for c in commits] == [3, 2, 1, 0]
    assert [c.meta and c.meta["batch_id"] for c in commits] == [None, None, 1, 0]
    assert newest(commits)["commit_lsn"] == 20
    assert newest(read_commits_rs(path, limit=2)) is None
    assert newest(read_commits_rs(path, layer="silver"))["batch_id"] == 9

    # As of version 0 (delta-rs 1.6's history of a table loaded there is numbered wrongly)
    at_zero = read_commits_rs(path, up_to=0)
    assert [c.version for c in at_zero] == [0]
    assert newest(at_zero)["commit_lsn"] == 10


def test_read_commits_rs_numbers_right_when_commits_land_while_it_reads(tmp_path, monkeypatch):
    """delta-rs 1.6 numbers a history down from the version its handle loaded but reads
    the newest commits storage holds: a commit landing in between made version 1's entry
    version 2's commit, and the push took gold's next watermark for the one it pushed (the
    F13b kill test). Here real commits land right before each of the first two reads."""
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    _commit(path, commit_metadata(batch_id=0, commit_lsn=10))
    _commit(path, commit_metadata(batch_id=1, commit_lsn=20))
    history, landing = DeltaTable.history, [30, 40]

    def history_after_a_commit(self, limit=None):
        if landing:
            _commit(path, commit_metadata(batch_id=landing[0] // 10 - 1,
                                          commit_lsn=landing.pop(0)))
        return history(self, limit)

    monkeypatch.setattr(DeltaTable, "history", history_after_a_commit)
    at_one = read_commits_rs(path, up_to=1)
    assert [(c.version, c.meta["commit_lsn"]) for c in at_one] == [(1, 20), (0, 10)]
    assert not landing                                   # both landed, and were read past
    assert [c.version for c in read_commits_rs(path)] == [3, 2, 1, 0]
    assert newest(read_commits_rs(path))["commit_lsn"] == 40
