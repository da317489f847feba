"""The one configuration object, built at the entry point from flags and ``LAKECDC_*``.

Flags override environment variables; environment variables override defaults. Nothing else
in lakecdc reads the environment: every component receives the values it needs from here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from core import layout
from core.captured import CountedTables
from core.errors import UserError
from core.layout import BRONZE, GOLD_BASELINE, Table

DEFAULT_NOTIFICATIONS = "public.notifications"
DEFAULT_HISTORY = "public.notification_history"
DEFAULT_TABLES = (DEFAULT_NOTIFICATIONS, DEFAULT_HISTORY)
MIRROR_INTERVAL_S = 1.0
MIRROR_MERGE_S = 1.0
MAINTAIN_INTERVAL_S = 300.0
RETENTION_HOURS = 24
LOG_RETENTION_MINUTES = 10
# Bronze's log is kept shorter. Only lakecdc's own stream reads bronze's history (everything
# else reads its newest snapshot), and maintenance keeps bronze's log from where that stream
# would restart, however far behind it is. Spark's stream lists bronze's log at every
# trigger, and on a local disk a listing reads the whole folder: ten minutes of entries at
# 3-4 commits a second took a trigger about twice as long to read as a thousand
# (bench/aged.py).
BRONZE_LOG_RETENTION_MINUTES = 2
# The tables people and tools other than lakecdc read (docs/operations.md, "What each table
# keeps"), by group: ``silver`` (silver/changes, silver/quarantine), ``gold``
# (gold/service_stats) and ``mirrors`` (each mirror). Each keeps its log and the files it
# removed this many minutes, so a user's stream stopped overnight resumes, time travel reaches
# back a working day, and a plain VACUUM (Databricks') deletes nothing a day's query reads.
# Not Delta's 30 days of log: at 2-3 commits a second that is 5-8 million log entries, and
# every listing of the log reads them all on stores that list no offset. LAKECDC_READER_RETENTION.
READER_GROUPS = ("silver", "gold", "mirrors")
READER_RETENTION_MINUTES = 24 * 60
_DURATION = re.compile(r"(\d+)\s*([mhd]?)")
_MINUTES = {"m": 1, "h": 60, "": 60, "d": 24 * 60}
# Between two maintenances each writer cleans its tables' expired log this often, so a log
# holds its retention and at most this much more (not up to MAINTAIN_INTERVAL_S more).
LOG_CLEAN_INTERVAL_S = 30.0
# The most of the gold writer's time its folds may take (gold/fold.py): a fold MERGEs what
# waits in gold/_deltas into service_stats and rewrites gold, so its cost follows gold's
# size; the next fold waits (1 - share) / share times as long as the last took. Under
# 2,000 changes/s (docs/benchmarks.md, section 3) a 10,000-key gold folded every batch or
# second batch, a 1,000,000-key gold every several seconds; the dashboard never waits for
# a fold (gold.push.push_ahead).
GOLD_FOLD_SHARE = 0.1
# How often the continuous stream starts a micro-batch (pipelines/run/stream.py says why 2 s):
# silver, gold and the mirrors trail the dashboard by about this much more.
STREAM_TRIGGER_S = 2.0
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
# The masters lakecdc is tested on: one machine, or a standalone cluster (with standby
# masters: spark://a:7077,b:7077).
_SPARK_MASTER = re.compile(r"local(\[(\d+|\*)\])?|spark://[\w.-]+:\d+(,[\w.-]+:\d+)*")
# A table as LAKECDC_TABLES and `lakecdc tables add` take it: schema.table, plain names.
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*")
# A catalog or schema that lakecdc registers its tables in (LAKECDC_CATALOG, LAKECDC_SCHEMA):
# a plain identifier, which every catalog takes and which needs no quoting rules beyond the
# backquotes core.catalog_names puts around it anyway.
CATALOG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
# The engines that write the lakehouse (LAKECDC_WRITER).
WRITERS = ("delta-rs", "spark")

# Guards that tests may switch off on purpose to prove the checker catches the damage
# (negative controls). Never set this in production. The stages ask ``Switches.on(guard)``
# of the object they are handed (core/switches.py), which holds the fault points too.
# - version_check: bronze's recorded progress decides what is new (drop commit_lsn <= the
#   recorded version; complete an interrupted advance on start).
# - commit_before_advance: the slot moves only after the bronze commit.
# - silver_txn: silver's appends carry txnAppId/txnVersion (replays skipped).
# - gold_txn: gold's steps, folds and pending writes record their app transactions (replays
#   skipped).
# - gold_watermark: the stream's gold half leaves out rows at or below gold's watermark (a
#   shipper batch's step took them, gold/apply.py); off, they are counted again.
# - backfill_window: the shipper drops snapshot backfill rows changed inside their chunk's
#   watermark window (bronze/snapshot_backfill.py); off, silver can receive a stale read.
# - ahead_fence: a batch's step reaches the dashboard ahead of gold only from the watermark
#   it starts at, and a push of an older gold version never overwrites it (gold/push.py).
# - capture_ack: `tables add` reads a table's rows only once the shipper peeks with the set
#   that holds it (pipelines/setup/capture.py); off, a change between the two is lost.
# - sole_dashboard: a push refuses a dashboard that holds another pipeline's counts
#   (gold/push.py, claim); off, the second pipeline overwrites and deletes the first's.
GUARDS = frozenset({"version_check", "commit_before_advance", "silver_txn", "gold_txn",
                    "gold_watermark", "backfill_window", "ahead_fence", "capture_ack",
                    "sole_dashboard", "reader_floor", "mirror_txn", "mirror_replay"})


@dataclass(frozen=True)
class Config:
    source_dsn: str | None = None
    dashboard_dsn: str | None = None
    lakehouse: str = "./lakehouse"
    slot: str = "lakecdc"
    tables: tuple[str, ...] = DEFAULT_TABLES
    # The two counted tables (docs/gold.md): DELETE from the first is -1, from the second a
    # retention purge (0). Both must be among ``tables``.
    notifications_table: str = DEFAULT_NOTIFICATIONS
    history_table: str = DEFAULT_HISTORY
    # The captured tables kept as typed mirrors (docs/silver.md, "Mirrors"); None: all of
    # them. ``LAKECDC_MIRRORS``: ``all`` (the default), ``none``, or ``schema.table,...``.
    mirrors: tuple[str, ...] | None = None
    # Shipper tuning. Every peek and advance re-decodes from the slot's restart_lsn and every
    # batch is a commit: few large batches drain a backlog faster (memory does not grow with
    # them: bronze/ship.py). The source keeps a peek's output in a temporary file until it
    # is read: ~1 kB per change of the Notify-like tables.
    upto_nchanges: int = 200_000
    peek_timeout_s: int = 300
    # Peeks begin this often (a full one is followed at once). A change waits half of it on
    # average before it is peeked; each non-empty peek is one bronze commit
    # (docs/operations.md, "Poll interval and bronze's files").
    poll_interval_s: float = 0.1
    # Progress-only bronze commits (no rows: transactions of uncaptured tables passed over)
    # at most this often, unless a peek is full, a heartbeat was passed, or --once ends.
    progress_commit_interval_s: float = 60.0
    # WAL safety (bronze/heartbeat.py, docs/operations.md): a heartbeat transaction when the
    # slot has not moved for this long and the WAL is >= 1 MB ahead of it; 0 turns them off.
    heartbeat_interval_s: float = 30.0
    # A continuous mirrors' query (``lakecdc run`` / ``mirrors``) starts a batch at most this
    # often: each costs one MERGE per changed table, beside the gold path on the same cores
    # (docs/silver.md, "Mirrors": how fresh).
    mirror_interval_s: float = MIRROR_INTERVAL_S
    # A mirror whose MERGE takes longer than this many seconds (a big table: its
    # copy-on-write MERGE rewrites most of it) takes its batches into a tail, merged now and
    # then (``silver.mirrors.tail``; docs/silver.md, "Big mirrors"); 0: every mirror.
    mirror_merge_s: float = MIRROR_MERGE_S
    # Maintenance (pipelines.maintain, docs/operations.md "Running for months"): each writer
    # compacts and vacuums its tables between its batches at most this often. Under traffic
    # bronze and silver gather hundreds of small files in 5 minutes, and compacting them
    # pauses their writers for seconds once per interval.
    maintain_interval_s: float = MAINTAIN_INTERVAL_S
    # Files removed from a table (by compaction, a MERGE's rewrite) are deleted this many
    # hours later: readers inside that window (a notebook's time travel, a replay, verify's
    # as-of reads) find them; a stream further behind keeps them longer (core.maintenance).
    retention_hours: int = RETENTION_HOURS
    # lakecdc's own tables (gold's _pending and _deltas, the mirrors' tails and markers)
    # keep this many minutes of log, bronze at most BRONZE_LOG_RETENTION_MINUTES; a stream
    # behind keeps what it needs longer. Short, because each commit lists the log
    # (core.maintenance): at 2-4 commits a second, 10 minutes is 1,200-2,400 entries.
    log_retention_minutes: int = LOG_RETENTION_MINUTES
    # What the tables others read keep (READER_GROUPS above), in minutes, by group; the
    # internal ones keep ``log_retention_minutes``. A group's files removed are also kept
    # this long, whatever ``retention_hours`` says.
    reader_retention: tuple[tuple[str, int], ...] = tuple(
        (g, READER_RETENTION_MINUTES) for g in READER_GROUPS)
    # service_stats trails the dashboard by a few of its folds (GOLD_FOLD_SHARE above); 1
    # folds every batch's step with the batch (a small gold, or SQL users who want it
    # current), 0 only when a stream stops.
    gold_fold_share: float = GOLD_FOLD_SHARE
    # Seconds between the continuous stream's micro-batches (STREAM_TRIGGER_S above):
    # silver, gold (read by path or name) and the mirrors wait for the next one, the
    # dashboard does not; a shorter one costs more of the JVM's CPU.
    stream_trigger_s: float = STREAM_TRIGGER_S
    # Continuous shipping survives the source going away: reconnect with exponential
    # backoff from 0.5 s up to this many seconds between attempts.
    reconnect_max_backoff_s: float = 30.0
    memory_budget_mb: int = 64
    # Peek rows are converted and written in chunks of this size: each chunk is in memory a
    # few times over (rows, Arrow columns, the writer's queue), so small ones keep the peak
    # low at no cost in speed.
    chunk_mb: float = 2.0
    spill_dir: str | None = None
    # Where a Spark JVM this process starts writes its own output (Ivy's resolution report
    # on a first start, log4j's banner and lines), appended; a log line names it when the
    # JVM starts (core.spark). None: the terminal. LAKECDC_SPARK_LOG; the CLI's default is
    # one file per user in the temporary directory (``default_spark_log``).
    spark_log: str | None = None
    # The Spark master a session this process starts connects to (LAKECDC_SPARK_MASTER):
    # ``local[2]`` on one machine, ``spark://host:7077`` for a standalone cluster whose
    # executors run in JVMs of their own (docs/databricks.md, "A real cluster"). On
    # Databricks the runtime's session is used as it is, whatever this says.
    spark_master: str = "local[2]"
    # Where every table is registered by name, ``<catalog>.<schema>.<name>`` (core.catalog_names,
    # docs/databricks.md "Unity Catalog"): both set, or neither (paths only).
    catalog: str | None = None
    catalog_schema: str | None = None
    # S3 lakehouse (core.storage): a non-AWS endpoint (MinIO, moto) and the region.
    # Credentials are not configuration: each engine reads the standard AWS chain.
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    # Which engine writes and reads the lakehouse's tables (LAKECDC_WRITER): ``delta-rs``
    # on the driver, the fast path; or ``spark``, every read and write through Spark's Delta,
    # for workspaces where only Spark can reach storage (Unity Catalog external locations).
    # docs/databricks.md, "Which workspace you have".
    writer: str = "delta-rs"
    # Test hooks: fault points ("name:n,...") and guards switched off (negative controls),
    # handed to the stages as one object (``core.switches.Switches.from_config``).
    faults: str = ""
    disabled_guards: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **flags) -> "Config":
        """Build from ``env`` (default ``os.environ``) and flags (``None`` = not given)."""
        env = os.environ if env is None else env
        values: dict = {
            "source_dsn": env.get("LAKECDC_SOURCE_DSN"),
            "dashboard_dsn": env.get("LAKECDC_DASHBOARD_DSN"),
            "lakehouse": env.get("LAKECDC_LAKEHOUSE", cls.lakehouse),
            "slot": env.get("LAKECDC_SLOT", cls.slot),
            "faults": env.get("LAKECDC_FAULT", ""),
            "spark_log": env.get("LAKECDC_SPARK_LOG") or default_spark_log(),
            "spark_master": env.get("LAKECDC_SPARK_MASTER") or cls.spark_master,
            "catalog": env.get("LAKECDC_CATALOG", "").strip() or None,
            "catalog_schema": env.get("LAKECDC_SCHEMA", "").strip() or None,
            "s3_endpoint_url": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            "s3_region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
            "writer": env.get("LAKECDC_WRITER", "").strip() or cls.writer,
            "disabled_guards": frozenset(
                g for g in env.get("LAKECDC_UNSAFE_DISABLE_GUARDS", "").split(",") if g),
        }
        for name, key in (("LAKECDC_HEARTBEAT_INTERVAL", "heartbeat_interval_s"),
                          ("LAKECDC_RECONNECT_MAX_BACKOFF", "reconnect_max_backoff_s"),
                          ("LAKECDC_MIRROR_INTERVAL", "mirror_interval_s"),
                          ("LAKECDC_MIRROR_MERGE_S", "mirror_merge_s"),
                          ("LAKECDC_MAINTAIN_INTERVAL", "maintain_interval_s"),
                          ("LAKECDC_TRIGGER_INTERVAL", "stream_trigger_s")):
            if env.get(name):
                values[key] = _number(name, env[name])
        if env.get("LAKECDC_RETENTION_HOURS"):
            values["retention_hours"] = _whole("LAKECDC_RETENTION_HOURS",
                                               env["LAKECDC_RETENTION_HOURS"], "hours", 24)
        if env.get("LAKECDC_LOG_RETENTION_MINUTES"):
            values["log_retention_minutes"] = _whole(
                "LAKECDC_LOG_RETENTION_MINUTES", env["LAKECDC_LOG_RETENTION_MINUTES"],
                "minutes", 10)
        if env.get("LAKECDC_READER_RETENTION", "").strip():
            values["reader_retention"] = reader_retention(env["LAKECDC_READER_RETENTION"])
        if env.get("LAKECDC_GOLD_FOLD_SHARE"):
            values["gold_fold_share"] = _number("LAKECDC_GOLD_FOLD_SHARE",
                                                env["LAKECDC_GOLD_FOLD_SHARE"],
                                                "a number from 0 to 1", "0.1")
        if env.get("LAKECDC_TABLES"):
            values["tables"] = tuple(t.strip() for t in env["LAKECDC_TABLES"].split(","))
        mirrors = env.get("LAKECDC_MIRRORS", "").strip()
        if mirrors and mirrors != "all":
            values["mirrors"] = () if mirrors == "none" else \
                tuple(t.strip() for t in mirrors.split(","))
        for name, key in (("LAKECDC_NOTIFICATIONS_TABLE", "notifications_table"),
                          ("LAKECDC_HISTORY_TABLE", "history_table")):
            if env.get(name):
                values[key] = env[name].strip()
        values.update({k: v for k, v in flags.items() if v is not None})
        if "tables" not in values:            # by default the captured tables are the counted
            values["tables"] = (values.get("notifications_table", DEFAULT_NOTIFICATIONS),
                                values.get("history_table", DEFAULT_HISTORY))
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if not _SLOT_NAME.fullmatch(self.slot):
            raise UserError(f"slot name {self.slot!r} is invalid: use 1-63 lower-case letters, "
                            "digits or underscores (LAKECDC_SLOT or --slot).")
        for table in self.tables:
            if not TABLE_NAME.fullmatch(table):
                raise UserError(f"captured table {table!r} must be written schema.table "
                                "(LAKECDC_TABLES).")
        for table, env in ((self.notifications_table, "LAKECDC_NOTIFICATIONS_TABLE"),
                           (self.history_table, "LAKECDC_HISTORY_TABLE")):
            if not TABLE_NAME.fullmatch(table):
                raise UserError(f"counted table {table!r} must be written schema.table "
                                f"({env}).")
            if table not in self.tables:
                raise UserError(f"the counted table {table} ({env}) is not among the "
                                f"captured tables ({', '.join(self.tables)}): add it to "
                                "LAKECDC_TABLES, or set the variable to a captured table.")
        stray = [t for t in self.mirrors or () if t not in self.tables]
        if stray:
            raise UserError(f"mirrored table(s) {', '.join(stray)} (LAKECDC_MIRRORS) are not "
                            f"captured ({', '.join(self.tables)}): add them to LAKECDC_TABLES, "
                            "or mirror only captured tables (all, none, or schema.table,...).")
        if self.notifications_table == self.history_table:
            raise UserError("LAKECDC_NOTIFICATIONS_TABLE and LAKECDC_HISTORY_TABLE name the "
                            f"same table ({self.history_table}): they must differ.")
        unknown = self.disabled_guards - GUARDS
        if unknown:
            raise UserError(f"unknown guard(s) in LAKECDC_UNSAFE_DISABLE_GUARDS: "
                            f"{', '.join(sorted(unknown))}; known: {', '.join(sorted(GUARDS))}.")
        if not _SPARK_MASTER.fullmatch(self.spark_master):
            raise UserError(f"the Spark master {self.spark_master!r} (LAKECDC_SPARK_MASTER) is "
                            "not one lakecdc runs on: use local[N] or spark://host:port.")
        if self.writer not in WRITERS:
            raise UserError(f"LAKECDC_WRITER={self.writer!r} is not a writer lakecdc has: use "
                            "delta-rs (the default) or spark (where only Spark can reach "
                            "the lakehouse's storage).")
        if (self.catalog is None) != (self.catalog_schema is None):
            raise UserError("LAKECDC_CATALOG and LAKECDC_SCHEMA go together: set both to "
                            "register the tables by name (catalog.schema.table), or neither.")
        for name, env in ((self.catalog, "LAKECDC_CATALOG"),
                          (self.catalog_schema, "LAKECDC_SCHEMA")):
            if name is not None and not CATALOG_NAME.fullmatch(name):
                raise UserError(f"{env}={name!r} is not a name lakecdc registers tables "
                                "under: use letters, digits and underscores, not starting "
                                "with a digit.")
        if self.upto_nchanges < 1 or self.peek_timeout_s < 1 or self.chunk_mb <= 0:
            raise UserError("--max-changes, --peek-timeout and --chunk-mb must be positive.")
        if self.poll_interval_s < 0:
            raise UserError("--poll-interval must be a number of seconds >= 0 (0: each peek "
                            "begins as soon as the last one ends).")
        if self.heartbeat_interval_s < 0:
            raise UserError("the heartbeat interval (LAKECDC_HEARTBEAT_INTERVAL) must be a "
                            "number of seconds >= 0 (0 turns heartbeats off).")
        if self.mirror_interval_s <= 0:
            raise UserError("the mirrors' interval (LAKECDC_MIRROR_INTERVAL) must be a "
                            "positive number of seconds.")
        if self.mirror_merge_s < 0:
            raise UserError("the mirrors' MERGE time for a tail (LAKECDC_MIRROR_MERGE_S) must "
                            "be a number of seconds >= 0 (0 gives every mirror a tail).")
        if self.maintain_interval_s <= 0:
            raise UserError("the maintenance interval (LAKECDC_MAINTAIN_INTERVAL) must be a "
                            "positive number of seconds.")
        if self.log_retention_minutes < 1:
            raise UserError("the log retention (LAKECDC_LOG_RETENTION_MINUTES) must be a whole "
                            "number of minutes, 1 or more.")
        if self.retention_hours < 0:
            raise UserError("the retention (LAKECDC_RETENTION_HOURS) must be a whole number "
                            "of hours, 0 or more.")
        if not 0 <= self.gold_fold_share <= 1:
            raise UserError("gold's fold share (LAKECDC_GOLD_FOLD_SHARE) must be a number from "
                            "0 to 1, e.g. 0.1 (1: every batch; 0: only when a stream stops).")
        if self.stream_trigger_s <= 0:
            raise UserError("the stream's trigger interval (LAKECDC_TRIGGER_INTERVAL) must be a "
                            "positive number of seconds, e.g. 2.")
        if self.reconnect_max_backoff_s <= 0:
            raise UserError("the reconnect backoff (LAKECDC_RECONNECT_MAX_BACKOFF) must be a "
                            "positive number of seconds.")

    @property
    def mirrored(self) -> tuple[str, ...]:
        """The captured tables kept as typed mirrors."""
        return self.tables if self.mirrors is None else self.mirrors

    @property
    def spark_writes(self) -> bool:
        """Whether every table is read and written through Spark (LAKECDC_WRITER=spark)."""
        return self.writer == "spark"

    @property
    def registers(self) -> bool:
        """Whether every table is also registered by name (LAKECDC_CATALOG/SCHEMA)."""
        return self.catalog is not None

    @property
    def counted(self) -> CountedTables:
        """The counted tables, as gold's rules, the baseline and the truth take them."""
        return CountedTables.from_names(self.notifications_table, self.history_table)

    def require_source(self) -> str:
        if not self.source_dsn:
            raise UserError("no source database: set LAKECDC_SOURCE_DSN or pass --source-dsn "
                            "(for example postgresql://lakecdc@db:5432/notify).")
        return self.source_dsn

    @property
    def dashboard(self) -> str:
        return self.dashboard_dsn or self.require_source()

    def table_path(self, table: Table) -> str:
        """Where ``table`` (one of ``core.layout``'s) lives under this lakehouse."""
        return layout.path(self.lakehouse, table)

    @property
    def bronze_path(self) -> str:
        return self.table_path(BRONZE)

    @property
    def baseline_path(self) -> str:
        return self.table_path(GOLD_BASELINE)

    def kept_minutes(self, group: str) -> int:
        """How many minutes a reader group's tables keep their log and removed files."""
        return dict(self.reader_retention)[group]

    def with_(self, **changes) -> "Config":
        return replace(self, **changes)


