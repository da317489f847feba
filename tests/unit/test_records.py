"""Peek rows → bronze records, on recorded wal2json 2.5 output (tests/fixtures/wal2json).

The expected values are derived here from the JSON itself (json.loads), independently of
the vectorised code under test.
"""

import json
import struct
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bronze.backfill_marks import (BACKFILL_PREFIX, HighMark, Window, changed_keys,
                                   high_marks, key_columns_of, key_columns_text, key_text,
                                   key_values, parse_mark, partial_read, read_records)
from bronze.records import (BRONZE_SCHEMA, COPY_HEADER_LEN, MalformedPeek, PeekColumns,
                            TransactionAssembler, _valid_messages, decode_copy_rows,
                            finalize)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "wal2json" / "peek_mixed.jsonl"


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def load_rows():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def columns(rows) -> PeekColumns:
    """What the shipper's peek query returns, computed in plain Python."""
    commit, ts, action, text = [], [], [], []
    for _lsn, _xid, data in rows:
        doc = json.loads(data)
        action.append(ord(doc["action"]))
        text.append("" if doc["action"] in "BC" else data)
        if doc["action"] == "B":
            commit.append(lsn_int(doc["lsn"]))
            stamp = datetime.fromisoformat(doc["timestamp"].replace("+00", "+00:00"))
            ts.append(int(stamp.timestamp() * 1_000_000))
        else:
            commit.append(0)
            ts.append(0)
    return PeekColumns(
        lsn=np.array([lsn_int(r[0]) for r in rows], dtype=np.int64),
        xid=np.array([r[1] for r in rows], dtype=np.int64),
        commit_lsn=np.array(commit, dtype=np.int64),
        commit_ts_us=np.array(ts, dtype=np.int64),
        action=np.array(action, dtype=np.uint8),
        data=pa.array(text, pa.string()))


def expected_transactions(rows):
    """commit_lsn → [(seq, action, data)] by walking B/C framing in Python."""
    result, current, commit = {}, None, None
    for _lsn, _xid, data in rows:
        doc = json.loads(data)
        if doc["action"] == "B":
            current, commit = [], lsn_int(doc["lsn"])
        elif doc["action"] == "C":
            if current:
                result[commit] = current
            current = None
        elif current is None:
            result[lsn_int(doc["lsn"])] = [(0, "M", data)]
        else:
            current.append((len(current), doc["action"], data))
    return result


def assemble(rows, after=0, chunk=None):
    asm = TransactionAssembler(after)
    chunk = chunk or len(rows)
    batches = [asm.add(columns(rows[i:i + chunk])) for i in range(0, len(rows), chunk)]
    summary = asm.finish()
    shipped = pa.scalar(0, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    table = pa.Table.from_batches([finalize(b, summary.tx_changes, "slot1", shipped)
                                   for b in batches])
    return table, summary


def grouped(table):
    result = {}
    for r in table.to_pylist():
        result.setdefault(r["commit_lsn"], []).append((r["seq"], r["action"], r["data"]))
    return result


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 5])
def test_whole_transactions_keyed_by_commit_lsn_and_seq_whatever_the_chunking(chunk):
    rows = load_rows()
    table, summary = assemble(rows, chunk=chunk)
    expected = expected_transactions(rows)
    assert grouped(table) == expected
    tx_changes = {r["commit_lsn"]: r["tx_changes"] for r in table.to_pylist()}
    assert tx_changes == {k: len(v) for k, v in expected.items()}
    assert summary.kept == sum(map(len, expected.values()))
    assert summary.transactions == len(expected)
    assert summary.max_commit_lsn == max(expected)
    assert summary.last_lsn == lsn_int(rows[-1][0])       # end of the last transaction
    assert summary.rows == len(rows)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_rows_of_closed_transactions_have_their_final_count_after_each_chunk(chunk):
    """What the shipper relies on to write rows while the peek streams: after every chunk,
    the open transaction's rows are the last ones returned, and every other row's
    transaction already has its final ``tx_changes``."""
    rows = load_rows()
    asm = TransactionAssembler(0)
    seen = []                                  # (gid, tx_changes as known then) per row
    for i in range(0, len(rows), chunk):
        gids = asm.add(columns(rows[i:i + chunk])).column("gid").to_pylist()
        open_gid = asm.open_gid
        closed = [g for g in gids if g != open_gid]
        assert gids[:len(closed)] == closed                # the open one is a suffix
        seen += [(g, int(asm.tx_changes[g])) for g in closed]
        seen += [(g, None) for g in gids[len(closed):]]
    final = asm.finish().tx_changes
    assert len(seen) == sum(map(len, expected_transactions(rows).values()))
    assert any(known is None for _, known in seen)         # some did wait
    for gid, known in seen:
        if known is not None:
            assert known == final[gid]
    assert asm.open_gid is None


