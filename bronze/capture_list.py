"""The captured set: which source tables the shipper asks wal2json for, kept in the lakehouse
beside bronze (``bronze/_captured``) so that no restart can lose it.

A Delta table; each version is the whole set, one row per table ever captured, and its
Delta version is the set's version (the first, made empty, holds none). A table's state:

- ``snapshotting``: captured; ``lakecdc tables add`` is reading its current rows;
- ``captured``;
- ``removed``: no longer captured (``lakecdc tables remove``); its mirror is kept as it was,
  and silver still knows its changes already in bronze.

The shipper peeks with the newest set and records the version it used as bronze's app
transaction ``<slot>:captured`` (``bronze.table``) in the commit that holds what it decoded
with it, so the set is committed with the progress it governs. Once bronze holds version
``v``, every change committed after that bronze commit reaches bronze under set ``v`` or a
newer one (docs/source-tables.md, "Adding and removing tables while running").

It is read and written through the process's storage engine (``core.engine``): delta-rs,
or Spark's Delta with ``LAKECDC_WRITER=spark``, where only Spark reaches storage.

``setup`` writes the first version from ``LAKECDC_TABLES``. A lakehouse set up before this
table existed has none; it is then created by the first ``tables add`` or ``remove``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa

from core.engine.api import Engine
from core.errors import UserError
from core.layout import CAPTURE_LIST, path

SNAPSHOTTING, CAPTURED, REMOVED = "snapshotting", "captured", "removed"
SCHEMA = pa.schema([("table_name", pa.string()), ("state", pa.string()),
                    ("changed_at", pa.timestamp("us", tz="UTC"))])
ACK_SUFFIX = ":captured"          # bronze's app transaction ``<slot>:captured`` = set version


@dataclass(frozen=True)
class CaptureSet:
    """One version of the set: table → (state, when it entered that state)."""

    version: int
    states: dict[str, tuple[str, datetime]]

    @property
    def active(self) -> tuple[str, ...]:
        """The tables the shipper asks wal2json for, in the order they were added."""
        return tuple(t for t, (s, _) in self.states.items() if s != REMOVED)

    @property
    def known(self) -> tuple[str, ...]:
        """Every table bronze may hold changes of: the captured and the removed."""
        return tuple(self.states)

    def state(self, table: str) -> str | None:
        entry = self.states.get(table)
        return None if entry is None else entry[0]

    def since(self, table: str) -> datetime:
        return self.states[table][1]


class CaptureList:
    """The ``bronze/_captured`` table of one lakehouse, through ``engine`` (None: delta-rs
    with ``storage_options``, for callers that name no engine)."""

    def __init__(self, lakehouse: str, storage_options: dict | None = None,
                 engine: Engine | None = None) -> None:
        self.uri = path(lakehouse, CAPTURE_LIST)
        self.storage_options = storage_options
        if engine is None:
            from core.engine.delta_rs import DeltaRs

            engine = DeltaRs(storage_options)
        self.engine = engine
        self._read: CaptureSet | None = None          # the newest version read
        self._checked = 0.0

    def exists(self) -> bool:
        return self.engine.exists(self.uri)

    def read(self) -> CaptureSet | None:
        """The newest version (None: no set was stored). The table, once seen, is not looked
        for again (it is never dropped), and a version is read only once: the shipper looks
        once a second. A version without rows is no set: the table's first version, made
        by ``write`` right before the set's own."""
        self._checked = time.monotonic()
        if self._read is None and not self.exists():
            return None
        version = self.engine.version(self.uri)
        if version is None:
            return None
        if self._read is None or self._read.version != version:
            data = self.engine.read(self.uri, version=version)
            self._read = _decode(version, data) if data.num_rows else None
        return self._read

    def read_at_most_every(self, seconds: float, last: CaptureSet | None) -> CaptureSet | None:
        """``read``, unless it read less than ``seconds`` ago (then ``last``): the shipper
        looks once a second, not once a peek."""
        if last is not None and time.monotonic() - self._checked < seconds:
            return last
        return self.read()

    def write(self, states: dict[str, str], previous: CaptureSet | None) -> CaptureSet:
        """Store a new version: ``states`` (table → state) in this order; a table whose
        state is unchanged keeps its time. Concurrent writers are kept apart by the caller's
        lock (``pipelines.setup.capture``)."""
        now = datetime.now(timezone.utc)
        old = previous.states if previous is not None else {}
        rows = {t: (s, old[t][1] if t in old and old[t][0] == s else now)
                for t, s in states.items()}
        data = pa.table({"table_name": list(rows), "state": [s for s, _ in rows.values()],
                         "changed_at": [at for _, at in rows.values()]}, schema=SCHEMA)
        self.engine.create(self.uri, SCHEMA, comment="lakecdc: the captured source tables "
                           "(docs/source-tables.md)")
        self.engine.append(self.uri, data, overwrite=previous is not None)
        self._read = None
        stored = self.read()
        assert stored is not None
        return stored


