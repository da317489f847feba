"""``lakecdc push [--once]``: gold → the dashboard's Postgres ``service_stats``.

JVM-free: gold is read with delta-rs, Postgres written with psycopg 3 (where only Spark
reaches storage, ``LAKECDC_WRITER=spark``, gold is read through the engine the caller
passes in, in its Spark session: ``gold.view``). One push is steps 1-4 of docs/gold.md, "The
push": one Postgres transaction at one gold version ``V``, fenced on this gold table's row
of ``lakecdc_push_progress`` so a replayed or stale push changes nothing, writes the
*absolute* counts at ``V`` of the keys gold's change data feed names (every row for a full
push). All or nothing: the dashboard shows gold at one watermark.

``push_ahead`` adds a step of gold to the dashboard before gold's MERGE commits it - a
stream batch's planned step, or a shipper batch's before the stream reads it
(``gold.ahead``) - fenced on the dashboard being at the step's start (docs/gold.md, "Ahead
of gold", "Ahead of the stream"). In a running pipeline one writer does both, in one thread
(``gold.feeder``). The two tables here must never be captured (F20).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import psycopg
import pyarrow as pa
from psycopg import sql

from core.captured import DIMS
from core.errors import UserError
from core.postgres import connect
from core.storage import gold_key
from core.switches import NONE, Switches
from gold.feed import FeedUnreadable, GoldView, position_of
from gold.view import gold_view
from gold.view import open_gold as open_gold  # where the tests and callers find it

log = logging.getLogger("lakecdc.push")

STATS_TABLE = "service_stats"
PROGRESS_TABLE = "lakecdc_push_progress"
LAYER_TABLE = "lakecdc_layer_progress"
LAYERS = ("bronze", "silver", "gold", "dashboard")
MIRRORS_LAYER = "mirrors"       # recorded by the mirrors' query (``pipelines.run.mirror_progress``)
_STAGE = "lakecdc_push_stage"


@dataclass(frozen=True)
class PushResult:
    gold_version: int
    previous_version: int | None      # None: no push before (or another table)
    pushed: bool                      # False: already pushed, nothing changed
    full: bool = False
    upserted: int = 0
    deleted: int = 0
    source_commit_lsn: int | None = None
    seconds: float = 0.0


def dashboard_ddl() -> str:
    return resources.files("infra").joinpath("postgres/dashboard_schema.sql").read_text()


def ensure_dashboard_tables(conn: psycopg.Connection) -> None:
    """Create ``service_stats``, ``lakecdc_push_progress`` and ``lakecdc_layer_progress`` if
    absent. Idempotent. When all exist nothing is run, so a least-privilege writer role (no
    CREATE on the schema; ``infra/postgres/roles.sql``) passes."""
    if not dashboard_tables_exist(conn):
        with conn.transaction():
            conn.execute(dashboard_ddl())


def dashboard_tables_exist(conn: psycopg.Connection) -> bool:
    """Whether ``service_stats`` and both progress tables exist (setup's last step)."""
    return conn.execute("SELECT bool_and(to_regclass(t) IS NOT NULL) FROM unnest(%s::text[]) t",
                        [[STATS_TABLE, PROGRESS_TABLE, LAYER_TABLE]]).fetchone()[0]


def push_once(gold_path: str, dashboard_dsn: str, storage_options: dict | None = None, *,
              version: int | None = None, switches: Switches = NONE, full: bool = False,
              marks: dict | None = None, take_over: bool = False, engine=None) -> PushResult:
    """Push gold (at its latest version, or ``version``) to the dashboard; see module doc.
    ``engine``: what reads gold (``gold.view``; None: delta-rs); ``switches``: the fault
    points and guards of ``push_table``.

    ``full``: replace the dashboard with every gold row even if the feed is readable (after
    a rebuild), still guarded by version. ``marks``: what bronze and silver hold (layer →
    (commit LSN, commit time)), recorded in ``lakecdc_layer_progress`` with gold's and the
    dashboard's. ``take_over``: the dashboard holds another pipeline's counts, which this
    push replaces (``claim``); with the ``sole_dashboard`` guard off it pushes beside them:
    negative controls only."""
    with connect(dashboard_dsn, what="dashboard") as conn:
        return push_gold(conn, gold_path, storage_options, version=version, switches=switches,
                     full=full, marks=marks, take_over=take_over, engine=engine)


def push_gold(conn: psycopg.Connection, gold_path: str, storage_options: dict | None, *,
              version: int | None = None, switches: Switches = NONE, full: bool = False,
              marks: dict | None = None, take_over: bool = False, engine=None) -> PushResult:
    """``push_once`` on an open connection (autocommit mode)."""
    started = time.monotonic()
    table = gold_view(gold_path, storage_options, version, engine)
    result = push_table(conn, table, gold_key(gold_path), switches, full, marks,
                        take_over=take_over)
    result = PushResult(**{**result.__dict__, "seconds": time.monotonic() - started})
    if result.pushed:
        log.info("pushed gold version %d (%s push): %d rows upserted, %d deleted, %.2fs",
                 result.gold_version, "full" if result.full else "incremental",
                 result.upserted, result.deleted, result.seconds)
    return result


def gold_position(uri: str, storage_options: dict | None = None, version: int | None = None,
                  history_limit: int = 200) -> tuple[int | None, datetime | None]:
    """Gold's watermark at ``version`` (the newest if None): the source commit (LSN, time) it
    includes (delta-rs)."""
    from core.engine.delta_rs import read_commits_rs

    return position_of(read_commits_rs(uri, storage_options, limit=history_limit,
                                       up_to=version))


def push_table(conn: psycopg.Connection, table: GoldView, key: str,
               switches: Switches = NONE, force_full: bool = False, marks: dict | None = None,
               *, take_over: bool = False) -> PushResult:
    """Steps 1-4 of docs/gold.md, "The push", on an open connection (autocommit mode), of
    gold at one version (``gold.view``: delta-rs or Spark); the layer
    marks are recorded in the same transaction. ``switches``: the fault points, and the
    guards ``ahead_fence`` (off: step 2b skipped) and ``sole_dashboard`` (off: no
    ``claim``), off in negative controls only. ``take_over``: ``claim``."""
    version, table_id = table.version, table.table_id
    with conn.transaction():
        _lock_progress(conn)
        if switches.on("sole_dashboard"):
            claim(conn, key, take_over)
        conn.execute(sql.SQL("INSERT INTO {} (gold_table, gold_version) VALUES (%s, -1) "
                             "ON CONFLICT DO NOTHING").format(sql.Identifier(PROGRESS_TABLE)),
                     [key])
        prev_version, prev_id, prev_lsn = conn.execute(
            sql.SQL("SELECT gold_version, gold_table_id, source_commit_lsn FROM {} "
                    "WHERE gold_table = %s FOR UPDATE").format(sql.Identifier(PROGRESS_TABLE)),
            [key]).fetchone()
        same_table = prev_id == table_id and prev_version >= 0
        if same_table and prev_version >= version:
            _record_layers(conn, key, marks or {})
            return PushResult(version, prev_version, pushed=False)
        lsn, ts = table.position()
        if (switches.on("ahead_fence") and same_table and not force_full
                and behind(lsn, prev_lsn)):
            # Step 2b: the dashboard is at or ahead of V already (ahead pushes). V is
            # recorded only where the dashboard is exactly at V's watermark, so that the
            # recorded version stays one the dashboard equalled: the next write reads the
            # feed from it and refreshes every key a step wrote since its watermark (3b).
            # Recorded while the dashboard is past it, a step over V's watermark that
            # took a key there and back (net 0: not written) would hide the key's change
            # at V from both (found 2026-11-30: the F13b kill test, 3 runs in 15).
            if lsn == prev_lsn:
                conn.execute(sql.SQL("UPDATE {} SET gold_version = %s WHERE gold_table = %s")
                             .format(sql.Identifier(PROGRESS_TABLE)), [version, key])
            _record_layers(conn, key, {**(marks or {}), "gold": (lsn, ts)})
            return PushResult(version, prev_version, pushed=False, source_commit_lsn=prev_lsn)
        rows, deleted, full = None, [], force_full or not same_table
        if not full:
            try:
                rows, deleted = table.changes(prev_version + 1, version)
            except FeedUnreadable as exc:
                # Not in the log any more, or its files vacuumed (a dashboard behind gold by
                # more than the retention, docs/operations.md): every row is as exact.
                log.warning("gold's change data feed from version %d is not readable (%s); "
                            "pushing every row", prev_version + 1, exc)
                full = True
            else:
                rows, deleted = _with_keys_moved_ahead(conn, table, prev_version, prev_lsn,
                                                       rows, deleted)
        if full:
            rows = table.rows()
        if lsn is None:       # no watermark recorded (old gold): the newest change pushed
            lsn = max([r[5] for r in rows if r[5] is not None] + [prev_lsn or 0]) or None
        _stage(conn, rows, deleted)
        switches.hit("after_push_stage")
        upserted, removed = _apply(conn, full, lsn, ts)
        conn.execute(sql.SQL(
            "UPDATE {} SET gold_version = %s, gold_table_id = %s, "
            "source_commit_lsn = %s::bigint, source_commit_ts = %s::timestamptz, "
            "pushed_at = now() WHERE gold_table = %s").format(sql.Identifier(PROGRESS_TABLE)),
            [version, table_id, lsn, ts, key])
        if full:      # a new gold (a rebuild, another source): its marks start afresh
            conn.execute(sql.SQL("DELETE FROM {} WHERE gold_table = %s").format(
                sql.Identifier(LAYER_TABLE)), [key])
        _record_layers(conn, key, {**(marks or {}), "gold": (lsn, ts), "dashboard": (lsn, ts)})
    switches.hit("after_push_commit")
    return PushResult(version, prev_version if same_table else None, pushed=True, full=full,
                      upserted=upserted, deleted=removed, source_commit_lsn=lsn)


def _with_keys_moved_ahead(conn: psycopg.Connection, table: GoldView, prev_version: int,
                           prev_lsn: int | None, rows: list[tuple], deleted: list[tuple]
                           ) -> tuple[list[tuple], list[tuple]]:
    """Step 3's keys, with those steps ahead of gold (``push_ahead``) moved past gold's
    recorded version. The feed from that version names the keys whose counts changed *net*
    up to ``table``'s version, but the dashboard, at ``prev_lsn`` past that version's
    watermark, may hold a key a step ahead changed and a later change took back (a row
    created, sent, then delivered: ``sending`` +1, then -1): the feed does not name it, and
    the dashboard would keep it changed. Every key a step ahead wrote since that watermark
    (its rows' ``source_commit_lsn`` is past it) gets gold's count too, or is deleted where
    gold has no row. Only when the dashboard is past the recorded version's watermark: after
    an ahead push that came before gold, never on a dashboard only ``push_table`` writes."""
    floor, _ = table.position(prev_version)
    if prev_lsn is None or (floor is not None and prev_lsn <= floor):
        return rows, deleted
    if floor is None:        # not among the commits read (2b left it far back): every key
        floor = -1
    named = {tuple(r[:4]) for r in rows} | {tuple(k) for k in deleted}
    moved = {tuple(r) for r in conn.execute(sql.SQL(
        "SELECT {} FROM {} WHERE source_commit_lsn > %s").format(
        sql.SQL(", ").join(map(sql.Identifier, DIMS)), sql.Identifier(STATS_TABLE)),
        [floor])} - named
    if not moved:
        return rows, deleted
    found = [r for r in table.rows() if tuple(r[:4]) in moved]
    return rows + found, deleted + sorted(moved - {tuple(r[:4]) for r in found})


def behind(gold_lsn: int | None, dashboard_lsn: int | None) -> bool:
    """Whether gold at watermark ``gold_lsn`` is already in a dashboard at
    ``dashboard_lsn`` (step 2b)."""
    return gold_lsn is not None and dashboard_lsn is not None and gold_lsn <= dashboard_lsn


def push_ahead(conn: psycopg.Connection, key: str, table_id: str, step,
               marks: dict | None = None, switches: Switches = NONE) -> bool:
    """Add a step of gold (``gold.apply.Planned``) to the dashboard before gold's MERGE
    commits it (docs/gold.md, "Ahead of gold"). ``step`` is the step, or a function of the
    dashboard's watermark (None: it holds no counts of this gold table) that returns one or
    None (``gold.ahead``: the step from there). Returns whether it was added: False when the
    dashboard is not at the step's starting watermark of this gold table (behind, being
    caught up by ``push_table``; or already past it: a replay). With the ``ahead_fence``
    guard off (``switches``) it adds it anyway: negative controls only."""
    with conn.transaction():
        _lock_progress(conn)
        row = conn.execute(sql.SQL(
            "SELECT gold_version, gold_table_id, source_commit_lsn FROM {} "
            "WHERE gold_table = %s FOR UPDATE").format(sql.Identifier(PROGRESS_TABLE)),
            [key]).fetchone()
        at = row[2] if row is not None and row[0] >= 0 and row[1] == table_id else None
        if callable(step):
            step = step(at)
        fence = switches.on("ahead_fence")
        if step is None or fence and (at is None or at != step.after_lsn):
            return False
        _upsert(conn, step.commit_lsn, step.commit_ts, deltas=step.key_deltas)
        conn.execute(sql.SQL(
            "UPDATE {} SET source_commit_lsn = %s::bigint, source_commit_ts = %s::timestamptz, "
            "pushed_at = now() WHERE gold_table = %s").format(sql.Identifier(PROGRESS_TABLE)),
            [step.commit_lsn, step.commit_ts, key])
        _record_layers(conn, key, {**(marks or {}),
                                   "dashboard": (step.commit_lsn, step.commit_ts)})
    return True


def _lock_progress(conn: psycopg.Connection) -> None:
    """Pushes, ahead pushes and take-overs of every pipeline on this dashboard one at a
    time: ``claim`` must see every other pipeline's row, committed or about to be, and a
    push and an ahead push of one pipeline must not each hold a lock the other waits for.
    Readers (dashboards, ``verify``) are not blocked."""
    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(
        sql.Identifier(PROGRESS_TABLE)))