def test_begin_and_commit_rows_fold_into_columns_and_messages_stand_alone():
    rows = load_rows()
    table, _ = assemble(rows)
    assert set(table.column("action").to_pylist()) == {"I", "U", "D", "M"}
    solo = [r for r in table.to_pylist() if r["xid"] is None]
    assert len(solo) == 1 and solo[0]["action"] == "M" and solo[0]["commit_ts"] is None
    assert solo[0]["commit_lsn"] == solo[0]["lsn"] and solo[0]["tx_changes"] == 1
    inside = [r for r in table.to_pylist() if r["action"] == "M" and r["xid"] is not None]
    assert len(inside) == 1 and inside[0]["commit_ts"] is not None
    assert table.schema.field("slot").nullable is False
    assert set(table.column("slot").to_pylist()) == {"slot1"}


def test_transactions_at_or_below_the_recorded_version_are_dropped():
    rows = load_rows()
    expected = expected_transactions(rows)
    cut = sorted(expected)[1]
    table, summary = assemble(rows, after=cut)
    assert set(grouped(table)) == {k for k in expected if k > cut}
    # The slot may still move past everything peeked.
    assert summary.last_lsn == lsn_int(rows[-1][0])
    table, summary = assemble(rows, after=max(expected))
    assert table.num_rows == 0 and summary.kept == 0 and summary.max_commit_lsn is None


def test_empty_transactions_produce_no_rows_but_move_the_end():
    rows = [r for r in load_rows()[:5]]            # insert txn, then an uncaptured-only txn
    table, summary = assemble(rows[3:])            # just the B/C of the empty transaction
    assert table.num_rows == 0 and summary.kept == 0
    assert summary.last_lsn == lsn_int(rows[4][0])


def test_a_peek_ending_inside_a_transaction_is_refused():
    rows = load_rows()[:-1]                        # drop the last C
    asm = TransactionAssembler(0)
    asm.add(columns(rows))
    with pytest.raises(MalformedPeek, match="inside a transaction"):
        asm.finish()


def test_broken_framing_is_refused():
    rows = load_rows()
    with pytest.raises(MalformedPeek, match="framing"):
        TransactionAssembler(0).add(columns(rows[1:]))     # change row with no B
    swapped = rows[:1] + rows[3:4] + rows[1:3]             # B inside an open transaction
    with pytest.raises(MalformedPeek, match="framing"):
        TransactionAssembler(0).add(columns(swapped))


def test_a_change_with_another_xid_inside_a_transaction_is_refused():
    rows = [list(r) for r in load_rows()[:3]]
    rows[1][1] = 99999
    with pytest.raises(MalformedPeek, match="xid"):
        TransactionAssembler(0).add(columns(rows))


def _copy_tuple(lsn, xid, commit, ts, action, data: bytes) -> bytes:
    head = struct.pack(">hiqiqiqiqihi", 6, 8, lsn, 8, xid, 8, commit, 8, ts, 2, action,
                       len(data))
    return head + data


