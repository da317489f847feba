"""The invariants I1-I5 (docs/reliability.md) in one call, checked from independent sources only.

``check_invariants(config, witness, ...)`` runs after a scenario has drained the pipeline
and the source is quiet. Nothing it compares comes from the pipeline's own counters,
progress records or delta rules:

- **I1 bronze** (``truth.check_bronze``): every transaction the witness slot saw committed
  is in bronze exactly once and whole, nothing else is (rolled-back work, duplicates), and
  every change row is of a captured table - the push's own writes into the captured
  database never re-enter the stream (F20). Rows a test planted in bronze itself (poison
  input) are passed as ``planted`` and expected like witnessed ones.
- **I2 silver**: read with delta-rs. Silver rows parsed cleanly + quarantined rows = bronze
  rows, key by key ``(commit_lsn, seq)``: no duplicate in either table, no bronze row
  missing, none invented; a quarantined row is exactly a silver row with ``error`` set, and
  carries bronze's raw JSON unchanged.
- **I3 gold** and **I4 dashboard** (``truth.check_gold``): gold = a ``GROUP BY`` over the
  source tables (plus the history rows the test purged itself), exactly, no clamps; the
  dashboard = gold.
- **I5 liveness**: the slot is still ``reserved`` and its lag returns to ~0. A slot can only
  be moved to the end of a transaction it decoded, and WAL with no transaction in it
  (autovacuum, checkpoints) may follow the last one; so the check commits a probe row into
  an uncaptured table (what a heartbeat does), lets the shipper drain once more (JVM-free)
  and then requires the slot's ``confirmed_flush_lsn`` within ``max_lag`` of the end of the
  WAL as it was just after the probe. WAL written later (autovacuum of a freshly populated
  database) is not the shipper's to confirm, and once made CI flaky.

Every failure is an ``AssertionError`` whose message starts with the invariant's name
(``I1 bronze: ...``), so negative controls can assert *which* invariant caught the damage.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import psycopg
from deltalake import DeltaTable

from tests.truth import Witness, bronze_rows, check_bronze, check_gold, gold_counts

# After the probe and one more ship, only the WAL written after the probe's commit remains:
# a few records (the probe's own commit record, a running-xacts record). 16 kB is generous.
MAX_LAG_BYTES = 16 * 1024
PROBE_TABLE = "lakecdc_invariants_probe"


@dataclass
class Verdict:
    """What the checker saw (for a scenario's summary; never used to decide anything)."""

    transactions: int = 0
    bronze_rows: int = 0
    silver_clean: int = 0
    quarantined: int = 0
    gold_keys: int = 0
    notifications: int = 0
    lag_before_probe: int = 0
    lag_after_probe: int = 0
    wal_status: str = ""

    def summary(self) -> str:
        return (f"I1 {self.transactions} transactions / {self.bronze_rows} bronze rows; "
                f"I2 {self.silver_clean} clean + {self.quarantined} quarantined; "
                f"I3/I4 {self.gold_keys} keys, {self.notifications} notifications; "
                f"I5 wal_status={self.wal_status}, lag {self.lag_before_probe} B before the "
                f"probe, {self.lag_after_probe} B after")


def _fail(invariant: str, exc: AssertionError) -> AssertionError:
    return AssertionError(f"{invariant}: {exc}")


# --- I1 ----------------------------------------------------------------------------------

def check_i1(bronze_path: str, witness: Witness, captured: tuple[str, ...],
             planted: dict[int, list[str]] | None = None) -> dict[int, list[str]]:
    """I1; returns the expected transactions (witnessed + planted)."""
    expected = witness.transactions()
    clash = set(expected) & set(planted or {})
    assert not clash, f"planted commit LSNs {sorted(clash)} collide with real transactions"
    expected.update(planted or {})
    try:
        check_bronze(bronze_path, expected)
    except AssertionError as exc:
        raise _fail("I1 bronze", exc) from None
    foreign = Counter()
    for row in bronze_rows(bronze_path):
        if row["commit_lsn"] in (planted or {}):
            continue            # the test's own poison; check_bronze matched it exactly
        change = json.loads(row["data"])
        if change.get("action") in ("I", "U", "D", "T"):
            table = f"{change.get('schema')}.{change.get('table')}"
            if table not in captured:
                foreign[table] += 1
    assert not foreign, f"I1 bronze: changes of uncaptured tables reached bronze: {foreign}"
    return expected


# --- I2 ----------------------------------------------------------------------------------

def _keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(r["commit_lsn"], r["seq"]) for r in rows]


