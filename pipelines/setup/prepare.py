"""``lakecdc setup``: prepare the source, the slot and the lakehouse. Idempotent.

Steps, each skipped when already done:
1. check the source (``wal_level``, REPLICATION, captured tables);
2. replica identity covering the dims on every captured table;
3. the logical slot, created with an exported snapshot; the rows existing at its consistent
   point counted inside that snapshot (the baseline gold is seeded with, so counts are exact
   from the first run on a populated database: the snapshot is held for that ``GROUP BY``
   alone); the bronze table recording the consistent point as where shipping starts; then
   each mirrored table's rows loaded into its mirror by key-range chunks, each in a short
   snapshot of its own (``pipelines.setup.mirror_loader``), the changes from the consistent
   point on applied over them by the mirrors' query;
4. the dashboard tables (``service_stats`` and the push progress table);
5. with ``LAKECDC_CATALOG`` and ``LAKECDC_SCHEMA`` set, every lakehouse table registered by
   name (``pipelines.setup.register``; its names are checked first, before step 1 changes
   anything). Only then does setup start Spark.

With ``LAKECDC_WRITER=spark`` Spark starts first, and every lakehouse read and write goes
through it (``core.engine.spark_delta``): the storage check, the captured set, bronze
(``bronze.spark_table``), gold's baseline and the mirrors' loads.

A slot without bronze, or bronze without its slot, is never papered over: both mean changes
may have been missed, and only ``--rebaseline`` (an explicit decision) starts again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from bronze import slot as slots
from bronze.capture_list import CAPTURED, REMOVED, SNAPSHOTTING, CaptureList
from bronze.failover import NEW_LAKEHOUSE
from bronze.not_null import make_not_null
from bronze.source import (
    check_plugin,
    check_source,
    ensure_replica_identity,
    identity_blocker,
    mirror_key,
    nullable_identity_columns,
)
from bronze.spark_table import bronze_table
from bronze.table import (
    NUMBERS_SUFFIX,
    REBASELINE_SUFFIX,
    Progress,
    SourceIdentity,
    numbers_as_text,
)
from core.config import Config
from core.engine.api import Engine
from core.errors import UserError, first_line
from core.layout import mirror_path
from core.lsn import fmt
from core.postgres import connect
from core.storage import Lakehouse
from core.switches import Switches
from gold.push import ensure_dashboard_tables
from pipelines.setup.capture import captured_tables
from pipelines.source.baseline import count_in_snapshot, write_baseline
from pipelines.source.mirror_specs import specials_note, table_specs


def _dashboard_tables(dsn: str) -> None:
    with connect(dsn, what="dashboard") as conn:
        try:
            ensure_dashboard_tables(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise UserError(f"the dashboard role cannot create service_stats "
                            f"({first_line(exc)}); create the tables from "
                            "infra/postgres/dashboard_schema.sql as their owner, or grant "
                            "CREATE on the schema.") from None


@dataclass
class SetupReport:
    actions: list[str] = field(default_factory=list)

    def did(self, text: str) -> None:
        self.actions.append(text)

    def noting(self, notes: list[str]) -> "SetupReport":
        """The report, with ``notes`` (what setup found, not did; blanks skipped) at its end."""
        self.actions.extend(n for n in notes if n)
        return self


def setup(config: Config, rebaseline: bool = False,
          storage_options: dict | None = None, online_not_null: bool = False,
          echo=None, spark_factory=None) -> SetupReport:
    """``online_not_null``: first make nullable identity columns NOT NULL without blocking
    writers (``bronze.not_null``); ``echo`` receives each statement it runs.
    ``spark_factory``: the session that registers the tables by name, called only when
    ``config.registers`` (a session whose catalog keeps names: ``core.catalog_names``), and that
    every write goes through with ``LAKECDC_WRITER=spark`` (None: ``core.spark``'s)."""
    from core.engine.choose import start_engine
    from pipelines.setup.register import names_session

    engine = start_engine(config, spark_factory)
    spark = names_session(config, spark_factory,
                          _mirrored(config, storage_options, engine) if config.registers
                          else (), "setup")
    report = _prepare(config, rebaseline, storage_options, online_not_null, echo, engine,
                      spark_factory)
    if spark is not None:
        from pipelines.setup.register import register_lakehouse

        for line in register_lakehouse(spark, config, _mirrored(config, storage_options,
                                                                engine)):
            report.did(line)
    return report


def _mirrored(config: Config, storage_options: dict | None,
              engine: Engine) -> tuple[str, ...]:
    """The captured tables (the stored set once there is one) that are mirrored."""
    return tuple(t for t in captured_tables(config, storage_options, engine=engine)
                 if config.mirrors is None or t in config.mirrors)


def _prepare(config: Config, rebaseline: bool, storage_options: dict | None,
             online_not_null: bool, echo, engine: Engine, spark_factory=None) -> SetupReport:
    """Steps 1-3 of the module docstring, every lakehouse read and write through ``engine``
    (``spark_factory``: the session that types what Arrow does not, as mirrors load)."""
    report = SetupReport()
    dsn = config.require_source()
    engine.check_writable(config.lakehouse, Lakehouse.from_config(config))
    bronze = bronze_table(config, storage_options, engine=engine)
    keyed, specs = _prepare_source(config, dsn, online_not_null, echo, report)
    _dashboard_tables(config.dashboard)
    with connect(dsn) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]
        state = slots.slot_state(conn, config.slot)
        has_bronze = bronze.exists()
        if state is not None and has_bronze and not rebaseline:
            return _already_set_up(config, dsn, bronze, specs, storage_options, engine, report)
        if not rebaseline:
            _refuse_half_set_up(config, state is not None, has_bronze)
        if state is not None:
            slots.drop_slot(conn, config.slot)
            report.did(f"dropped slot {config.slot}")
    system_id, timeline = slots.identify_system(dsn)
    created, counts = _create_slot(config, dsn, report)
    ident = SourceIdentity(config.slot, db, system_id, timeline)
    try:
        text = _numbers_as_text(dsn, config.slot, bronze)
        recorded = {config.slot + NUMBERS_SUFFIX: int(text)}
        write_baseline(config.baseline_path, counts, created.consistent_point, storage_options,
                       engine=engine)
        report.did(f"counted {sum(counts.column('count').to_pylist()):,} existing "
                   f"notifications in {counts.num_rows:,} keys as the baseline at "
                   f"{fmt(created.consistent_point)}")
        if _store_captured_set(config, storage_options, engine, keyed):
            report.did(f"stored the captured set ({', '.join(config.tables)})")
        if not has_bronze:
            bronze.create(ident, created.consistent_point, recorded)
            report.did(f"created bronze table {config.bronze_path}")
        else:
            _rebaseline(bronze, config.slot, created.consistent_point, ident, report, recorded)
    except BaseException:
        # Leave no slot without bronze behind: it would pin WAL and block the next setup.
        with connect(dsn) as conn:
            slots.drop_slot(conn, config.slot)
        raise
    _load_mirrors(config, keyed, created.consistent_point, storage_options, engine, report,
                  text, spark_factory)
    return report.noting([specials_note(spec, text) for spec in specs])