def test_binary_copy_tuples_decode_column_wise():
    rows = load_rows()
    cols = columns(rows)
    tuples = [_copy_tuple(int(cols.lsn[i]), int(cols.xid[i]), int(cols.commit_lsn[i]),
                          int(cols.commit_ts_us[i]), int(cols.action[i]),
                          cols.data[i].as_py().encode())
              for i in range(len(rows))]
    decoded = decode_copy_rows([memoryview(t) for t in tuples])
    for name in ("lsn", "xid", "commit_lsn", "commit_ts_us", "action"):
        assert np.array_equal(getattr(decoded, name), getattr(cols, name)), name
    assert decoded.data.to_pylist() == cols.data.to_pylist()
    assert bytes(decoded.action.view("S1").tobytes()).decode() == \
        "".join(json.loads(r[2])["action"] for r in rows)
    assert COPY_HEADER_LEN == 19


@pytest.mark.parametrize("last", [b"", b"x", b"a" * 12, b"b" * 13])
def test_binary_copy_texts_of_every_length_decode_in_place(last):
    """Texts kept inline in Arrow's views (12 bytes or fewer) and texts addressed in the
    joined tuples alike, wherever they are, the last one too."""
    texts = [b"", b'{"action":"I"}', b"y" * 11, b"z" * 12, "é€".encode() * 5, b"", last]
    tuples = [memoryview(_copy_tuple(i + 1, 7, 0, 0, ord("I"), t)) for i, t in enumerate(texts)]
    decoded = decode_copy_rows(tuples)
    assert decoded.data.to_pylist() == [t.decode() for t in texts]
    assert decoded.lsn.tolist() == list(range(1, len(texts) + 1))
    assert len(decode_copy_rows([]).data) == 0


def test_binary_copy_with_an_unexpected_layout_is_refused():
    bad = struct.pack(">hiq", 1, 8, 5)
    with pytest.raises(MalformedPeek, match="layout"):
        decode_copy_rows([bad + b"\x00" * 60])
    with pytest.raises(MalformedPeek, match="shorter"):
        decode_copy_rows([bad])
    good = _copy_tuple(1, 7, 0, 0, ord("I"), b"{}")
    with pytest.raises(MalformedPeek, match="layout"):     # a text longer than it says
        decode_copy_rows([memoryview(good + b"}")])
    with pytest.raises(MalformedPeek, match="layout"):     # a NULL text
        decode_copy_rows([memoryview(good[:-6] + struct.pack(">i", -1))])


# --- snapshot backfill: HIGH watermarks, window drops, read rows ----------------------------

TS = "2026-11-21 05:42:43.5+00"


def peek_tx(commit: str, xid: int, *changes: dict) -> list:
    """A transaction as peek rows (lsn, xid, data): B, the changes, C."""
    def row(doc):
        return (doc.get("lsn", commit), xid, json.dumps(doc, separators=(",", ":")))
    return ([row({"action": "B", "xid": xid, "timestamp": TS, "lsn": commit})]
            + [row({"xid": xid, "timestamp": TS, **c}) for c in changes]
            + [row({"action": "C", "xid": xid, "timestamp": TS, "lsn": commit})])


def message(prefix: str, content, transactional: bool = True, lsn: str = "0/1") -> dict:
    text = content if isinstance(content, str) else json.dumps(content)
    return {"action": "M", "lsn": lsn, "transactional": transactional, "prefix": prefix,
            "content": text}


def write(action: str, key, table: str = "notifications", old=None, lsn: str = "0/1") -> dict:
    doc = {"action": action, "lsn": lsn, "schema": "public", "table": table}
    if action != "D":
        doc["columns"] = [{"name": "id", "type": "uuid", "value": key},
                          {"name": "notification_status", "type": "text", "value": "sent"}]
    if old is not None:
        doc["identity"] = [{"name": "id", "type": "uuid", "value": old}]
    return doc