def known_set(stored: CaptureSet | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """Every table bronze may hold changes of: the stored set's (``CaptureSet.known``), or
    ``default`` (``LAKECDC_TABLES``) in a lakehouse without one."""
    return stored.known if stored is not None else default


def _decode(version: int, data: pa.Table) -> CaptureSet:
    rows = data.to_pylist()
    return CaptureSet(version, {r["table_name"]: (r["state"], r["changed_at"]) for r in rows})


class ShipperSet:
    """The shipper's side: the set it peeks with (read at most once a second), and the
    acknowledgement its next bronze commit records while bronze holds an older one."""

    CHECK_S = 1.0

    def __init__(self, lakehouse: str, slot: str, default: tuple[str, ...],
                 storage_options: dict | None = None, engine: Engine | None = None) -> None:
        self.store = CaptureList(lakehouse, storage_options, engine=engine)
        self.app_id = slot + ACK_SUFFIX
        self.default = default             # ``LAKECDC_TABLES``, for a lakehouse without a set
        self.current: CaptureSet | None = None
        self.acked: int | None = None

    def start(self, acked: int | None) -> None:
        """At (re)connect: the newest set, and the version bronze holds (``acked``)."""
        self.current, self.acked = self.store.read(), acked

    @property
    def left_out(self) -> tuple[str, ...]:
        """Tables ``LAKECDC_TABLES`` names that the stored set does not capture."""
        return tuple(t for t in self.default if t not in self.tables)

    def refuse_left_out(self) -> None:
        """One sentence (exit 2) if ``LAKECDC_TABLES`` names a table the set does not
        capture: the variable and the stored set disagree, and the stored set decides."""
        if self.left_out:
            raise UserError(f"LAKECDC_TABLES names {', '.join(self.left_out)}, which the "
                            "captured set stored in the lakehouse does not hold: capture it "
                            f"with `lakecdc tables add {self.left_out[0]}`, or leave it out "
                            "of LAKECDC_TABLES; nothing was shipped.")

    def refresh(self) -> None:
        self.current = self.store.read_at_most_every(self.CHECK_S, self.current)

    @property
    def tables(self) -> tuple[str, ...]:
        return self.current.active if self.current is not None else self.default

    @property
    def known(self) -> tuple[str, ...]:
        """Every table bronze may hold changes of, as of the set this peek uses: what
        silver's parse knows (``pipelines.setup.capture.known_tables``) when it reads those
        changes, or less (a set only grows)."""
        return known_set(self.current, self.default)

    def ack(self) -> dict[str, int]:
        """The app transaction for the next commit: the set this peek uses, if bronze does
        not hold that version yet (else nothing)."""
        if self.current is None or self.current.version == self.acked:
            return {}
        return {self.app_id: self.current.version}

    def committed(self, ack: dict[str, int]) -> None:
        self.acked = ack.get(self.app_id, self.acked)