def _prepare_source(config: Config, dsn: str, online_not_null: bool, echo,
                    report: SetupReport) -> tuple[tuple[str, ...], list]:
    """Steps 1 and 2 of the module docstring; returns the tables a mirror can be kept of and
    the captured tables' specs (``pipelines.source.mirror_specs``)."""
    with connect(dsn) as conn:
        check_source(conn, config.tables)
        check_plugin(conn)
        counted = config.counted.names      # the others are only checked, never changed
        if online_not_null:
            for table in counted:
                columns = nullable_identity_columns(conn, table)
                if columns:
                    make_not_null(conn, table, columns, echo=echo)
                    report.did(f"made {', '.join(columns)} of {table} NOT NULL online")
        # Every table is checked before any is changed: one refusal leaves all as they were.
        for table in config.tables:
            blocker = identity_blocker(conn, table, table in counted)
            if blocker:
                raise UserError(blocker)
        for table in counted:
            if ensure_replica_identity(conn, table):
                report.did(f"set REPLICA IDENTITY USING INDEX on {table}")
        # The tables a mirror can be kept of (docs/silver.md, "Mirrors").
        keyed = tuple(t for t in config.mirrored if mirror_key(conn, t)[1])
        specs = table_specs(conn, config.tables)
    return keyed, specs


def _already_set_up(config: Config, dsn: str, bronze, specs: list,
                    storage_options: dict | None, engine: Engine,
                    report: SetupReport) -> SetupReport:
    """The report of a setup run again on a slot and bronze already set up (the captured
    set stored if it was not), with what setup found."""
    if _store_captured_set(config, storage_options, engine):     # set up before it was kept
        report.did(f"stored the captured set ({', '.join(config.tables)})")
    else:
        report.did(f"slot {config.slot} and bronze already set up (nothing changed)")
    stored = CaptureList(config.lakehouse, storage_options, engine=engine).read()
    unloaded = [t for t, (s, _) in stored.states.items() if s == SNAPSHOTTING]
    text = _numbers_as_text(dsn, config.slot, bronze)
    return report.noting([specials_note(spec, text) for spec in specs] + [
        f"{t} is still being loaded into its mirror: run `lakecdc tables add {t}` "
        "while `lakecdc run` runs, and it goes on where it stopped" for t in unloaded])


def _refuse_half_set_up(config: Config, has_slot: bool, has_bronze: bool) -> None:
    """Refuse a slot without bronze, or bronze without its slot: changes may have been
    missed, and only ``--rebaseline`` starts again."""
    if has_slot:
        raise UserError(f"replication slot {config.slot} exists but there is no bronze "
                        f"table at {config.bronze_path}; if the lakehouse was lost, "
                        "start again with `lakecdc setup --rebaseline`.")
    if has_bronze:
        raise UserError(f"bronze at {config.bronze_path} exists but slot "
                        f"{config.slot} does not; changes since bronze's last commit "
                        "may be lost: re-baseline with `lakecdc setup --rebaseline`.")