def assembled(rows):
    asm = TransactionAssembler(0)
    batch = asm.add(columns(rows))
    return batch, asm.finish()


RUN = "20261124T050000Z-abc123"


def test_only_transactional_high_watermarks_of_the_backfill_are_marks():
    high = {"run": RUN, "table": "public.notifications", "chunk": 3, "mark": "high"}
    rows = (peek_tx("0/100", 10, write("I", "k1"))
            + peek_tx("0/200", 11, message(BACKFILL_PREFIX, {**high, "mark": "low"}))
            + peek_tx("0/300", 12, message(BACKFILL_PREFIX, high, lsn="0/2F0"))
            + peek_tx("0/400", 13, message("lakecdc.marker", high))
            + peek_tx("0/500", 14, message(BACKFILL_PREFIX, "not json"))
            + [("0/600", 0, json.dumps(message(BACKFILL_PREFIX, high, transactional=False,
                                               lsn="0/600")))])
    batch, _ = assembled(rows)
    marks, rejected = high_marks(batch)
    assert rejected == 2                         # "not json", and the non-transactional one
    assert [(m.run, m.table, m.chunk, m.commit_lsn, m.seq, m.xid, m.lsn) for m in marks] == \
        [(RUN, "public.notifications", 3, 0x300, 0, 12, 0x2F0)]
    assert marks[0].commit_ts_us == int(datetime.fromisoformat(
        TS.replace("+00", "+00:00")).timestamp() * 1_000_000)
    assert marks[0].gid == 2                       # the third transaction of the peek
    assert high_marks(assembled(peek_tx("0/100", 10, write("I", "k1")))[0]) == ([], 0)


def test_window_holds_changes_after_low_before_high_and_of_transactions_the_snapshot_missed():
    window = Window(RUN, 1, "public.notifications", ("id",), low_lsn=0x50, high_lsn=0x200,
                    in_progress=frozenset({7}))
    rows = (peek_tx("0/40", 7, write("U", "k1", old="k1"))    # before LOW, but invisible
            + peek_tx("0/45", 6, write("U", "k2", old="k2"))  # before LOW, visible: kept
            + peek_tx("0/60", 8, write("U", "k4", old="k3"))  # key change: both keys
            + peek_tx("0/150", 9, write("D", None, old="k5"),
                      write("I", "k6", table="notification_history"),   # other table
                      message("app", "x"))
            + peek_tx("0/180", 12, write("I", "k8"))
            + peek_tx("0/200", 10, message(BACKFILL_PREFIX, "{}"))    # the HIGH itself
            + peek_tx("0/250", 11, write("U", "k7", old="k7")))       # after HIGH: kept
    batch, _ = assembled(rows)
    got = changed_keys(batch.column("commit_lsn"), batch.column("xid"),
                       batch.column("action"), batch.column("data"), [window])
    both = {"id", "notification_status"}
    # k3 and k5 left their keys (moved away, deleted): None; the others, the columns carried.
    assert got == {(RUN, 1): {"k1": both, "k3": None, "k4": both, "k5": None, "k8": both}}
    # Without the in-progress transactions only the LSN range counts.
    plain = Window(RUN, 1, "public.notifications", ("id",), 0x50, 0x200)
    got = changed_keys(batch.column("commit_lsn"), batch.column("xid"),
                       batch.column("action"), batch.column("data"), [plain])
    assert got == {(RUN, 1): {"k3": None, "k4": both, "k5": None, "k8": both}}


def test_a_key_that_left_in_the_window_stays_left_whatever_came_before_or_after():
    window = Window(RUN, 1, "public.notifications", ("id",), low_lsn=0x50, high_lsn=0x400)
    rows = (peek_tx("0/60", 8, write("U", "k1", old="k1"))
            + peek_tx("0/70", 9, write("D", None, old="k1"))
            + peek_tx("0/80", 10, write("I", "k1")))
    batch, _ = assembled(rows)
    got = changed_keys(batch.column("commit_lsn"), batch.column("xid"),
                       batch.column("action"), batch.column("data"), [window])
    assert got == {(RUN, 1): {"k1": None}}