def claim(conn: psycopg.Connection, key: str, take_over: bool) -> None:
    """One dashboard, one pipeline: ``service_stats`` holds one gold's counts, and a
    second pipeline's push would overwrite the first's keys and, on its first (full) push,
    delete the rest. So a push of gold ``key`` is refused, with one sentence, while
    ``lakecdc_push_progress`` records another gold that has been pushed. With
    ``take_over`` every progress row is deleted instead, so the push that follows is a full
    one, replacing their counts. Inside the push's transaction, after ``_lock_progress``."""
    others = [row[0] for row in conn.execute(sql.SQL(
        "SELECT gold_table FROM {} WHERE gold_table <> %s AND gold_version >= 0 "
        "ORDER BY gold_table").format(sql.Identifier(PROGRESS_TABLE)), [key])]
    if not others:
        return
    if not take_over:
        raise UserError(f"this dashboard already holds the counts of another pipeline (gold "
                        f"{others[0]}), which this one would overwrite: give this pipeline a "
                        "dashboard database of its own (LAKECDC_DASHBOARD_DSN), or, if that "
                        "pipeline is retired, replace its counts with this one's by `lakecdc "
                        "push --once --take-over`.")
    for table in (PROGRESS_TABLE, LAYER_TABLE):
        conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
    log.warning("taking the dashboard over from %s: a full push replaces its counts",
                ", ".join(others))