def _create_slot(config: Config, dsn: str, report: SetupReport):
    """The slot, created with an exported snapshot, and the counted tables' rows counted in
    that snapshot (the baseline); the slot is dropped again if counting fails."""
    with slots.replication_connection(dsn) as rconn:
        created = slots.create_slot(rconn, config.slot)
        report.did(f"created slot {config.slot} at {fmt(created.consistent_point)}")
        try:
            # The exported snapshot is importable while rconn stays open and idle.
            counts = count_in_snapshot(dsn, created.snapshot_name, config.counted)
        except BaseException:
            with connect(dsn) as conn:
                slots.drop_slot(conn, config.slot)
            raise
    return created, counts


def _numbers_as_text(dsn: str, slot: str, bronze) -> bool:
    """How the slot's wal2json prints numbers: asked of the slot, or, while another session
    holds it (a running shipper), as bronze last recorded it."""
    with connect(dsn) as conn:
        text = slots.prints_numbers_as_text(conn, slot)
    return numbers_as_text(bronze, slot) if text is None else text


def _load_mirrors(config: Config, keyed: tuple[str, ...], floor: int,
                  storage_options: dict | None, engine: Engine, report: SetupReport,
                  numbers_as_text: bool, spark_factory=None) -> None:
    """Each mirrored table's current rows into its mirror, by key-range chunks after the
    slot exists (``pipelines.setup.mirror_loader``): the slot's snapshot is held only for
    the counts. Every change from the consistent point ``floor`` on reaches bronze, and
    the mirrors' query applies them onto the loaded rows. The tables are ``snapshotting``
    in the captured set meanwhile; a kill leaves them so, and ``tables add`` goes on."""
    from pipelines.setup.mirror_loader import MirrorTarget, load_mirror, typing_session

    store = CaptureList(config.lakehouse, storage_options, engine=engine)
    stored = store.read()
    states = {t: s for t, (s, _) in stored.states.items()}
    loading = tuple(t for t in keyed if states.get(t) not in (None, REMOVED))
    if not loading:
        return
    if any(states[t] != SNAPSHOTTING for t in loading):
        stored = store.write({**states, **dict.fromkeys(loading, SNAPSHOTTING)}, stored)
    with connect(config.require_source(), what="source") as conn:
        specs = table_specs(conn, loading)
    switches = Switches.from_config(config)
    for spec in specs:
        target = MirrorTarget(mirror_path(config.lakehouse, spec.name), spec, engine=engine,
                              log_retention_minutes=config.kept_minutes("mirrors"))
        done = load_mirror(config.require_source(), target,
                           int(stored.since(spec.name).timestamp() * 1e6), floor,
                           switches=switches,
                           session=lambda: typing_session(config,
                                                          spark_factory=spark_factory),
                           numbers_as_text=numbers_as_text)
        states[spec.name] = CAPTURED
        stored = store.write(states, stored)
        report.did(f"loaded the {done.rows:,} rows of {spec.name} into its mirror in "
                   f"{done.seconds:.1f}s ({done.chunks:,} chunks, each read in a snapshot "
                   "of its own)")


def _rebaseline(bronze, slot: str, start: int, ident: SourceIdentity,
                report: SetupReport, recorded: dict[str, int]) -> None:
    """Restart bronze's position at a new slot's consistent point."""
    progress = bronze.progress(slot) or Progress(0, 0)
    if start <= progress.end_lsn:
        raise UserError(f"the new slot starts at {fmt(start)}, before what bronze holds "
                        f"({fmt(progress.end_lsn)}): the source was restored to an earlier "
                        f"point; {NEW_LAKEHOUSE}")
    bronze.record_progress(slot, Progress(progress.commit_lsn, start),
                           {"lakecdc.operation": "rebaseline",
                            "lakecdc.systemIdentifier": ident.system_identifier,
                            "lakecdc.timeline": ident.timeline},
                           app_versions={slot + REBASELINE_SUFFIX: start, **recorded})
    bronze.set_source(ident.system_identifier, ident.timeline)
    report.did(f"re-baselined bronze at {fmt(start)}; changes between "
               f"{fmt(progress.end_lsn)} and {fmt(start)} were not captured, so gold stays "
               "stopped until you run `lakecdc backfill rebuild-gold`")


def _store_captured_set(config: Config, storage_options: dict | None, engine: Engine,
                        loading: tuple[str, ...] = ()) -> bool:
    """Store ``LAKECDC_TABLES`` as the captured set (``bronze.capture_list``) unless a set
    is stored; from then on ``lakecdc tables add/remove`` change it. ``loading``: the
    tables stored as ``snapshotting`` (their mirrors are loaded next). Returns whether it
    stored one."""
    store = CaptureList(config.lakehouse, storage_options, engine=engine)
    if store.exists():
        return False
    store.write({t: SNAPSHOTTING if t in loading else CAPTURED for t in config.tables}, None)
    return True
