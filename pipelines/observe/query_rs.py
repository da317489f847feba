"""``lakecdc sql`` on delta-rs's DataFusion (``pipelines.observe.query``'s first engine): no
JVM. Each table the query names is registered at its latest version; what DataFusion
cannot answer is ``NeedsSpark``, with the reason, and ``lakecdc sql`` turns to Spark
(``pipelines.observe.query.run_query``): the one place that chooses is the command
(``pipelines.cli.observe``).
"""

from __future__ import annotations

import re

import pyarrow as pa

from core.errors import UserError, first_line
from core.layout import mirror_path, mirror_view_name
from pipelines.observe.query import TABLES, NeedsSpark, as_subquery

_MISSING_TABLE = re.compile(r"table '(?:[\w]+\.)*(\w+)' not found")


def run_query_rs(config, query: str, limit: int) -> pa.Table:
    """(delta-rs: DataFusion, no JVM) At most ``limit`` rows of ``query`` over the tables it
    names; ``NeedsSpark`` where only Spark can answer it (the module's text), ``UserError``
    for a table that does not exist."""
    from deltalake import DeltaTable, QueryBuilder
    from deltalake.exceptions import DeltaError

    from core.storage import Lakehouse
    from silver.mirrors.tail import tail_path

    if config.registers:
        raise NeedsSpark("the tables are read by their catalog names (LAKECDC_CATALOG)")
    if config.spark_writes:
        raise NeedsSpark("only Spark reaches the lakehouse (LAKECDC_WRITER=spark)")
    options = Lakehouse.from_config(config).delta_rs_options()
    builder = QueryBuilder()
    paths = _paths(config, options)
    words = set(re.findall(r"\w+", query.lower()))           # the tables the query names
    for name, path in ((n, p) for n, p in paths.items() if n in words):
        if not DeltaTable.is_deltatable(path, storage_options=options):
            continue
        tail = tail_path(path)
        if name not in TABLES and DeltaTable.is_deltatable(tail, storage_options=options) \
                and DeltaTable(tail, storage_options=options).file_uris():
            raise NeedsSpark(f"{name} has changes waiting in its tail, which only Spark lays "
                             "over its table in SQL here")
        builder.register(name, DeltaTable(path, storage_options=options))
    try:
        # Planned as a subquery first, which only a query can be (DataFusion runs COPY ...
        # TO and CREATE TABLE too); then run as written: DataFusion drops a subquery's
        # ORDER BY.
        builder.execute(as_subquery(query))
        reader = pa.RecordBatchReader.from_stream(builder.execute(query.strip().rstrip(";")))
        batches, rows = [], 0
        for batch in reader:                    # the first ``limit`` rows only
            if rows >= limit:
                break
            batches.append(batch.slice(0, limit - rows))
            rows += batches[-1].num_rows
        return pa.Table.from_batches(batches, reader.schema)
    except DeltaError as exc:
        missing = _MISSING_TABLE.search(str(exc))
        if missing:
            raise UserError(f"the query failed: no table {missing.group(1)} "
                            f"(tables: {', '.join(paths)}).") from None
        raise NeedsSpark(f"delta-rs's SQL engine cannot run it ({first_line(exc)})") from None


def _paths(config, options: dict | None) -> dict[str, str]:
    """Every name a query may use, with its table's path for delta-rs: the layers', and
    each known table's mirror's."""
    from core.engine.delta_rs import DeltaRs
    from pipelines.setup.capture import known_tables

    return {**{name: config.table_path(where) for name, where in TABLES.items()},
            **{mirror_view_name(t): mirror_path(config.lakehouse, t)
               for t in known_tables(config, options, engine=DeltaRs(options))()}}