def check_i2(lakehouse: str, bronze: list[dict]) -> tuple[int, int]:
    """I2; returns (clean silver rows, quarantined rows)."""
    silver = DeltaTable(f"{lakehouse}/silver/changes").to_pyarrow_table(
        columns=["commit_lsn", "seq", "error"]).to_pylist()
    quarantine = DeltaTable(f"{lakehouse}/silver/quarantine").to_pyarrow_table(
        columns=["commit_lsn", "seq", "data"]).to_pylist()
    bronze_keys = _keys(bronze)
    silver_keys, quarantine_keys = _keys(silver), _keys(quarantine)
    for name, keys in (("silver/changes", silver_keys), ("silver/quarantine", quarantine_keys)):
        dupes = len(keys) - len(set(keys))
        assert dupes == 0, f"I2 silver: {name} holds {dupes} duplicate (commit_lsn, seq) keys"
    clean = {(r["commit_lsn"], r["seq"]) for r in silver if r["error"] is None}
    failed = {(r["commit_lsn"], r["seq"]) for r in silver if r["error"] is not None}
    assert failed == set(quarantine_keys), \
        (f"I2 silver: silver rows with an error and quarantine rows differ "
         f"({len(failed - set(quarantine_keys))} not quarantined, "
         f"{len(set(quarantine_keys) - failed)} quarantined without an error row)")
    missing = set(bronze_keys) - clean - set(quarantine_keys)
    extra = (clean | set(quarantine_keys)) - set(bronze_keys)
    assert not missing, f"I2 silver: {len(missing)} bronze rows neither in silver nor quarantined"
    assert not extra, f"I2 silver: {len(extra)} silver/quarantine rows bronze does not hold"
    assert len(clean) + len(quarantine_keys) == len(bronze_keys), \
        "I2 silver: clean + quarantined != bronze rows"
    raw = {(r["commit_lsn"], r["seq"]): r["data"] for r in bronze}
    changed = [q for q in quarantine if raw[(q["commit_lsn"], q["seq"])] != q["data"]]
    assert not changed, f"I2 silver: {len(changed)} quarantine rows lost bronze's raw JSON"
    return len(clean), len(quarantine_keys)


# --- I3, I4 -------------------------------------------------------------------------------

def check_i3_i4(lakehouse: str, source_dsn: str, dashboard_dsn: str,
                purged: Counter | None = None, schema: str = "public") -> None:
    try:
        check_gold(lakehouse, source_dsn, dashboard_dsn, purged, schema)
    except AssertionError as exc:
        which = "I4 dashboard" if "dashboard" in str(exc) else "I3 gold"
        raise _fail(which, exc) from None


# --- I5 -------------------------------------------------------------------------------------

def slot_position(dsn: str, slot: str) -> tuple[str, int]:
    """(wal_status, lag in bytes) of ``slot``, straight from ``pg_replication_slots``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT wal_status, (pg_current_wal_lsn() - confirmed_flush_lsn)"
                           "::bigint FROM pg_replication_slots WHERE slot_name = %s",
                           [slot]).fetchone()
    assert row is not None, f"I5 liveness: replication slot {slot} is gone"
    return row[0], int(row[1])


def slot_lag_behind(dsn: str, slot: str, lsn: str) -> int:
    """Bytes between ``slot``'s confirmed position and ``lsn`` (0 or less once it is past)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT (%s::pg_lsn - confirmed_flush_lsn)::bigint FROM "
                                "pg_replication_slots WHERE slot_name = %s",
                                [lsn, slot]).fetchone()[0])


def check_i5(config, max_lag: int = MAX_LAG_BYTES, drain=None) -> tuple[str, int, int]:
    """I5 (see the module docstring); returns (wal_status, lag before, lag after the probe).

    ``drain`` moves the slot after the probe; by default the product's shipper, once,
    JVM-free (a negative control passes one that does nothing). What is judged - the
    slot's position against the end of the WAL - is read from Postgres.
    """
    dsn, slot = config.require_source(), config.slot
    status, before = slot_position(dsn, slot)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} (at timestamptz)")
        conn.execute(f"INSERT INTO {PROBE_TABLE} VALUES (now())")
        probe = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    if drain is None:
        from bronze.ship import Shipper

        Shipper(config).run(once=True)
    else:
        drain()
    status, _ = slot_position(dsn, slot)
    assert status == "reserved", f"I5 liveness: slot {slot} has wal_status={status}"
    after = slot_lag_behind(dsn, slot, probe)
    assert after < max_lag, (f"I5 liveness: slot {slot} lags {after} bytes behind the WAL "
                             f"after draining (limit {max_lag})")
    return status, before, after


# --- all of them -----------------------------------------------------------------------------

def check_invariants(config, witness: Witness, purged: Counter | None = None,
                     planted: dict[int, list[str]] | None = None,
                     max_lag: int = MAX_LAG_BYTES, schema: str = "public",
                     drain=None) -> Verdict:
    """I1-I5 for the pipeline of ``config`` (local lakehouse) after it has drained.

    ``purged``: dims of history rows the test deleted itself (the truth still counts them,
    docs/gold.md). ``planted``: ``{commit_lsn: [json, ...]}`` rows the test wrote into bronze
    directly (poison input). ``drain``: I5's (``check_i5``; a lakehouse set up with
    ``LAKECDC_WRITER=spark`` is shipped to through Spark). Raises ``AssertionError`` naming
    the first invariant broken.
    """
    verdict = Verdict()
    expected = check_i1(config.bronze_path, witness, tuple(config.tables), planted)
    bronze = DeltaTable(config.bronze_path).to_pyarrow_table(
        columns=["commit_lsn", "seq", "data"]).to_pylist()
    verdict.transactions, verdict.bronze_rows = len(expected), len(bronze)
    verdict.silver_clean, verdict.quarantined = check_i2(config.lakehouse, bronze)
    check_i3_i4(config.lakehouse, config.require_source(), config.dashboard, purged, schema)
    gold = gold_counts(config.lakehouse)
    verdict.gold_keys, verdict.notifications = len(gold), sum(gold.values())
    verdict.wal_status, verdict.lag_before_probe, verdict.lag_after_probe = \
        check_i5(config, max_lag, drain)
    return verdict