READ = ('{"action":"R","schema":"public","table":"t","columns":['
        '{"name":"id","type":"integer","value":7},'
        '{"name":"n","type":"numeric(30,10)","value":12345678901234567890.0000000001},'
        r'{"name":"name","type":"text","value":"caf\u00e9 \"x\""},'
        '{"name":"body","type":"text","value":"long"},'
        '{"name":"gone","type":"text","value":null}]}')


def test_a_read_row_changed_in_its_window_keeps_only_the_columns_no_change_carried():
    cut = partial_read(READ, ("id",), {"id", "name", "n"})
    assert json.loads(cut) == {"action": "R", "schema": "public", "table": "t", "columns": [
        {"name": "id", "type": "integer", "value": 7},
        {"name": "body", "type": "text", "value": "long"},
        {"name": "gone", "type": "text", "value": None}]}
    # Numbers are written back as the source printed them, not through a float; text
    # round-trips.
    kept = partial_read(READ, ("id",), {"id", "body"})
    assert '"value":12345678901234567890.0000000001}' in kept
    assert [(c["name"], c["value"]) for c in json.loads(kept)["columns"]][1:] == [
        ("n", 12345678901234567890.0000000001), ("name", 'café "x"'), ("gone", None)]
    # Every column carried, or the row left its key: nothing is kept.
    assert partial_read(READ, ("id",), {"id", "n", "name", "body", "gone"}) is None
    assert partial_read(READ, ("id",), None) is None


def test_a_composite_key_is_one_text_that_reads_back_and_matches_the_changes_key():
    assert key_text(("7",)) == "7" and key_values("7", 1) == ("7",)
    both = key_text(("7", 'fr "ca", é'))
    assert both == '["7","fr \\"ca\\", é"]' and key_values(both, 2) == ("7", 'fr "ca", é')
    assert key_columns_of(key_columns_text(("id",))) == ("id",)
    assert key_columns_of(key_columns_text(("doc", "lang"))) == ("doc", "lang")
    text = ('{"action":"U","schema":"public","table":"t","columns":['
            '{"name":"doc","type":"integer","value":7},'
            '{"name":"lang","type":"text","value":"fr \\"ca\\", é"},'
            '{"name":"v","type":"text","value":"x"}],'
            '"identity":[{"name":"doc","type":"integer","value":7},'
            '{"name":"lang","type":"text","value":"en"}]}')
    got = changed_keys(pa.array([5], pa.int64()), pa.array([1], pa.int64()),
                       pa.array(["U"]), pa.array([text]),
                       [Window("r", 2, "public.t", ("doc", "lang"), 1, 9)])
    # The new key carried its columns; the old one (the UPDATE moved the row) is left.
    assert got == {("r", 2): {both: {"doc", "lang", "v"}, key_text(("7", "en")): None}}
    read = ('{"action":"R","schema":"public","table":"t","columns":['
            '{"name":"doc","type":"integer","value":7},'
            '{"name":"lang","type":"text","value":"en"},{"name":"v","type":"text","value":"y"}]}')
    assert [c["name"] for c in json.loads(partial_read(read, ("doc", "lang"), {"doc", "lang"}))[
        "columns"]] == ["doc", "lang", "v"]
    assert partial_read(read, ("doc", "lang"), {"doc", "lang", "v"}) is None


def test_window_keys_are_text_as_postgres_prints_them_also_for_numbers():
    text = ('{"action":"U","schema":"public","table":"t",'
            '"columns":[{"name":"n","type":"numeric","value":1.50}],'
            '"identity":[{"name":"n","type":"numeric","value":12345678901234567890}]}')
    got = changed_keys(pa.array([5], pa.int64()), pa.array([1], pa.int64()),
                       pa.array(["U"]), pa.array([text]),
                       [Window("r", 2, "public.t", ("n",), 1, 9)])
    assert got == {("r", 2): {"1.50": {"n"}, "12345678901234567890": None}}


