"""The gold micro-batch: complete source transactions only, one idempotent step per batch.

Tables (all Delta, all written only here):

- ``gold/service_stats``: dims, ``count``, ``last_commit_lsn`` (newest source commit that
  changed the key), ``updated_at``. Change data feed on (the push reads it); rows whose count
  reaches 0 stay, so the dashboard learns about them. Every MERGE carries in its commit
  info (``userMetadata``) the batch id and the *watermark*: the newest source commit gold
  now includes (``commit_lsn``, ``commit_ts``).
- ``gold/_deltas``: the steps (key deltas) of batches not folded into ``service_stats``
  yet (``gold.fold``: a large gold is MERGEd every several seconds, not every batch).
- ``gold/_pending``: aggregated contributions (``gold.deltas.CONTRIBUTIONS``) of source
  transactions not applied yet: those silver has delivered only part of, and every
  transaction after the first such one (so gold always holds a prefix of the commit order
  and its watermark means "exact as of this LSN").

Batch ``b`` takes the six steps of docs/gold.md, "Exactly once: order of writes and
replay": (1) return if ``_pending`` records ``b`` (its app transaction); (2) read ``_pending`` at a
pinned version (known empty, and not read, after this writer's own empty ``b-1``); (3) the
batch's contribution lines (Arrow, on the driver), planned (``gold.plan``) and checked for stop
conditions before any write; (4) the step - the net key deltas of the complete prefix, with
the watermark - through the pipeline's engine (``gold.writes``; ``core.engine``):
appended to ``_deltas`` (app transaction ``step_app_id``, version = the step's
watermark), which a fold in the background MERGEs into gold every few seconds (app
transaction of its newest batch; ``gold.fold``), or with a fold share of 1 MERGEd into gold
with the batch (app transaction ``b``); skipped when gold records ``b`` already (a writer
folds what ``_deltas`` holds before its first batch); (5) overwrite ``_pending`` with the
carried rest (Spark, ``txnAppId``/``txnVersion = b``); (6) return. A replay after a kill
anywhere skips what is written and completes the rest (the table there); a writer starting
folds the steps an earlier one left in ``_deltas`` first (``recover``). Every "is it
written already" is read from app transactions, which checkpoints carry, never from the
commits' metadata, which log cleanup deletes (F30). With the ``gold_txn`` guard off
(``Switches(off={"gold_txn"})``, negative controls only) no txn is set on gold and
``_pending`` and (1) and the check of (4) are skipped: a replay after (4) counts twice.

Limits, stated: one gold writer per table (two concurrent jobs would interleave batch ids);
a lost or older checkpoint is refused by ``pipelines.run.stream`` rather than replayed blindly.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from core.captured import COUNTED, CountedTables
from core.commits import commit_metadata as metadata
from core.config import GOLD_FOLD_SHARE
from core.engine.api import Engine
from core.engine.spark_delta import recorded
from core.lsn import fmt
from core.spark import local_frame
from core.switches import NONE, Switches
from gold import deltas as D
from gold.asof import gold_state, step_app_id, txn_app_id
from gold.fold import FoldClock, stamped, summed, unfolded
from gold.gold_tables import GOLD_SCHEMA, GoldPaths
from gold.plan import LINES, Plan, lines_table
from gold.plan import plan as plan_batch
from gold.writes import GoldWrites

log = logging.getLogger("lakecdc.gold")


# The MERGE's source: the plan's key deltas and gold's updated_at.
_UPDATED_AT = to_arrow_schema(GOLD_SCHEMA).field("updated_at")


@dataclass(frozen=True)
class Planned:
    """A batch's step of gold, known before its MERGE commits: gold moves from watermark
    ``after_lsn`` to ``commit_lsn`` by adding ``key_deltas`` (Arrow, ``gold.plan``'s
    ``KEY_DELTA_COLUMNS``: dims, delta, last_commit_lsn). A replay of the batch plans the
    same step (its inputs are fixed), so the dashboard may take it ahead of gold
    (``gold.push.push_ahead``); a replay whose step gold holds already does not hand it on
    (its ``after_lsn`` would be gold's, past the step)."""

    batch_id: int
    after_lsn: int
    commit_lsn: int
    commit_ts: datetime | None
    key_deltas: pa.Table


@dataclass(frozen=True)
class PendingHead:
    """Steps (1)-(2) of a batch, read before its rows are needed (``GoldBatchWriter.read_pending``):
    ``_pending``'s version and newest batch id, and its rows at that version."""

    version: int
    last_batch: int | None
    replayed: bool                      # step (1): the batch is already fully applied
    stored: list[tuple]                 # the carried lines (CONTRIBUTIONS order)


@dataclass(frozen=True)
class GoldBatch:
    batch_id: int
    silver_rows: int = 0
    applied_transactions: int = 0
    merged_keys: int = 0                # gold rows its MERGE updated or inserted (folded)
    step_keys: int = 0                  # keys in the batch's step (its net key deltas)
    pending_transactions: int = 0
    commit_lsn: int | None = None       # watermark after this batch (None: unchanged)
    replayed: bool = False              # step (1): already fully applied
    seconds: float = 0.0
    merge_seconds: float = 0.0          # of ``seconds``: step (4), appended or folded
    folded: bool = False                # step (4) folded into service_stats


@dataclass(frozen=True, eq=False)
class Step:
    """A batch's step as ``_deltas`` holds it: its key deltas (``KEY_DELTA_COLUMNS``) and
    the commit metadata of its append (``batch_id``, ``commit_lsn``, ``commit_ts``,
    ``floor``, ``epoch``, ``transactions``). Compared by identity: a fold removes the very
    steps it folded."""

    key_deltas: pa.Table
    meta: dict


class GoldBatchWriter:
    """The gold half of a stream batch (``apply``; see the module docstring).

    ``floor_lsn``: silver rows with ``commit_lsn <`` it are already in gold (its baseline,
    see ``gold.asof``).
    ``accept_errors_upto``: parse-error rows with ``commit_lsn <=`` it count 0 instead of
    stopping gold (the operator checked them in quarantine).
    ``switches``: its fault points, and the ``gold_txn`` guard, which off switches the
    app-transaction protection off (none recorded, none checked): negative controls only.
    ``storage_options``: delta-rs's, for a lakehouse on S3 (``Lakehouse.delta_rs_options``).
    ``engine``: the engine of gold's and ``_deltas``' commits (``gold.writes``; None:
    delta-rs with ``storage_options``); ``step_engine``: ``_deltas``' own, so a fold never
    waits for a step (None: ``engine.sibling()``).
    ``fold_share``: the most of its time folding ``_deltas`` into gold may take
    (``gold.fold``); below 1 a fold runs in the background, beside the batches (they take
    their steps into ``_deltas``), 1.0 folds each batch's step with the batch, 0 only when
    told (``fold``).
    """

    def __init__(self, paths: GoldPaths, tables: CountedTables = COUNTED, *,
                 floor_lsn: int = 0, epoch: int | None = None, accept_errors_upto: int = 0,
                 switches: Switches = NONE,
                 storage_options: dict | None = None, fold_share: float = GOLD_FOLD_SHARE,
                 engine: Engine | None = None, step_engine: Engine | None = None) -> None:
        self.paths = paths
        self.storage_options = storage_options
        if engine is None:
            from core.engine.delta_rs import DeltaRs

            engine = DeltaRs(storage_options)
        self.engine = engine
        self._writes = GoldWrites(paths.gold, paths.deltas, engine, step_engine)
        self.tables = tables
        self.floor_lsn = floor_lsn
        self.epoch = epoch
        self.app_id = txn_app_id(epoch)
        self.accept_errors_upto = accept_errors_upto
        self.guard = switches.on("gold_txn")
        self.switches = switches
        self.clock = FoldClock(fold_share)
        # (version, batch id) of an empty _pending this writer has not written since.
        self._pending_known_empty: tuple[int, int | None] | None = None
        # Gold's watermark after this writer's last successful batch (None: read it again).
        self._watermark: int | None = None
        # The steps in _deltas that gold does not hold yet, oldest first (None: not known,
        # read _deltas again: ``recover``), and the newest batch id gold records (its app
        # transaction). Only this writer writes gold and _deltas, under the gold lock, so
        # what it wrote is what they hold. ``_state`` guards both and the fold running in
        # the background (``_folding``); ``_merging`` is held through each MERGE into gold.
        self._unfolded: list[Step] | None = None
        self._recorded: int | None = None
        self._state = threading.Lock()
        self._merging = threading.Lock()
        self._folding: threading.Thread | None = None

    def read_pending(self, spark: SparkSession, batch_id: int) -> PendingHead:
        """Steps (1)-(2) of batch ``batch_id``: what ``_pending`` holds. It does not depend
        on the batch's rows, so the stream reads it while it parses them (a catch-up's
        first batch reads the log of ``_pending`` and the table: seconds on a busy
        machine)."""
        # Step (2) without reading the log when this writer's previous batch left _pending
        # empty and unwritten (the usual case: no transaction split across batches). Only
        # lakecdc writes _pending, under the gold lock this job holds; kept only after a
        # batch that succeeded, so a failure (or a new process) reads the table again.
        known_empty, self._pending_known_empty = self._pending_known_empty, None
        version, last_batch = known_empty or self._pending_head(spark)
        replayed = self.guard and last_batch is not None and last_batch >= batch_id
        stored: list[tuple] = []
        if not known_empty and not replayed:
            stored = [tuple(r.values()) for r in (
                spark.read.format("delta").option("versionAsOf", version)
                .load(self.paths.pending).toArrow().to_pylist())]
        return PendingHead(version, last_batch, replayed, stored)

    def apply(self, spark: SparkSession, batch: pa.Table, batch_id: int,
              planned: Callable[[Planned], None] | None = None,
              pending: PendingHead | None = None) -> GoldBatch:
        """Steps (1)-(6) of the module docstring for the silver rows ``batch`` (Arrow, the
        columns ``gold.deltas`` reads); ``pending``: this batch's steps (1)-(2), read by
        ``read_pending`` (read here if None). ``planned`` is called with the batch's step right
        before it is written (not when nothing is applied, nor on a replay that returns at
        step (1))."""
        watermark, self._watermark = self._watermark, None
        started = time.monotonic()
        if pending is None:
            pending = self.read_pending(spark, batch_id)
        if pending.replayed:
            return GoldBatch(batch_id, replayed=True, seconds=time.monotonic() - started)
        if self._unfolded is None:
            self.recover(spark)
        stored = pending.stored
        # Carried rows below the floor are inside a baseline a rebuild wrote since.
        carried = [line for line in stored if line[0] >= self.floor_lsn]
        # Step (3) on the driver: the batch's contribution lines, and whether a row stops
        # gold (``gold.deltas.line_table``), then the plan.
        batch = batch.select(list(D.GOLD_READS))       # rows are copied: not the maps
        silver = batch.filter(pc.greater_equal(batch.column("commit_lsn"), self.floor_lsn))
        found = D.line_table(silver, self.tables, self.accept_errors_upto)
        if found.column("problem_rank").null_count < found.num_rows:
            problem = D.problem_rows(silver, self.tables, self.accept_errors_upto)
            raise D.stop_error(problem.slice(0, 1).to_pylist()[0], self.tables)
        lines = found.drop_columns(["problem_rank"]).cast(LINES)
        plan = plan_batch(pa.concat_tables([lines, lines_table(carried)]) if carried
                          else lines)
        if plan.broken_at is not None:
            raise D.GoldInputError(
                f"silver delivered more rows than the transaction at commit LSN "
                f"{fmt(plan.broken_at)} has (or rows disagreeing about its size); "
                f"gold stopped: {D.REBUILD}.")
        result = dict(batch_id=batch_id, silver_rows=pc.sum(lines.column("rows")).as_py() or 0,
                      applied_transactions=plan.applied,
                      pending_transactions=plan.carried_transactions)
        if plan.applied:
            # A step gold holds already (written before a kill that left _pending and
            # Spark's commit unwritten) is in the dashboard too, or being caught up from
            # gold: handed on again, its starting watermark would be gold's, past it, and
            # the fence would let the dashboard count it twice.
            with self._state:
                recorded = self._recorded
            if planned is not None and not self._holds(batch_id, recorded):
                if watermark is None:
                    watermark = self.watermark(spark)
                if watermark is not None:
                    planned(Planned(batch_id, watermark, plan.commit_lsn, plan.commit_ts,
                                    plan.key_deltas))
            merging = time.monotonic()
            result["step_keys"] = plan.key_deltas.num_rows
            result["merged_keys"], result["folded"] = self._take_step(plan, batch_id)
            result["merge_seconds"] = time.monotonic() - merging
            result["commit_lsn"] = plan.commit_lsn
            self.switches.hit("after_gold_merge")
        if plan.carried or stored:
            self._write_pending(local_frame(spark, plan.carried, D.CONTRIBUTIONS),
                                batch_id, plan.carried_transactions)
            self.switches.hit("after_gold_pending")
        else:                                           # _pending was not written
            self._pending_known_empty = (pending.version, pending.last_batch)
        self._watermark = plan.commit_lsn if plan.applied else watermark
        return GoldBatch(**result, seconds=time.monotonic() - started)

    def watermark(self, spark: SparkSession) -> int | None:
        """The newest source commit gold holds, folded or in ``_deltas``."""
        with self._state:
            if self._unfolded:
                return self._unfolded[-1].meta["commit_lsn"]
        return gold_state(spark, self.paths.gold).watermark

    # --- the step: appended to _deltas, or folded into gold --------------------------------

    def recover(self, spark: SparkSession) -> None:
        """Fold what ``_deltas`` holds and gold does not (the steps of a process that
        stopped between two folds, or of this one after a failed write), so that this
        writer knows what ``_deltas`` holds.

        Decided by app transactions, never by the commits' metadata, which log cleanup
        deletes (F30): gold's (``app_id``: the newest batch whose step it holds) tells which
        rows of ``_deltas`` it holds (each row carries its batch id); ``_deltas``' own
        (``step_app_id``: the newest step's watermark) that it holds steps of this epoch at
        all - those of another (the stream's, before a rebuild) are inside the rebuild's
        baseline - and the watermark the fold records. Without the guard (negative controls)
        gold records no batch, and every row of ``_deltas`` is folded."""
        self.wait_for_fold()
        recorded = self._writes.recorded(self.app_id) if self.guard else None
        waiting = self._writes.deltas(step_app_id(self.epoch))
        with self._state:
            self._unfolded, self._recorded = [], recorded
        if waiting.step_lsn is None:
            return
        rows = unfolded(waiting.rows, recorded, self.floor_lsn)
        meta = self._waiting_meta(waiting, rows, recorded)
        if meta is None:
            return
        with self._state:
            self._unfolded = [Step(rows, meta)]
        self.fold()

    def _waiting_meta(self, waiting, rows: pa.Table, recorded: int | None) -> dict | None:
        """The step metadata of a fold of ``rows``, the rows of ``_deltas`` gold does not
        hold (``waiting``: ``gold.writes.Waiting``), or None when there is nothing to fold.

        The newest step's own metadata while its commit is still in the log (its batch,
        which may have no rows: a step of archival moves only, its time and transactions);
        else the newest batch among the rows, with ``_deltas``' watermark. Its batch is
        always past the one gold records: an app version never goes back."""
        described = waiting.meta or {}
        if described.get("commit_lsn") == waiting.step_lsn and "batch_id" in described:
            meta = {k: described.get(k) for k in ("batch_id", "commit_ts", "transactions")}
        elif rows.num_rows:
            meta = {"batch_id": pc.max(rows.column("batch_id")).as_py(), "commit_ts": None,
                    "transactions": 0}
        else:
            return None
        if recorded is not None and meta["batch_id"] <= recorded:
            return None
        return {**meta, "commit_lsn": waiting.step_lsn, "floor": self.floor_lsn,
                "epoch": self.epoch, "transactions": meta["transactions"] or 0}

    @property
    def _in_batch(self) -> bool:
        """Every batch folds its own step (a share of 1): no fold runs in the background."""
        return self.clock.share >= 1

    def fold(self) -> int:
        """Fold every step appended since the last fold into gold now, after the fold
        running in the background if any; returns the gold rows it updated or inserted (0
        with nothing to fold)."""
        self.wait_for_fold()
        with self._state:
            parts = list(self._unfolded or ())
        if not parts:
            return 0
        merged = self._fold(parts)
        self.switches.hit("after_gold_fold")
        return merged

    def fold_if_due(self) -> bool:
        """Start a fold in the background when ``FoldClock`` says so, none is running and
        steps wait; whether it started one. Safe beside a batch: a fold writes gold only,
        which a batch only reads (``paused`` keeps it off gold's maintenance)."""
        if self._in_batch:
            return False
        with self._state:
            if self._folding is not None or not self._unfolded or not self.clock.due():
                return False
            parts = list(self._unfolded)
            self._folding = threading.Thread(target=self._fold_in_background, args=(parts,),
                                             name="lakecdc-gold-fold", daemon=True)
            self._folding.start()
        return True

    def wait_for_fold(self) -> None:
        """Until the fold running in the background (if any) has ended."""
        with self._state:
            folding = self._folding
        if folding is not None:
            folding.join()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No MERGE into gold inside the block (gold's maintenance); a running one is waited
        for, and one due meanwhile waits for the block's end."""
        with self._merging:
            yield

    def _fold_in_background(self, parts: list[Step]) -> None:
        try:
            self._fold(parts)
            self.switches.hit("after_gold_fold")
        except Exception as exc:   # the next batch reads _deltas again and folds (recover)
            log.warning("folding gold's waiting steps failed; the next batch tries again: %s",
                        exc)
        finally:
            with self._state:
                self._folding = None

    def _take_step(self, plan: Plan, batch_id: int) -> tuple[int, bool]:
        """Step (4): the batch's key deltas appended to ``_deltas`` and a fold started when
        due (``fold_if_due``), or, with a share of 1, folded into gold with the batch; returns
        (gold rows updated or inserted, folded). Nothing when gold records the batch already
        (a replay after a kill; ``recover`` folded what _deltas held first): delta-rs
        records app transactions but does not skip a write it has recorded, so the version
        gold records (read by ``recover``, moved by each fold) is checked first; one writer
        per gold table (the gold lock) makes the check and the commit one step."""
        with self._state:
            recorded, waiting = self._recorded, self._unfolded
        if self._holds(batch_id, recorded):
            return 0, False
        ts = plan.commit_ts
        step = Step(plan.key_deltas, dict(
            batch_id=batch_id, commit_lsn=plan.commit_lsn,
            commit_ts=ts.isoformat(timespec="microseconds") if ts is not None else None,
            floor=self.floor_lsn, epoch=self.epoch, transactions=plan.applied))
        if self._in_batch:
            return self._fold([*(waiting or ()), step]), True
        try:
            # The first step after a fold replaces what _deltas held: all in gold. (Not
            # known: appended; ``recover`` reads past what gold holds.)
            self._writes.append_step(stamped(plan.key_deltas, batch_id), metadata(**step.meta),
                                     overwrite=waiting == [],
                                     app=(step_app_id(self.epoch), plan.commit_lsn))
        except BaseException:
            with self._state:
                self._unfolded = None
            raise
        with self._state:
            if self._unfolded is not None:
                self._unfolded.append(step)
        self.fold_if_due()
        return 0, False

    def _holds(self, batch_id: int, recorded: int | None) -> bool:
        """Whether gold, recording version ``recorded`` (read by ``recover`` - after
        folding what _deltas held - and moved by each fold), holds batch ``batch_id``'s
        step."""
        return self.guard and recorded is not None and recorded >= batch_id

    def _app(self, batch_id: int) -> tuple[str, int] | None:
        """The app transaction of a fold whose newest step is ``batch_id``'s."""
        return (self.app_id, batch_id) if self.guard else None

    def _fold(self, parts: list[Step]) -> int:
        """MERGE the key deltas of ``parts`` (the oldest steps waiting, and the batch's own
        with a share of 1) into gold, with the app transaction and metadata of the newest
        in its one commit; returns the gold rows it updated or inserted. The parts leave
        ``_unfolded`` when it commits; a failure leaves it unknown (``recover``).

        delta-rs runs it outside the JVM and the interpreter lock, far cheaper than Spark's
        MERGE (docs/gold.md, "What made the stream fast"); Spark runs it where only Spark
        reaches storage (``gold.writes``)."""
        newest_meta = parts[-1].meta
        meta = {**newest_meta,
                "transactions": sum(part.meta.get("transactions", 0) for part in parts)}
        deltas = summed([part.key_deltas for part in parts])
        source = deltas.append_column(_UPDATED_AT, pa.repeat(
            pa.scalar(datetime.now(timezone.utc), _UPDATED_AT.type), deltas.num_rows))
        try:
            with self._merging:
                started = time.monotonic()          # the fold's own time, not its wait
                metrics = self._writes.fold(source, metadata(**meta),
                                            self._app(newest_meta["batch_id"]))
        except BaseException:
            with self._state:
                self._unfolded = None
            raise
        seconds = time.monotonic() - started
        with self._state:
            if self._unfolded is not None:
                # The parts are the oldest steps waiting (the batch's own, with a share of
                # 1, was never among them).
                del self._unfolded[:sum(part in self._unfolded for part in parts)]
            if self.guard:
                self._recorded = newest_meta["batch_id"]
            self.clock.folded(seconds)
        log.debug("folded %d steps into gold (%d keys) in %.2fs", len(parts),
                  deltas.num_rows, seconds)
        return int(metrics["num_target_rows_updated"] + metrics["num_target_rows_inserted"])

    def _write_pending(self, carried: DataFrame, batch_id: int, transactions: int) -> None:
        writer = (carried.write.format("delta").mode("overwrite")
                  .option("userMetadata", metadata(batch_id=batch_id, floor=self.floor_lsn,
                                                   epoch=self.epoch,
                                                   transactions=transactions)))
        if self.guard:
            writer = writer.option("txnAppId", self.app_id).option("txnVersion", batch_id)
        writer.save(self.paths.pending)

    def _pending_head(self, spark: SparkSession) -> tuple[int, int | None]:
        """(version, the newest batch that wrote it or None) of ``_pending``: the batch is
        the version its app transaction records (``_write_pending``), which no other commit
        (a compaction, a rebuild's, which starts another epoch) moves and no log cleanup
        loses."""
        found = recorded(spark, self.paths.pending)
        return found.version, found.version_of(self.app_id)
