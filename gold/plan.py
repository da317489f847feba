"""What one gold batch applies, from its aggregated contributions: pure Python, no I/O.

The stream's batch becomes its contribution lines on the driver (``gold.deltas.line_table``:
a few per source transaction and key), joined by the lines ``_pending``
carried from earlier batches. ``plan`` then decides, as ``gold.apply`` documents:

- a source transaction is *complete* when its lines hold ``tx_changes`` rows, and *broken*
  when they hold more, or disagree about its size (silver delivered something twice);
- the *cutoff* is the lowest commit LSN of an incomplete or broken transaction: gold applies
  exactly the transactions below it, so it always holds a prefix of the source's commit
  order and its watermark means "exact as of this commit";
- the applied transactions' net delta per key (zero nets dropped), each with the newest
  applied commit that touched it; the lines at or past the cutoff are carried.

Lines are tuples in ``gold.deltas.CONTRIBUTIONS`` order: ``(commit_lsn, tx_changes,
service_id, template_id, notification_type, notification_status, commit_ts, delta, rows)``,
dims all None on a transaction's row-count line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

Line = tuple   # CONTRIBUTIONS order, see the module docstring


@dataclass(frozen=True)
class Plan:
    transactions: int                   # source transactions the lines belong to
    applied: int                        # of them, applied now (below the cutoff)
    commit_lsn: int | None              # gold's watermark after this batch (None: unchanged)
    commit_ts: datetime | None
    key_deltas: list[tuple]             # (dims..., delta, last_commit_lsn), nonzero deltas
    carried: list[Line]                 # lines of the transactions not applied yet
    broken_at: int | None = None        # the lowest broken transaction, if any

    @property
    def carried_transactions(self) -> int:
        return self.transactions - self.applied


def aggregate(lines: Iterable[Line]) -> list[Line]:
    """Sum lines per (commit_lsn, tx_changes, dims): associative, so the carried lines of
    earlier batches combine with a new batch's by concatenation and this."""
    sums: dict[tuple, list] = {}
    for lsn, tx_changes, s, t, y, st, ts, delta, rows in lines:
        key = (lsn, tx_changes, s, t, y, st)
        got = sums.get(key)
        if got is None:
            sums[key] = [ts, delta, rows]
        else:
            if ts is not None and (got[0] is None or ts > got[0]):
                got[0] = ts
            got[1] += delta
            got[2] += rows
    return [(*key, ts, delta, rows) for key, (ts, delta, rows) in sums.items()]


def plan(lines: Iterable[Line]) -> Plan:
    lines = aggregate(lines)
    txs: dict[int, list] = {}          # lsn -> [rows, min tx_changes, max tx_changes, ts]
    for lsn, tx_changes, *_dims, ts, _delta, rows in lines:
        tx = txs.get(lsn)
        if tx is None:
            txs[lsn] = [rows, tx_changes, tx_changes, ts]
        else:
            tx[0] += rows
            tx[1], tx[2] = min(tx[1], tx_changes), max(tx[2], tx_changes)
            if ts is not None and (tx[3] is None or ts > tx[3]):
                tx[3] = ts
    broken = [lsn for lsn, (rows, lo, hi, _) in txs.items()
              if rows > lo or lo != hi or lo < 1]
    waiting = [lsn for lsn, (rows, lo, _, _) in txs.items() if rows != lo]
    cutoff = min(broken + waiting, default=None)
    applied = [lsn for lsn in txs if cutoff is None or lsn < cutoff]
    newest = max(applied, default=None)
    deltas: dict[tuple, list] = {}
    carried = []
    for line in lines:
        lsn, _, *dims = line[:6]
        if cutoff is not None and lsn >= cutoff:
            carried.append(line)
        elif dims[0] is not None:
            got = deltas.setdefault(tuple(dims), [0, lsn])
            got[0] += line[7]
            got[1] = max(got[1], lsn)
    return Plan(transactions=len(txs), applied=len(applied), commit_lsn=newest,
                commit_ts=txs[newest][3] if newest is not None else None,
                key_deltas=[(*dims, delta, last) for dims, (delta, last) in deltas.items()
                            if delta != 0],
                carried=carried, broken_at=min(broken, default=None))

