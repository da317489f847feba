"""``silver.mirrors.net_changes``: the mirrors' net of a table's changes to one row per key (TOAST,
deletes, key changes), checked case by case and against a plain reference net on random
batches; what a batch holds per table; where a batch is cut."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from core.captured import MARKER_PREFIX
from silver.mirrors.mirror_writer import chain_cuts
from silver.mirrors.net_changes import (
    column_values,
    complete_through,
    first_failure,
    net_changes,
    in_order_range,
    key_moves,
    tables_in_batch,
)
from silver.schema import SILVER_CHANGES

SCHEMA = to_arrow_schema(SILVER_CHANGES)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def change(lsn, seq, op, columns=None, identity=None, table="t", types=None):
    row = {f.name: None for f in SILVER_CHANGES.fields}
    row.update(commit_lsn=lsn, seq=seq, tx_changes=1, lsn=lsn, op=op, schema_name="public",
               table_name=table, columns=None if columns is None else list(columns.items()),
               identity=None if identity is None else list(identity.items()),
               column_types=None if types is None else list(types.items()),
               commit_ts=T0 + dt.timedelta(seconds=lsn))
    return row


def batch(rows) -> pa.Table:
    return pa.Table.from_pylist(rows, SCHEMA)


def net(rows, key=("a", "b"), moves=True):
    out = net_changes(batch(rows), key, moves).to_pylist()
    return {tuple(r["_key"].values()): (r["_exists"], dict(r["_values"]), r["_lsn"])
            + ((tuple(r["_from"].values()),) if r["_from"] else ()) for r in out}


def test_net_orders_by_commit_and_keeps_what_an_update_leaves_out():
    """Rows arrive in any order; the last change wins per column; an UPDATE without the
    TOASTed column ``big`` leaves it out of the values (the MERGE keeps the mirror's)."""
    rows = [
        change(30, 0, "U", {"a": "1", "b": "x", "n": "3"}),               # big omitted
        change(10, 0, "I", {"a": "1", "b": "x", "n": "1", "big": "B1"}),
        change(20, 1, "U", {"a": "1", "b": "x", "n": "2", "big": "B2"}),
        change(20, 0, "U", {"a": "2", "b": "y", "n": "9"}),               # only an update
    ]
    got = net(rows)
    assert got[("1", "x")] == (True, {"a": "1", "b": "x", "n": "3", "big": "B2"}, 30)
    assert got[("2", "y")] == (True, {"a": "2", "b": "y", "n": "9"}, 20)
    # No key moves in the batch: the net without the old rows' lookup is the same.
    assert net(rows, moves=False) == got


def test_net_delete_then_insert_and_key_change():
    rows = [
        change(10, 0, "I", {"a": "1", "b": "x", "n": "1", "big": "B1"}),
        change(11, 0, "D", identity={"a": "1", "b": "x"}),
        change(12, 0, "I", {"a": "1", "b": "x", "n": "5", "big": None}),   # NULL is a value
        # The key moves from (3, z) to (4, z): the old key goes, the new one is upserted.
        change(13, 0, "U", {"a": "4", "b": "z", "n": "7"}, identity={"a": "3", "b": "z"}),
        # (7, v) is inserted, then moved to (8, v) by an UPDATE that leaves out big: the
        # moved row keeps big from the insert earlier in the batch; (7, v)'s changes after
        # the move are another row's.
        change(16, 0, "I", {"a": "7", "b": "v", "n": "1", "big": "B7"}),
        change(17, 0, "U", {"a": "8", "b": "v", "n": "2"}, identity={"a": "7", "b": "v"}),
        change(18, 0, "I", {"a": "7", "b": "v", "n": "3", "big": "other"}),
        change(14, 0, "D", identity={"a": "5", "b": "q"}),
        # FULL identity: every old value, key unchanged - an ordinary update.
        change(15, 0, "U", {"a": "6", "b": "w", "n": "8"},
               identity={"a": "6", "b": "w", "n": "7"}),
    ]
    got = net(rows)
    assert got[("1", "x")] == (True, {"a": "1", "b": "x", "n": "5", "big": None}, 12)
    assert got[("3", "z")] == (False, {}, 13)
    # The moved row's columns the UPDATE left out come from the mirror's row at (3, z).
    assert got[("4", "z")] == (True, {"a": "4", "b": "z", "n": "7"}, 13, ("3", "z"))
    assert got[("5", "q")] == (False, {}, 14)
    assert got[("6", "w")] == (True, {"a": "6", "b": "w", "n": "8"}, 15)
    assert got[("8", "v")] == (True, {"a": "8", "b": "v", "n": "2", "big": "B7"}, 17,
                               ("7", "v"))
    assert got[("7", "v")] == (True, {"a": "7", "b": "v", "n": "3", "big": "other"}, 18)
    assert len(got) == 7


def test_the_netted_values_spread_into_a_text_and_a_set_flag_per_column():
    """A column a row's changes never carried is unset (the MERGE keeps the mirror's); one
    carried as NULL is set, to NULL."""
    rows = [change(10, 0, "I", {"a": "1", "b": "x", "n": "1", "big": None}),
            change(11, 0, "U", {"a": "2", "b": "x", "n": "2"}),
            change(12, 0, "D", identity={"a": "3", "b": "x"})]
    flat = column_values(net_changes(batch(rows), ("a", "b")), ["n", "big", "never"])
    got = {tuple(r["_key"].values()): r for r in flat.to_pylist()}
    assert "_values" not in flat.column_names
    assert [got[("1", "x")][f"__lakecdc_{w}_{i}"] for i in range(3) for w in ("text", "has")] \
        == ["1", True, None, True, None, False]
    assert [got[("2", "x")][f"__lakecdc_{w}_{i}"] for i in range(3) for w in ("text", "has")] \
        == ["2", True, None, False, None, False]
    assert not any(got[("3", "x")][f"__lakecdc_has_{i}"] for i in range(3))


def test_an_empty_batch_nets_to_no_rows():
    out = net_changes(batch([]), ("a", "b"))
    assert out.num_rows == 0
    assert out.column_names == ["_key", "_exists", "_values", "_from", "_lsn", "_ts"]


def reference(rows, key):
    """The rules of ``silver.mirrors.mirror_writer``'s docstring applied one change at a
    time, in order."""
    events = []
    for r in rows:
        cols, ident = dict(r["columns"] or []), dict(r["identity"] or [])
        new, old = tuple(cols.get(k) for k in key), tuple(ident.get(k) for k in key)
        at = (r["commit_lsn"], r["seq"])
        if r["op"] == "D":
            events.append((old, at, 0, None, r["commit_ts"], None))
        elif r["op"] == "U" and r["identity"] is not None and old != new:
            events += [(old, at, 0, None, r["commit_ts"], None),
                       (new, at, 1, cols, r["commit_ts"], old)]
        else:
            events.append((new, at, 1, cols, r["commit_ts"], None))
    state: dict = {}
    left: dict = {}                         # old key -> its values just before it moved
    for k, at, sub, cols, ts, src in sorted(events, key=lambda e: (e[1], e[2])):
        s = state.setdefault(k, {"exists": False, "vals": {}, "from": None, "lsn": 0})
        s["lsn"], s["ts"] = max(s["lsn"], at[0]), ts
        if cols is None:
            left[(k, at)] = s["vals"]
            s.update(exists=False, vals={}, **{"from": None})
        elif src is not None:
            before = left.get((src, at), {})
            s.update(exists=True, vals={**before, **cols}, **{"from": src})
        else:
            s.update(exists=True, vals={**s["vals"], **cols})
    return {k: (s["exists"], s["vals"], s["lsn"], s["ts"], s["from"]) for k, s in state.items()}


@pytest.mark.parametrize("seed", range(8))
def test_the_net_equals_a_change_by_change_reference_on_random_batches(seed):
    """Inserts, UPDATEs that leave a column out, deletes and key moves over a few keys, in
    any order; cut where a row moves twice (``chain_cuts``), as the writer cuts."""
    rng = random.Random(seed)
    for _ in range(40):
        rows, lsn = [], 100
        for i in range(rng.randint(1, 30)):
            lsn += rng.randint(0, 1)
            a, kind = str(rng.randint(1, 5)), rng.random()
            cols = {"a": a, "b": "x", "n": str(i)}
            if rng.random() < 0.4:
                cols["big"] = f"B{i}"
            if kind < 0.35:
                rows.append(change(lsn, i, "I", cols))
            elif kind < 0.7:
                rows.append(change(lsn, i, "U", cols))
            elif kind < 0.85:
                rows.append(change(lsn, i, "D", identity={"a": a, "b": "x"}))
            else:
                rows.append(change(lsn, i, "U", {**cols, "a": str(rng.randint(1, 5))},
                                   identity={"a": a, "b": "x"}))
        rng.shuffle(rows)
        table = batch(rows)
        moves = key_moves(table, ("a", "b"))
        bounds = [None, *chain_cuts(moves), None]
        for lo, hi in zip(bounds, bounds[1:]):
            part = in_order_range(table, lo, hi)
            got = {tuple(r["_key"].values()): (
                r["_exists"], dict(r["_values"]), r["_lsn"], r["_ts"],
                tuple(r["_from"].values()) if r["_from"] else None)
                for r in net_changes(part, ("a", "b"), bool(moves)).to_pylist()}
            assert got == reference(part.to_pylist(), ("a", "b")), (seed, lo, hi)


def test_a_batch_says_per_table_whether_an_update_moved_a_row_to_another_key():
    """With the mirror's key known, an UPDATE whose identity is wider than the key (the
    counted tables' dims index, FULL) moves nothing unless the key itself changed; without
    it, any identity counts as a possible move."""
    rows = [change(10, 0, "U", {"a": "1", "b": "x", "n": "2"},
                   identity={"a": "1", "b": "x", "n": "1"}, table="wide", types={"n": "int"}),
            change(11, 0, "U", {"a": "2", "b": "x"}, identity={"a": "1", "b": "x"},
                   table="moving"),
            change(12, 0, "U", {"a": "5", "b": "x"}, table="moving"),
            change(13, 0, "U", {"a": "1", "b": "x"}, identity={"a": "1", "b": "x"},
                   table="unknown"),
            change(14, 0, "T", table="moving"), change(14, 1, "T", table="moving"),
            {**change(15, 0, "M"), "table_name": None, "schema_name": None,
             "message_prefix": MARKER_PREFIX}]
    found, marker = tables_in_batch(batch(rows), {"public.wide": ("a", "b"),
                                                   "public.moving": ("a", "b")})
    by_table = {t.table: t for t in found}
    assert {t: f.moved for t, f in by_table.items()} == {"wide": False, "moving": True,
                                                         "unknown": True}
    assert by_table["moving"].truncated == (14, 1) and by_table["wide"].truncated is None
    assert by_table["wide"].types == {"n": "int"} and by_table["moving"].newest == 14
    assert marker == 15


def test_the_first_failed_change_above_the_accepted_point_stops_the_batch():
    rows = [change(10, 0, "I", {"a": "1", "b": "x"}), {**change(20, 0, None), "error": "bad"}]
    assert first_failure(batch(rows), 0) == (20, "bad")
    assert first_failure(batch(rows), 20) is None


def test_the_mirrors_are_complete_through_the_newest_transaction_the_batch_holds_whole():
    """A transaction whose rows the batch does not all hold (its ``tx_changes``) is not
    complete there; one after it is, and so is everything before it."""
    def rows(lsn, n, held):
        return [{**change(lsn, i, "I", {"a": str(i), "b": "x"}), "tx_changes": n}
                for i in range(held)]

    assert complete_through(batch([])) is None
    assert complete_through(batch(rows(30, 3, 2))) is None                 # split
    assert complete_through(batch(rows(10, 2, 2) + rows(30, 3, 2))) == (
        10, T0 + dt.timedelta(seconds=10))
    assert complete_through(batch(rows(30, 3, 1) + rows(40, 1, 1)))[0] == 40


def test_a_batch_that_moves_a_row_twice_is_cut_before_the_second_move():
    a, b, c, d = ("1", "x"), ("2", "x"), ("3", "x"), ("9", "y")
    assert chain_cuts([(10, 1, a, b), (20, 1, d, c)]) == []            # two separate moves
    assert chain_cuts([(10, 1, a, b), (20, 1, b, c)]) == [(20, 1)]     # A -> B -> C
    assert chain_cuts([(10, 1, a, b), (10, 2, b, c), (11, 1, c, a)]) == [(10, 2), (11, 1)]
    assert chain_cuts([]) == []


def test_a_column_looked_up_in_a_map_is_what_arrows_map_lookup_gives():
    """``_lookup`` on the flattened entries equals ``pc.map_lookup(..., "first")``: absent
    names, NULL maps, a repeated name, slices and chunks."""
    import pyarrow.compute as pc

    from silver.mirrors.net_changes import _lookup

    maps = pa.array([[("a", "1"), ("b", None)], None, [], [("b", "2"), ("a", "3"), ("a", "4")],
                     [("c", "5")], [("a", None)]], pa.map_(pa.string(), pa.string()))
    for values in (maps, maps.slice(2), maps.slice(1, 3), pa.chunked_array([maps[:2], maps[2:]])):
        for name in ("a", "b", "c", "z"):
            expected = pc.map_lookup(values, pa.scalar(name), "first")
            if isinstance(expected, pa.ChunkedArray):
                expected = expected.combine_chunks()
            assert _lookup(values, name).to_pylist() == expected.to_pylist(), (name, values)