def _record_layers(conn: psycopg.Connection, key: str, marks: dict,
                   layers: tuple[str, ...] = LAYERS) -> None:
    """Upsert what each of ``layers`` holds everything up to; between full pushes a mark
    never moves backwards."""
    rows = [(key, layer, *marks[layer]) for layer in layers
            if layer in marks and marks[layer][0] is not None]
    if not rows:
        return
    with conn.cursor() as cur:
        cur.executemany(sql.SQL(
            "INSERT INTO {t} AS t (gold_table, layer, source_commit_lsn, source_commit_ts, "
            "updated_at) VALUES (%s, %s, %s::bigint, %s::timestamptz, now()) "
            "ON CONFLICT (gold_table, layer) DO UPDATE SET "
            "source_commit_lsn = EXCLUDED.source_commit_lsn, "
            "source_commit_ts = EXCLUDED.source_commit_ts, updated_at = EXCLUDED.updated_at "
            "WHERE t.source_commit_lsn IS NULL OR t.source_commit_lsn <= EXCLUDED.source_commit_lsn"
        ).format(t=sql.Identifier(LAYER_TABLE)), rows)


def record_layer(conn: psycopg.Connection, key: str, layer: str, lsn: int, at) -> None:
    """Upsert one layer's mark (a writer beside the push: the mirrors' query)."""
    _record_layers(conn, key, {layer: (lsn, at)}, (layer,))