def default_spark_log() -> str:
    """Spark's own output for a process that sets no ``LAKECDC_SPARK_LOG``: one file per
    user (a file another user created is not theirs to append to)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"lakecdc-spark-{os.getuid()}.log")


def reader_retention(text: str) -> tuple[tuple[str, int], ...]:
    """``LAKECDC_READER_RETENTION``: a duration for every reader group, then any group's
    own: ``24h``, ``7d,mirrors=2h``, ``silver=90m`` (``m``, ``h`` or ``d``; a bare number is
    hours). In minutes, by group, in ``READER_GROUPS``' order."""
    kept = dict.fromkeys(READER_GROUPS, READER_RETENTION_MINUTES)
    for part in (p.strip() for p in text.split(",")):
        group, _, duration = part.rpartition("=")
        group = group.strip()
        match = _DURATION.fullmatch(duration.strip())
        if (group and group not in kept) or not match or int(match[1]) < 1:
            raise UserError(
                f"LAKECDC_READER_RETENTION={text!r} is not a retention lakecdc takes: write a "
                "duration of 1 or more for every group, then any group's own, e.g. "
                f"'24h' or '7d,mirrors=2h' (units m, h, d; groups {', '.join(READER_GROUPS)}).")
        minutes = int(match[1]) * _MINUTES[match[2]]
        kept.update({group: minutes} if group else dict.fromkeys(kept, minutes))
    return tuple(kept.items())


def _whole(name: str, text: str, unit: str, example: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a whole number of {unit}; "
                        f"write e.g. {example}.") from None


def _number(name: str, text: str, what: str = "a number of seconds",
            example: str = "30") -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not {what}; use e.g. {name}={example}."
                        ) from None
