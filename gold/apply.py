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
replay": (1) return if ``_pending`` records ``b``; (2) read ``_pending`` (``gold.pending``);
(3) the batch's contribution lines (Arrow, on the driver) past gold's watermark, planned
(``gold.plan``) and checked for stop conditions before any write; (4) the step - the net key
deltas of the complete prefix, from gold's watermark to the step's - through the pipeline's
engine (``gold.writes``; ``core.engine``): appended to ``_deltas`` (app transaction
``step_app_id``, version = the step's watermark), which a fold in the background MERGEs
into gold every few seconds (app transaction ``folded_app_id``, version = its newest step's
watermark; ``gold.fold``), or with a fold share of 1 MERGEd into gold with the batch; (5)
overwrite ``_pending`` with the carried rest; (6) return. Inside ``lakecdc run`` each
shipper batch's step is appended too, when gold's watermark is where it starts
(``step_ahead``); the stream's batches then leave out the rows gold holds. A replay after a
kill anywhere skips what is written and completes the rest; a writer starting folds the
steps an earlier one left in ``_deltas`` first (``recover``). Every "is it written
already" is read from app transactions, which checkpoints carry, never from the commits'
metadata, which log cleanup deletes (F30). With the ``gold_txn`` guard off (negative
controls only) nothing is recorded or checked: a replay after (4) counts twice; with the
``gold_watermark`` guard off, (3) takes rows gold holds too.

Limits, stated: one gold writer per table (the gold lock); a lost or older checkpoint is
refused by ``pipelines.run.stream`` rather than replayed blindly.
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
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from core.captured import COUNTED, CountedTables
from core.commits import commit_metadata as metadata
from core.config import GOLD_FOLD_SHARE
from core.engine.api import Engine
from core.lsn import fmt
from core.spark import local_frame
from core.switches import NONE, Switches
from gold import deltas as D
from gold.asof import folded_app_id, gold_state, step_app_id, txn_app_id
from gold.fold import SHIP_STEP, FoldClock, stamped, summed, unfolded
from gold.gold_tables import GOLD_SCHEMA, GoldPaths
from gold.pending import Pending, PendingHead
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
    transactions: int = 0               # source transactions it applies


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
    ``switches``: its fault points, and the guards ``gold_txn`` (off: no app transaction
    recorded or checked) and ``gold_watermark`` (off: rows gold holds planned again).
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
        self.folded_app = folded_app_id(epoch)
        self.accept_errors_upto = accept_errors_upto
        self.guard = switches.on("gold_txn")
        self.filtered = self.guard and switches.on("gold_watermark")
        self.switches = switches
        self.clock = FoldClock(fold_share)
        self._pending = Pending(paths.pending, self.app_id, self.guard, floor_lsn, epoch)
        # The steps in _deltas gold does not hold, oldest first (None: not known; read again
        # by ``recover``); the newest folded step's watermark (``folded_app``); the batch an
        # older gold records (``app_id``); gold's watermark, folded or in _deltas. One writer
        # (the gold lock), so what it wrote is what they hold. ``_stepping`` is held from a
        # step's start to its append (the stream's steps and ``step_ahead`` take turns),
        # ``_state`` guards the rest and ``_folding``, ``_merging`` each MERGE into gold.
        self._unfolded: list[Step] | None = None
        self._folded: int | None = None
        self._recorded: int | None = None
        self._known: int | None = None
        self._stepping = threading.RLock()
        self._state = threading.Lock()
        self._merging = threading.Lock()
        self._folding: threading.Thread | None = None

    def read_pending(self, spark: SparkSession, batch_id: int) -> PendingHead:
        """Steps (1)-(2) of batch ``batch_id``: what ``_pending`` holds. It does not depend
        on the batch's rows, so the stream reads it while it parses them (a catch-up's
        first batch reads the log of ``_pending`` and the table: seconds on a busy
        machine)."""
        return self._pending.head(spark, batch_id)

    def apply(self, spark: SparkSession, batch: pa.Table, batch_id: int,
              planned: Callable[[Planned], None] | None = None,
              pending: PendingHead | None = None) -> GoldBatch:
        """Steps (1)-(6) of the module docstring for the silver rows ``batch`` (Arrow, the
        columns ``gold.deltas`` reads); ``pending``: this batch's steps (1)-(2), read by
        ``read_pending`` (read here if None). ``planned`` is called with the batch's step right
        before it is written (not when nothing is applied, nor on a replay that returns at
        step (1))."""
        started = time.monotonic()
        if pending is None:
            pending = self.read_pending(spark, batch_id)
        if pending.replayed:
            return GoldBatch(batch_id, replayed=True, seconds=time.monotonic() - started)
        if self._unfolded is None:
            self.recover(spark)
        # Step (3) on the driver: the batch's contribution lines, and whether a row stops
        # gold (``gold.deltas.line_table``), then the plan. Rows below the floor are inside
        # a baseline a rebuild wrote since, rows at or below gold's watermark in gold
        # already (a shipper batch's step took them: ``step_ahead``).
        held = self._known if self.filtered else None   # gold's, folded or in _deltas
        batch = batch.select(list(D.GOLD_READS))       # rows are copied: not the maps
        silver = batch.filter(_past(batch.column("commit_lsn"), self.floor_lsn, held))
        found = D.line_table(silver, self.tables, self.accept_errors_upto)
        if found.column("problem_rank").null_count < found.num_rows:
            problem = D.problem_rows(silver, self.tables, self.accept_errors_upto)
            raise D.stop_error(problem.slice(0, 1).to_pylist()[0], self.tables)
        lines = found.drop_columns(["problem_rank"]).cast(LINES)
        with self._stepping:                # gold's watermark holds until the step's append
            held = self._known if self.filtered else None
            lines = lines.filter(_past(lines.column("commit_lsn"), self.floor_lsn, held))
            carried = [line for line in pending.stored
                       if line[0] >= self.floor_lsn and (held is None or line[0] > held)]
            plan = plan_batch(pa.concat_tables([lines, lines_table(carried)]) if carried
                              else lines)
            if plan.broken_at is not None:
                raise D.GoldInputError(
                    f"silver delivered more rows than the transaction at commit LSN "
                    f"{fmt(plan.broken_at)} has (or rows disagreeing about its size); "
                    f"gold stopped: {D.REBUILD}.")
            result = dict(batch_id=batch_id,
                          silver_rows=pc.sum(lines.column("rows")).as_py() or 0,
                          applied_transactions=plan.applied,
                          pending_transactions=plan.carried_transactions)
            if plan.applied:
                # A step gold holds already (written before a kill that left _pending and
                # Spark's commit unwritten) is in the dashboard too, or being caught up
                # from gold: handed on again, its starting watermark would be gold's, past
                # it, and the fence would let the dashboard count it twice.
                if planned is not None and not self._holds(batch_id):
                    watermark = self._known if self._known is not None \
                        else self.watermark(spark)
                    if watermark is not None:
                        planned(Planned(batch_id, watermark, plan.commit_lsn, plan.commit_ts,
                                        plan.key_deltas))
                merging = time.monotonic()
                result["step_keys"] = plan.key_deltas.num_rows
                result["merged_keys"], result["folded"] = self._take_step(plan, batch_id)
                result["merge_seconds"] = time.monotonic() - merging
                result["commit_lsn"] = plan.commit_lsn
                self.switches.hit("after_gold_merge")
        if plan.carried or pending.stored:
            self._pending.write(local_frame(spark, plan.carried, D.CONTRIBUTIONS),
                                batch_id, plan.carried_transactions)
            self.switches.hit("after_gold_pending")
        else:                                           # _pending was not written
            self._pending.left_empty(pending)
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
        writer knows what ``_deltas`` holds, and gold's watermark.

        Decided by app transactions, never by the commits' metadata, which log cleanup
        deletes (F30): gold's (``folded_app``: the newest folded step's watermark) tells
        which rows of ``_deltas`` it holds (``gold.fold.unfolded``); ``_deltas``' own
        (``step_app_id``: the newest step's watermark) that it holds steps of this epoch at
        all - those of another (the stream's, before a rebuild) are inside the rebuild's
        baseline - and the watermark the fold records. Without the guard (negative controls)
        gold records nothing, and every row of ``_deltas`` is folded."""
        self.wait_for_fold()
        with self._stepping:
            folded = self._writes.recorded(self.folded_app) if self.guard else None
            recorded = self._writes.recorded(self.app_id) if self.guard else None
            waiting = self._writes.deltas(step_app_id(self.epoch))
            with self._state:
                self._unfolded, self._folded, self._recorded = [], folded, recorded
                self._known = max((lsn for lsn in (folded, waiting.step_lsn)
                                   if lsn is not None), default=None)
            if waiting.step_lsn is None:
                return
            rows = unfolded(waiting.rows, folded, self.floor_lsn, recorded)
            meta = self._waiting_meta(waiting, rows, folded, recorded)
            if meta is None:
                return
            with self._state:
                self._unfolded = [Step(rows, meta)]
            self.fold()

    def _waiting_meta(self, waiting, rows: pa.Table, folded: int | None,
                      recorded: int | None) -> dict | None:
        """The step metadata of a fold of ``rows``, the rows of ``_deltas`` gold does not
        hold (``waiting``: ``gold.writes.Waiting``), or None when there is nothing to fold:
        gold's folds record ``_deltas``' newest step (``folded``), or, in a gold folded
        before folds recorded their watermark, its newest batch (``recorded``).

        The newest step's own metadata while its commit is in the log (a step may have no
        rows: archival moves only); else the newest batch among the rows."""
        if folded is not None and waiting.step_lsn <= folded:
            return None
        described = waiting.meta or {}
        if described.get("commit_lsn") == waiting.step_lsn and "batch_id" in described:
            meta = {k: described.get(k) for k in ("batch_id", "commit_ts", "transactions")}
        elif rows.num_rows:
            meta = {"batch_id": pc.max(rows.column("batch_id")).as_py(), "commit_ts": None,
                    "transactions": 0}
        else:
            return None
        if folded is None and recorded is not None and meta["batch_id"] <= recorded:
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
        """No step and no MERGE into gold inside the block (gold's maintenance); a running
        one is waited for, and one due meanwhile waits for the block's end."""
        with self._stepping, self._merging:
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
        """Step (4), under ``_stepping``: the batch's key deltas appended to ``_deltas`` and
        a fold started when due (``fold_if_due``), or, with a share of 1, folded into gold
        with the batch; returns (gold rows updated or inserted, folded). Nothing when a gold
        folded before folds recorded their watermark records the batch already (a replay
        after a kill, which the watermark's filter in ``apply`` keeps out otherwise)."""
        if self._holds(batch_id):
            return 0, False
        step = _step(plan.key_deltas, batch_id, plan.commit_lsn, plan.commit_ts,
                     self.floor_lsn, self.epoch, plan.applied)
        if self._in_batch:
            with self._state:
                waiting = self._unfolded
            merged = self._fold([*(waiting or ()), step])
            self._known = plan.commit_lsn
            return merged, True
        self._append(step)
        self.fold_if_due()
        return 0, False

    @property
    def known_watermark(self) -> int | None:     # gold's, folded or in _deltas
        return self._known

    def step_ahead(self, step: Planned) -> bool:
        """A shipper batch's step (``gold.ahead``), appended to ``_deltas`` only if gold
        stands at its start (``gold.push.push_ahead``'s fence); whether it was. Only where
        gold's folds record their watermark (these steps have no batch id), below a share
        of 1, with the guards on; the stream's batches then leave its rows out."""
        with self._stepping:
            with self._state:
                ready = self._unfolded is not None and self._folded is not None
            if not (ready and self.filtered and not self._in_batch
                    and self._known == step.after_lsn):
                return False
            self._append(_step(step.key_deltas, SHIP_STEP, step.commit_lsn, step.commit_ts,
                               self.floor_lsn, self.epoch, step.transactions))
        self.switches.hit("after_gold_ahead")
        self.fold_if_due()
        return True

    def _append(self, step: Step) -> None:
        """Append ``step`` to ``_deltas`` (``Step.meta``'s batch id on its rows, its
        watermark in the app transaction), under ``_stepping``; gold's watermark then is
        the step's."""
        with self._state:
            waiting = self._unfolded
        try:
            # The first step after a fold replaces what _deltas held: all in gold. (Not
            # known: appended; ``recover`` reads past what gold holds.)
            self._writes.append_step(stamped(step.key_deltas, step.meta["batch_id"]),
                                     metadata(**step.meta), overwrite=waiting == [],
                                     app=(step_app_id(self.epoch), step.meta["commit_lsn"]))
        except BaseException:
            with self._state:
                self._unfolded = None
            raise
        with self._state:
            if self._unfolded is not None:
                self._unfolded.append(step)
        self._known = step.meta["commit_lsn"]

    def _holds(self, batch_id: int) -> bool:
        """Whether a gold folded before folds recorded their watermark records batch
        ``batch_id``'s step (read by ``recover``; no fold moves it since)."""
        with self._state:
            recorded = self._recorded
        return self.guard and recorded is not None and recorded >= batch_id

    def _fold(self, parts: list[Step]) -> int:
        """MERGE the key deltas of ``parts`` (the oldest steps waiting, and the batch's own
        with a share of 1) into gold, with the app transaction and metadata of the newest
        in its one commit; returns the gold rows it updated or inserted. The parts leave
        ``_unfolded`` when it commits; a failure leaves it unknown (``recover``).

        delta-rs runs it outside the JVM and the interpreter lock, far cheaper than Spark's
        MERGE (docs/gold.md, "What made the stream fast"); Spark runs it where only Spark
        reaches storage (``gold.writes``)."""
        with self._merging:
            with self._state:           # a fold beside it (another thread's) took them
                folded = self._folded if self.filtered else None
            parts = [p for p in parts if folded is None or p.meta["commit_lsn"] > folded]
            if not parts:
                return 0
            newest_meta = parts[-1].meta
            meta = {**newest_meta,
                    "transactions": sum(part.meta.get("transactions", 0) for part in parts)}
            deltas = summed([part.key_deltas for part in parts])
            source = deltas.append_column(_UPDATED_AT, pa.repeat(
                pa.scalar(datetime.now(timezone.utc), _UPDATED_AT.type), deltas.num_rows))
            started = time.monotonic()          # the fold's own time, not its wait
            try:
                metrics = self._writes.fold(source, metadata(**meta), (
                    self.folded_app, newest_meta["commit_lsn"]) if self.guard else None)
            except BaseException:
                with self._state:
                    self._unfolded = None
                raise
            seconds = time.monotonic() - started
            with self._state:
                if self._unfolded is not None:
                    # The parts are the oldest steps waiting (the batch's own, with a share
                    # of 1, was never among them).
                    del self._unfolded[:sum(part in self._unfolded for part in parts)]
                if self.guard:
                    self._folded = newest_meta["commit_lsn"]
                self.clock.folded(seconds)
        log.debug("folded %d steps into gold (%d keys) in %.2fs", len(parts),
                  deltas.num_rows, seconds)
        return int(metrics["num_target_rows_updated"] + metrics["num_target_rows_inserted"])


def _past(commit_lsn: pa.ChunkedArray, floor: int, held: int | None) -> pa.ChunkedArray:
    """Which rows or lines gold does not hold: at or past its floor, past ``held``."""
    keep = pc.greater_equal(commit_lsn, floor)
    return keep if held is None else pc.and_(keep, pc.greater(commit_lsn, held))


def _step(key_deltas: pa.Table, batch_id: int, commit_lsn: int, commit_ts: datetime | None,
          floor: int, epoch: int | None, transactions: int) -> Step:
    """A step from its key deltas and what its commit's metadata records."""
    return Step(key_deltas, dict(
        batch_id=batch_id, commit_lsn=commit_lsn,
        commit_ts=commit_ts.isoformat(timespec="microseconds") if commit_ts else None,
        floor=floor, epoch=epoch, transactions=transactions))