def read_layer(dsn: str, key: str, layer: str) -> tuple[int, datetime] | None:
    """(commit LSN, commit time) ``layer`` of gold table ``key`` holds everything up to, or
    None: no row yet, or the dashboard cannot be read (a listing shows "-", never fails)."""
    try:
        with connect(dsn, what="dashboard") as conn:
            row = conn.execute(sql.SQL(
                "SELECT source_commit_lsn, source_commit_ts FROM {} WHERE gold_table = %s "
                "AND layer = %s").format(sql.Identifier(LAYER_TABLE)), [key, layer]).fetchone()
    except Exception as exc:
        log.info("%s's progress could not be read from the dashboard: %s", layer, exc)
        return None
    return None if row is None or row[0] is None else (row[0], row[1])


def _stage(conn: psycopg.Connection, rows: list[tuple], deleted: list[tuple]) -> None:
    stage = sql.Identifier(_STAGE)
    conn.execute(sql.SQL(
        "CREATE TEMP TABLE {} (service_id text NOT NULL, template_id text NOT NULL, "
        "notification_type text NOT NULL, notification_status text NOT NULL, "
        "count bigint, deleted boolean NOT NULL) ON COMMIT DROP").format(stage))
    columns = sql.SQL(", ").join(map(sql.Identifier, (*DIMS, "count", "deleted")))
    with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, columns)) as copy:
        for r in rows:
            copy.write_row((*r[:4], r[4], False))
        for key in deleted:
            copy.write_row((*key, None, True))