def test_read_rows_join_the_high_watermark_transaction_after_its_rows():
    mark = HighMark(gid=0, commit_lsn=0x300, seq=0, xid=12, lsn=0x2F0,
                    commit_ts_us=1_700_000_000_000_000, run=RUN,
                    table="public.notifications", chunk=3)
    shipped = pa.scalar(5, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    batch = read_records(pa.array(['{"action":"R"}', '{"action":"R","x":1}']), mark,
                         first_seq=1, tx_changes=3, slot="s1", shipped_at=shipped)
    rows = batch.to_pylist()
    assert batch.schema == BRONZE_SCHEMA
    assert [(r["commit_lsn"], r["seq"], r["tx_changes"], r["xid"], r["lsn"], r["action"])
            for r in rows] == [(0x300, 1, 3, 12, 0x2F0, "R"), (0x300, 2, 3, 12, 0x2F0, "R")]
    assert {r["slot"] for r in rows} == {"s1"}
    assert rows[0]["commit_ts"].timestamp() == 1_700_000_000
    assert [r["data"] for r in rows] == ['{"action":"R"}', '{"action":"R","x":1}']


@pytest.mark.parametrize("content", [
    "[" * 100_000,                                                     # deep nesting
    "x" * 10_000_000,                                                  # oversized
    json.dumps({"run": RUN, "table": "public.t", "chunk": 1, "mark": "high", "x": 1}),
    json.dumps({"run": RUN, "table": "public.t", "chunk": True, "mark": "high"}),
    json.dumps({"run": RUN, "table": "public.t", "chunk": 2**40, "mark": "high"}),
    json.dumps({"run": "r1", "table": "public.t", "chunk": 1, "mark": "high"}),
    json.dumps({"run": RUN, "table": "public.t\n", "chunk": 1, "mark": "high"}),
    json.dumps({"run": RUN, "table": "pub\ud800", "chunk": 1, "mark": "high"}),
    json.dumps([RUN, "public.t", 1, "high"]),
    "\ud800\udfff{",
])
def test_a_mark_that_is_not_exactly_one_is_none_and_never_raises(content):
    assert parse_mark(content) is None


def test_a_well_formed_mark_parses():
    text = json.dumps({"run": RUN, "table": "public.t", "chunk": 7, "mark": "high"})
    assert parse_mark(text) == (RUN, "public.t", 7, "high")


def test_forged_and_huge_messages_are_counted_not_raised():
    rows = (peek_tx("0/100", 10, message(BACKFILL_PREFIX, "[" * 100_000))
            + peek_tx("0/200", 11, message(BACKFILL_PREFIX, "y" * 3_000_000))
            + peek_tx("0/300", 12, message("other.app", "[" * 100_000)))
    batch, _ = assembled(rows)
    assert high_marks(batch) == ([], 2)


def test_invalid_utf8_in_a_message_becomes_replacement_characters_and_nothing_else_moves():
    texts = [b'{"action":"I"}', b'{"action":"M","content":"\xff\xfe ok"}', b'{"action":"U"}']
    data = b"".join(texts)
    offsets = np.array([0, 14, 14 + len(texts[1]), len(data)], dtype=np.int32)
    action = np.array([ord("I"), ord("M"), ord("U")], dtype=np.uint8)
    fixed, new = _valid_messages(data, offsets, action)
    out = pa.StringArray.from_buffers(3, pa.py_buffer(new), pa.py_buffer(fixed))
    out.validate(full=True)
    assert out.to_pylist() == ['{"action":"I"}', '{"action":"M","content":"\ufffd\ufffd ok"}',
                               '{"action":"U"}']
    assert _valid_messages(b"ab", np.array([0, 2], np.int32), np.array([ord("M")], np.uint8)
                           )[0] == b"ab"
