"""``pipelines.verify.mirror_check.apply_changes``: verify's own account of the mirror rules
(pure)."""

from __future__ import annotations

from pipelines.verify.mirror_check import apply_changes, truncated

KEY = ("id",)


def change(op, lsn, seq=1, columns=None, identity=None):
    return {"op": op, "commit_lsn": lsn, "seq": seq, "columns": columns, "identity": identity}


def test_inserts_updates_and_deletes_in_commit_order_not_list_order():
    rows = {("1",): {"id": "1", "name": "a", "body": "long"}}
    changes = [change("D", 30, identity={"id": "2"}),
               change("U", 10, columns={"id": "1", "name": "b"}),      # body left out (TOAST)
               change("I", 20, columns={"id": "2", "name": "c", "body": "x"})]
    assert apply_changes(rows, changes, KEY) == {("1",): {"id": "1", "name": "b", "body": "long"},
                                                 ("2",): None}


def test_a_key_change_moves_the_row_with_the_columns_it_left_out():
    rows = {("1",): {"id": "1", "name": "a", "body": "long"}}
    changes = [change("U", 10, columns={"id": "9", "name": "b"}, identity={"id": "1"}),
               change("U", 10, 2, columns={"id": "9", "name": "c"})]
    assert apply_changes(rows, changes, KEY) == {("1",): None,
                                                 ("9",): {"id": "9", "name": "c", "body": "long"}}


def test_a_read_row_replaces_and_an_insert_after_a_delete_starts_afresh():
    rows = {("1",): {"id": "1", "name": "a", "body": "long"}}
    changes = [change("D", 10, identity={"id": "1"}),
               change("I", 20, columns={"id": "1", "name": "new"}),
               change("R", 30, columns={"id": "2", "name": "read", "body": "b"})]
    assert apply_changes(rows, changes, KEY) == {("1",): {"id": "1", "name": "new"},
                                                 ("2",): {"id": "2", "name": "read", "body": "b"}}


def test_a_truncate_ends_every_row_before_it_and_keeps_what_follows():
    rows = {("1",): {"id": "1"}, ("2",): {"id": "2"}}
    changes = [change("I", 10, columns={"id": "3"}), change("T", 20),
               change("I", 30, columns={"id": "4"})]
    assert truncated(changes)
    assert apply_changes(rows, changes, KEY) == {("1",): None, ("2",): None, ("3",): None,
                                                 ("4",): {"id": "4"}}


def test_composite_keys():
    key = ("a", "b")
    rows = {("1", "x"): {"a": "1", "b": "x", "v": "old"}}
    changes = [change("U", 10, columns={"a": "1", "b": "y", "v": "new"},
                      identity={"a": "1", "b": "x"})]
    assert apply_changes(rows, changes, key) == {("1", "x"): None,
                                                 ("1", "y"): {"a": "1", "b": "y", "v": "new"}}


def test_a_sampled_key_another_row_moved_onto_is_left_out_of_the_sample():
    from pipelines.verify.mirror_check import moved_onto

    key = ("a",)
    sample = {("1",): {"a": "1", "v": "x"}, ("2",): {"a": "2", "v": "y"}}
    changes = [change("D", 10, identity={"a": "1"}),
               change("U", 11, columns={"a": "1", "v": "moved"}, identity={"a": "9"}),
               change("U", 12, columns={"a": "3", "v": "z"}, identity={"a": "2"}),
               change("U", 13, columns={"a": "2", "v": "w"})]
    assert moved_onto(sample, changes, key) == {("1",)}     # from 9, not read: partial
    assert apply_changes(sample, changes, key)[("1",)] == {"v": "moved", "a": "1"}


def test_a_known_loss_is_named_apart_from_exact_and_from_drift():
    from pipelines.source.mirror_specs import specials_note
    from pipelines.verify.mirror_check import MirrorCheck
    from silver.mirrors.mirror_table import TableSpec
    from pipelines.verify.report import _mirror_line

    clean = _mirror_line(MirrorCheck("public.t", 10, 3, 100, 0))
    assert clean.startswith("mirror public.t: exact, 10 rows") and "loss" not in clean
    lost = _mirror_line(MirrorCheck("public.t", 10, 3, 100, 0, lost=2))
    assert lost.startswith("mirror public.t: equal to the source, 10 rows"), lost
    assert "exact" not in lost and lost.endswith(
        "known loss: 2 rows of the source held NaN or ±Infinity, which the mirror holds as "
        "NULL")
    sampled = _mirror_line(MirrorCheck("public.t", 10_000, 3, 100, 0, sampled=21))
    assert sampled.startswith("mirror public.t: exact, 10,000 rows (every key; 21 rows of a "
                              "sample compared column by column) (version 3"), sampled
    drift = _mirror_line(MirrorCheck("public.t", 10, 3, 100, 2, (("7",),), lost=1))
    assert "2 rows differ" in drift and "keys: 7; known loss: 1 row of" in drift, drift
    spec = TableSpec("public", "t", (("k", "integer"), ("a", "real"), ("b", "numeric"),
                                     ("c", "numeric(10,2)"), ("t", "text")), ("k",))
    assert specials_note(spec, numbers_as_text=False).startswith(
        "public.t: NaN and ±Infinity in a, b, c arrive as NULL (the source's wal2json prints "
        "them as null")
    assert specials_note(spec, numbers_as_text=True).startswith(
        "public.t: a NaN in c reaches its mirror as NULL")
    plain = TableSpec("public", "t", (("k", "integer"), ("t", "text")), ("k",))
    assert specials_note(plain, False) == specials_note(plain, True) == ""