def _apply(conn: psycopg.Connection, full: bool, lsn: int | None,
           ts: datetime | None) -> tuple[int, int]:
    stats, stage = sql.Identifier(STATS_TABLE), sql.Identifier(_STAGE)
    same_key = sql.SQL(" AND ").join(
        sql.SQL("t.{c} = s.{c}").format(c=sql.Identifier(c)) for c in DIMS)
    upserted = _upsert(conn, lsn, ts)
    if full:
        # A full push replaces the table: keys gold no longer has go too.
        removed = conn.execute(sql.SQL(
            "DELETE FROM {stats} t WHERE NOT EXISTS "
            "(SELECT 1 FROM {stage} s WHERE NOT s.deleted AND {same})"
        ).format(stats=stats, stage=stage, same=same_key)).rowcount
    else:
        removed = conn.execute(sql.SQL(
            "DELETE FROM {stats} t USING {stage} s WHERE s.deleted AND {same}"
        ).format(stats=stats, stage=stage, same=same_key)).rowcount
    return upserted, removed


def _upsert(conn: psycopg.Connection, lsn: int | None, ts: datetime | None,
            deltas: pa.Table | None = None) -> int:
    """Rows into ``service_stats`` at watermark ``lsn``: the staged rows not marked deleted,
    whose counts replace the dashboard's (absolute, ``push_table``); or a step's key
    ``deltas`` (``gold.plan``'s ``KEY_DELTA_COLUMNS``), added to them (``push_ahead``: one
    statement, the deltas passed as arrays). Returns the rows written."""
    dims = sql.SQL(", ").join(map(sql.Identifier, DIMS))
    if deltas is None:
        source, rows = sql.SQL("SELECT {dims}, count FROM {stage} WHERE NOT deleted").format(
            dims=dims, stage=sql.Identifier(_STAGE)), []
    else:
        source = sql.SQL("SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], "
                         "%s::text[], %s::bigint[])")
        rows = [deltas.column(c).to_pylist() for c in (*DIMS, "delta")]
    count = sql.SQL("EXCLUDED.count" if deltas is None else "t.count + EXCLUDED.count")
    return conn.execute(sql.SQL(
        "INSERT INTO {stats} AS t ({dims}, count, source_commit_lsn, source_commit_ts, "
        "pushed_at) SELECT s.*, %s::bigint, %s::timestamptz, now() FROM ({source}) s "
        "ON CONFLICT ({dims}) DO UPDATE SET count = {count}, "
        "source_commit_lsn = EXCLUDED.source_commit_lsn, "
        "source_commit_ts = EXCLUDED.source_commit_ts, pushed_at = EXCLUDED.pushed_at"
    ).format(stats=sql.Identifier(STATS_TABLE), dims=dims, source=source, count=count),
        [lsn, ts, *rows]).rowcount
