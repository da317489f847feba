"""The tail of a big mirror (``silver.mirrors.tail``): netted and laid over the mirror's
table, it gives what the batches' MERGEs, one after another, would have made."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from silver.mirrors.tail import as_tail, current_rows, net_tail, tail_schema
from silver.mirrors.mirror_table import COMMIT_LSN, COMMIT_TS, EXISTS, HAS_PREFIX

KEY = ("id", "region")
OTHERS = ["body", "status", "tags"]
BASE = pa.schema([("id", pa.int64()), ("region", pa.string()), ("body", pa.string()),
                  ("status", pa.int32()), ("tags", pa.list_(pa.string())),
                  (COMMIT_LSN, pa.int64()), (COMMIT_TS, pa.timestamp("us", tz="UTC"))])


def merged(rows: dict, source: list[dict]) -> dict:
    """The MERGE of ``silver.mirrors.merge.merge_clauses``, one source row per key, in plain
    Python: the reference."""
    rows = dict(rows)
    for s in source:
        k = (s["id"], s["region"])
        if not s[EXISTS]:
            rows.pop(k, None)
        elif k in rows:
            rows[k] = {**rows[k], **{n: s[n] for i, n in enumerate(OTHERS)
                                     if s[f"{HAS_PREFIX}{i}"]},
                       COMMIT_LSN: s[COMMIT_LSN], COMMIT_TS: s[COMMIT_TS]}
        else:
            rows[k] = {n: s[n] for n in BASE.names}
    return rows


def random_batches(rng: random.Random, base: dict, batches: int) -> list[list[dict]]:
    """MERGE sources as the mirrors' writer makes them: one row per key and batch; a row
    that leaves a column out (a TOASTed value) only for a key that exists."""
    live = set(base)
    out = []
    lsn = 100
    for _ in range(batches):
        source = []
        for k in rng.sample(sorted({(i, r) for i in range(12) for r in ("a", "b")}), 6):
            lsn += 1
            exists = rng.random() > 0.25
            row = {"id": k[0], "region": k[1], EXISTS: exists, COMMIT_LSN: lsn,
                   COMMIT_TS: None}
            for i, n in enumerate(OTHERS):
                carried = not exists or k not in live or rng.random() > 0.4
                row[f"{HAS_PREFIX}{i}"] = carried and exists
                row[n] = ({"body": f"b{lsn}", "status": lsn % 7,
                           "tags": None if lsn % 3 == 0 else [f"t{lsn}"]}[n]
                          if carried and exists else None)
            (live.add if exists else live.discard)(k)
            source.append(row)
        out.append(source)
    return out


def as_table(rows, schema) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=schema)


def source_schema() -> pa.Schema:
    return tail_schema(BASE, KEY, OTHERS).remove(len(tail_schema(BASE, KEY, OTHERS)) - 1)


@pytest.mark.parametrize("seed", range(20))
def test_the_tail_over_the_table_is_the_merges_one_after_another(seed):
    rng = random.Random(seed)
    base = {(i, "a"): {"id": i, "region": "a", "body": f"old{i}", "status": i,
                       "tags": [f"o{i}"], COMMIT_LSN: i, COMMIT_TS: None} for i in range(8)}
    batches = random_batches(rng, base, rng.randint(1, 6))
    expected = base
    for source in batches:
        expected = merged(expected, source)
    schema = tail_schema(BASE, KEY, OTHERS)
    tail = pa.concat_tables([as_tail(as_table(b, source_schema()), schema, v)
                             for v, b in enumerate(batches, start=1)])
    got = current_rows(as_table(base.values(), BASE), tail, KEY, OTHERS)
    assert got.schema == BASE
    assert sorted(got.to_pylist(), key=lambda r: (r["id"], r["region"])) == \
        [expected[k] for k in sorted(expected)]
    # One MERGE of the netted tail is the MERGEs one after another.
    once = merged(base, net_tail(tail, KEY, OTHERS).to_pylist())
    assert once == expected


def test_a_column_the_tail_leaves_out_keeps_the_tables_value_even_when_null():
    base = as_table([{"id": 1, "region": "a", "body": None, "status": 5, "tags": ["x"],
                      COMMIT_LSN: 1, COMMIT_TS: None}], BASE)
    schema = tail_schema(BASE, KEY, OTHERS)
    first = {"id": 1, "region": "a", EXISTS: True, COMMIT_LSN: 9, COMMIT_TS: None,
             "body": "new", f"{HAS_PREFIX}0": True, "status": None, f"{HAS_PREFIX}1": True,
             "tags": None, f"{HAS_PREFIX}2": False}
    second = {**first, COMMIT_LSN: 10, "body": None, f"{HAS_PREFIX}0": False,
              f"{HAS_PREFIX}1": False}
    tail = pa.concat_tables([as_tail(as_table([first], source_schema()), schema, 1),
                             as_tail(as_table([second], source_schema()), schema, 2)])
    assert current_rows(base, tail, KEY, OTHERS).to_pylist() == [
        {"id": 1, "region": "a", "body": "new", "status": None, "tags": ["x"],
         COMMIT_LSN: 10, COMMIT_TS: None}]


def test_no_tail_is_the_table():
    base = as_table([], BASE)
    assert current_rows(base, None, KEY, OTHERS) is base


def test_a_key_deleted_and_made_again_in_the_tail_keeps_nothing_of_the_tables_row():
    base = as_table([{"id": 1, "region": "a", "body": "old", "status": 5, "tags": ["x"],
                      COMMIT_LSN: 1, COMMIT_TS: None}], BASE)
    schema = tail_schema(BASE, KEY, OTHERS)
    gone = {"id": 1, "region": "a", EXISTS: False, COMMIT_LSN: 9, COMMIT_TS: None,
            **{n: None for n in OTHERS}, **{f"{HAS_PREFIX}{i}": False for i in range(3)}}
    changed = {**gone, EXISTS: True, COMMIT_LSN: 8, "body": "new", f"{HAS_PREFIX}0": True}
    made = {**gone, EXISTS: True, COMMIT_LSN: 10, "status": 7, f"{HAS_PREFIX}1": True}
    tail = pa.concat_tables([as_tail(as_table([r], source_schema()), schema, v)
                             for v, r in enumerate([changed, gone, made])])
    expected = merged({(1, "a"): base.to_pylist()[0]}, [changed])
    expected = merged(merged(expected, [gone]), [made])
    assert expected[(1, "a")]["body"] is None
    assert current_rows(base, tail, KEY, OTHERS).to_pylist() == list(expected.values())


# --- the tail of a real delta-rs mirror (``silver.mirrors.store_rs.RsMirrors``) --------------

TYPES = {"id": "bigint", "region": "text", "body": "text", "status": "integer",
         "tags": "text[]"}


def real_mirror(tmp_path, base: dict) -> str:
    import json

    from deltalake import DeltaTable, write_deltalake

    from silver.mirrors.mirror_table import KEY_PROPERTY, TYPES_PROPERTY

    path = str(tmp_path / "mirror")
    DeltaTable.create(path, schema=BASE, raise_if_key_not_exists=False, configuration={
        KEY_PROPERTY: json.dumps(list(KEY)), TYPES_PROPERTY: json.dumps(TYPES)})
    write_deltalake(path, as_table(base.values(), BASE), mode="append")
    return path


def job(path: str, batch: int, rows: list[dict], plain: bool = True, epoch: str | None = None):
    from core.commits import commit_metadata
    from silver.mirrors.merge import PARTS, MergeJob, txn_app_id

    meta = commit_metadata("mirror", batch_id=batch, part=0, newest=batch * 10)
    return MergeJob(path, batch * PARTS, meta, lambda: as_table(rows, source_schema()), KEY,
                    TYPES, plain=plain, app=txn_app_id(epoch))


def by_key(table: pa.Table) -> dict:
    return {(r["id"], r["region"]): r for r in table.to_pylist()}


def test_a_drain_in_the_background_keeps_the_batches_the_tail_took_meanwhile(tmp_path):
    from deltalake import DeltaTable

    from silver.mirrors.tail import tail_path, read_mirror
    from silver.mirrors.store_rs import RsMirrors

    rng = random.Random(7)
    base = {(i, "a"): {"id": i, "region": "a", "body": f"old{i}", "status": i,
                       "tags": [f"o{i}"], COMMIT_LSN: i, COMMIT_TS: None} for i in range(8)}
    batches = random_batches(rng, base, 3)
    path = real_mirror(tmp_path, base)
    store = RsMirrors(merge_s=0)
    assert store.merge(job(path, 1, batches[0])) and store.merge(job(path, 2, batches[1]))
    assert by_key(DeltaTable(path).to_pyarrow_table()) == base           # the table waits
    assert by_key(read_mirror(path)) == merged(merged(base, batches[0]), batches[1])

    other = real_mirror(tmp_path / "other", base)
    store._tails[path].drained_at = -1e9                  # a drain is due
    store.drain_due()                                     # ... and starts in the background
    draining = store._draining
    assert draining is not None and draining[0] == path
    draining[1].result()
    # Another mirror's MERGE, in another of the batch's threads, leaves that drain alone:
    # only the thread that writes its tail drops the rows it drained.
    assert store.merge(job(other, 3, batches[0], plain=False))
    assert store._draining is draining
    assert by_key(DeltaTable(other).to_pyarrow_table()) == merged(base, batches[0])
    assert store.merge(job(path, 3, batches[2]))         # the tail takes a batch meanwhile
    assert not store.merge(job(path, 2, batches[1]))     # a replay: recorded by the tail
    store.drain_due()                                     # collected: batches 1-2 dropped
    after_two = merged(merged(base, batches[0]), batches[1])
    assert by_key(DeltaTable(path).to_pyarrow_table()) == after_two
    tail = DeltaTable(tail_path(path)).to_pyarrow_table()
    assert set(tail["_lakecdc_version"].to_pylist()) == {3 * 1_000_000}
    assert by_key(read_mirror(path)) == merged(after_two, batches[2])

    store.drain(path)                                     # here and now: the tail emptied
    assert by_key(DeltaTable(path).to_pyarrow_table()) == merged(after_two, batches[2])
    assert DeltaTable(tail_path(path)).to_pyarrow_table().num_rows == 0


def test_a_kill_between_a_drain_and_the_tail_emptied_drains_the_same_rows_again(tmp_path):
    from deltalake import DeltaTable

    from silver.mirrors.tail import read_mirror
    from silver.mirrors.store_rs import RsMirrors, drain_tail

    rng = random.Random(8)
    base = {(i, "b"): {"id": i, "region": "b", "body": f"old{i}", "status": i,
                       "tags": None, COMMIT_LSN: i, COMMIT_TS: None} for i in range(6)}
    batches = random_batches(rng, base, 2)
    path = real_mirror(tmp_path, base)
    store = RsMirrors(merge_s=0)
    for b, rows in enumerate(batches, start=1):
        assert store.merge(job(path, b, rows))
    expected = merged(merged(base, batches[0]), batches[1])
    drain_tail(path, None, KEY, TYPES)                    # MERGEd; then killed
    assert by_key(DeltaTable(path).to_pyarrow_table()) == expected
    assert by_key(read_mirror(path)) == expected         # the tail over it: the same
    again = RsMirrors(merge_s=0)                          # the next start
    assert not again.merge(job(path, 2, batches[1]))     # recorded
    again.drain(path)
    assert by_key(DeltaTable(path).to_pyarrow_table()) == expected


def test_a_load_replacing_a_mirrors_rows_empties_its_stale_tail(tmp_path):
    """``tables add`` of a table removed before (its mirror and tail kept): the load's
    first chunk replaces the table's rows, and the tail left from before is emptied with
    it, or the next drain would lay stale rows over the loaded ones."""
    from deltalake import DeltaTable

    from core.commits import commit_metadata
    from pipelines.setup.mirror_loader import MirrorTarget
    from silver.mirrors.tail import tail_path, read_mirror
    from silver.mirrors.store_rs import RsMirrors
    from silver.mirrors.mirror_table import TableSpec

    base = {(1, "a"): {"id": 1, "region": "a", "body": "old", "status": 1, "tags": None,
                       COMMIT_LSN: 1, COMMIT_TS: None}}
    path = real_mirror(tmp_path, base)
    stale = random_batches(random.Random(9), base, 1)[0]
    assert RsMirrors(merge_s=0).merge(job(path, 1, stale))
    assert DeltaTable(tail_path(path)).to_pyarrow_table().num_rows > 0

    loaded = {(2, "z"): {"id": 2, "region": "z", "body": "new", "status": 2, "tags": ["t"],
                         COMMIT_LSN: None, COMMIT_TS: None}}
    target = MirrorTarget(path, TableSpec("public", "t", tuple(TYPES.items()), KEY))
    target.write(as_table(loaded.values(), BASE), commit_metadata("mirror", load=1),
                 overwrite=True)
    assert DeltaTable(tail_path(path)).to_pyarrow_table().num_rows == 0
    assert by_key(read_mirror(path)) == loaded


def test_with_no_batch_coming_the_writers_idle_drains_a_due_tail_but_never_beside_a_batch(
        tmp_path):
    from deltalake import DeltaTable

    from silver.mirrors.mirror_writer import MirrorWriter
    from silver.mirrors.store_rs import RsMirrors

    base = {(1, "a"): {"id": 1, "region": "a", "body": "old", "status": 1, "tags": None,
                       COMMIT_LSN: 1, COMMIT_TS: None}}
    path = real_mirror(tmp_path, base)
    batch = random_batches(random.Random(10), base, 1)[0]
    store = RsMirrors(merge_s=0)
    writer = MirrorWriter({"public.t": path}, store=store)
    assert store.merge(job(path, 1, batch))
    store._tails[path].drained_at = -1e9                  # a drain is due
    with writer._busy:                                   # a batch runs
        writer.idle()
    assert store._draining is None
    writer.idle()                                        # none runs: the drain starts
    store._draining[1].result()
    writer.idle()                                        # ... and is collected
    assert store._draining is None and store._tails[path].rows == 0
    assert by_key(DeltaTable(path).to_pyarrow_table()) == merged(base, batch)


def test_the_tails_rows_alone_are_the_keys_it_holds_as_it_last_carried_them(tmp_path):
    from deltalake import DeltaTable

    from silver.mirrors.tail import mirror_of, tail_path, read_mirror
    from silver.mirrors.store_rs import RsMirrors

    base = {(i, "a"): {"id": i, "region": "a", "body": f"old{i}", "status": i, "tags": None,
                       COMMIT_LSN: i, COMMIT_TS: None} for i in range(4)}
    path = real_mirror(tmp_path, base)
    batch = random_batches(random.Random(11), base, 1)[0]
    assert RsMirrors(merge_s=0).merge(job(path, 1, batch))
    tail = DeltaTable(tail_path(path)).to_pyarrow_table()
    alone = by_key(mirror_of(DeltaTable(path), tail, ["status"], False))
    current = by_key(read_mirror(path, columns=["status"]))
    carried = {(r["id"], r["region"]) for r in batch if r[EXISTS] and r[f"{HAS_PREFIX}1"]}
    assert carried and {k: alone[k] for k in carried} == {k: current[k] for k in carried}
    assert set(alone) <= set(current)


def test_a_tail_an_earlier_run_left_is_drained_at_the_end_of_a_run_its_table_saw_no_batch_of(
        tmp_path):
    """Killed after its tail took a batch; the next run gets no change of that table: its
    end still drains the tail (and so does a verify marker), or the table alone would stay
    behind and verify would find drift that is not there."""
    from deltalake import DeltaTable

    from silver.mirrors.mirror_writer import MirrorWriter
    from silver.mirrors.tail import tail_path
    from silver.mirrors.store_rs import RsMirrors

    base = {(1, "a"): {"id": 1, "region": "a", "body": "old", "status": 1, "tags": None,
                       COMMIT_LSN: 1, COMMIT_TS: None}}
    path = real_mirror(tmp_path, base)
    batch = random_batches(random.Random(12), base, 1)[0]
    assert RsMirrors(merge_s=0).merge(job(path, 1, batch))          # then killed
    writer = MirrorWriter({"public.t": path}, store=RsMirrors(merge_s=0))   # the next run
    writer.finish()
    assert by_key(DeltaTable(path).to_pyarrow_table()) == merged(base, batch)
    assert DeltaTable(tail_path(path)).to_pyarrow_table().num_rows == 0


def test_a_new_epochs_batches_are_taken_and_a_tail_of_the_old_one_is_drained_first(tmp_path):
    """A new checkpoint (silver made anew) numbers its batches from 0 again, under an app id
    of its own: its batch 1 is merged though the old epoch recorded batch 3, and a tail the
    old epoch left (versions of its batch ids) is drained into the table before the new
    epoch's first batch is appended, whose drain then comes after it; the table records no
    version of the old epoch's rows under the new app id."""
    from deltalake import DeltaTable

    from silver.mirrors.tail import tail_path, read_mirror
    from silver.mirrors.merge import PARTS, txn_app_id
    from silver.mirrors.store_rs import RsMirrors

    rng = random.Random(13)
    base = {(i, "e"): {"id": i, "region": "e", "body": f"old{i}", "status": i, "tags": None,
                       COMMIT_LSN: i, COMMIT_TS: None} for i in range(5)}
    path = real_mirror(tmp_path, base)
    old, new = random_batches(rng, base, 1)[0], random_batches(rng, base, 1)[0]
    assert RsMirrors(merge_s=0).merge(job(path, 3, old, epoch="q1"))       # then killed
    store = RsMirrors(merge_s=0)                              # the next start, a new query
    assert not store.merge(job(path, 3, old, epoch="q1"))     # its own epoch: a replay
    assert store.merge(job(path, 1, new, epoch="q2"))
    expected = merged(merged(base, old), new)
    assert by_key(read_mirror(path)) == expected
    store.drain_all([path])
    assert by_key(DeltaTable(path).to_pyarrow_table()) == expected
    assert DeltaTable(tail_path(path)).to_pyarrow_table().num_rows == 0
    assert DeltaTable(path).transaction_version(txn_app_id("q2")) == 1 * PARTS
