"""lakecdc's tables registered by name, ``<catalog>.<schema>.<name>`` (``LAKECDC_CATALOG``,
``LAKECDC_SCHEMA``; ``core.catalog_names`` registers one name). Only when both are set: without
them nothing here runs, and ``setup`` starts no JVM.

The names are the ones ``lakecdc sql`` and the notebooks already use (``core.layout``), so
the ``sql/`` files run unchanged on the catalog:

| name                        | table                              | registered by |
|-----------------------------|------------------------------------|---------------|
| ``bronze_wal2json_changes`` | ``bronze/wal2json_changes``        | ``setup``     |
| ``silver_changes``          | ``silver/changes``                 | ``setup``     |
| ``silver_quarantine``       | ``silver/quarantine``              | ``setup``     |
| ``gold_service_stats``      | ``gold/service_stats``             | ``setup``     |
| ``silver_<schema>_<table>`` | ``silver/tables/<schema>/<table>`` | ``setup``, ``tables add`` |

A mirror's name is registered by ``setup`` for the mirrored tables it starts with, and by
``tables add`` for each table it adds.

A name can only point at a table that exists, and the stream creates silver, quarantine and
gold at its first start, the mirrors' query each mirror at its first change. So ``setup``
creates them first, empty, with the very functions the stream and the mirrors' query use
(both then find them there and go on as with their own), and ``tables add`` creates the
new table's mirror before its rows are read. Every name is checked before ``setup`` or
``tables add`` changes anything, so a refused name leaves all as it was.
"""

from __future__ import annotations

from core.catalog_names import Catalog, require_persistent
from core.config import Config
from core.errors import UserError
from core.layout import (
    GOLD,
    GOLD_DELTAS,
    GOLD_PENDING,
    QUARANTINE,
    QUERYABLE,
    SILVER,
    mirror_path,
    mirror_view_name,
    view_name,
)
from core.postgres import connect
from core.storage import on_databricks, spark_path


def _spark_path(path: str) -> str:
    return spark_path(path, on_databricks())


def lakehouse_names(config: Config) -> dict[str, str]:
    """Name → Spark path of the tables ``setup`` registers, mirrors aside."""
    return {view_name(t): _spark_path(config.table_path(t)) for t in QUERYABLE}


def mirror_names(config: Config, tables) -> dict[str, str]:
    """Name → Spark path of the mirrors of ``tables`` (those ``LAKECDC_MIRRORS`` keeps)."""
    return {mirror_view_name(t): _spark_path(mirror_path(config.lakehouse, t))
            for t in tables if config.mirrors is None or t in config.mirrors}


def names_session(config: Config, spark_factory, tables, command: str):
    """The Spark session that registers names for ``command`` (``setup``, ``tables add``),
    its names checked (``check_names``) before the command changes anything; None when
    ``config.registers`` is off, so no JVM starts."""
    if not config.registers:
        return None
    if spark_factory is None:
        raise UserError(f"registering the tables by name (LAKECDC_CATALOG) needs Spark: run "
                        f"`lakecdc {command}`, which starts it.")
    spark = spark_factory()
    check_names(spark, config, tables)
    return spark


def check_names(spark, config: Config, tables) -> Catalog:
    """Before anything changes: a session that keeps names, the schema, and every name
    free or pointing at its table already (``Catalog.check``: one sentence otherwise)."""
    require_persistent(spark)
    catalog = Catalog.from_config(spark, config)
    catalog.require_schema()
    for name, path in {**lakehouse_names(config), **mirror_names(config, tables)}.items():
        catalog.check(name, path)
    return catalog


def register_lakehouse(spark, config: Config, tables) -> list[str]:
    """``setup``'s part: silver, quarantine, gold (with ``_pending`` and ``_deltas``) and the
    mirrors of ``tables`` created where absent, then every name registered. Idempotent.
    Returns a line per name registered now, or one saying all were there."""
    from gold.gold_tables import GoldPaths
    from gold.start import prepare_gold
    from silver.writer import ensure_silver_tables

    catalog = check_names(spark, config, tables)
    ensure_silver_tables(spark, _spark_path(config.table_path(SILVER)),
                         _spark_path(config.table_path(QUARANTINE)))
    prepare_gold(spark, GoldPaths(*(_spark_path(config.table_path(t))
                                    for t in (GOLD, GOLD_PENDING, GOLD_DELTAS))))
    names = {**lakehouse_names(config), **_create_mirrors(spark, config, tables)}
    done = [_line(catalog, name, path) for name, path in names.items()
            if catalog.register(name, path)]
    return done or [f"tables already registered in {config.catalog}.{config.catalog_schema} "
                    f"({', '.join(names)})"]


def register_mirror(spark, config: Config, table: str) -> str | None:
    """``tables add``'s part: ``table``'s mirror created if absent and registered; the line
    to print (None: the table is not mirrored, or has no key to keep a mirror by)."""
    catalog = Catalog.from_config(spark, config)
    names = _create_mirrors(spark, config, (table,))
    for name, path in names.items():
        return (_line(catalog, name, path) if catalog.register(name, path) else
                f"its mirror is {config.catalog}.{config.catalog_schema}.{name}")
    return None


def _create_mirrors(spark, config: Config, tables) -> dict[str, str]:
    """Create the mirror of each of ``tables`` that is mirrored, has a key and has no mirror
    yet, as the mirrors' query would (columns and key from the source's catalog); returns
    name → Spark path of the mirrors there now."""
    from delta.tables import DeltaTable

    from pipelines.source.mirror_specs import table_specs
    from silver.mirrors.typed_rows import create_mirror

    wanted = [t for t in tables if config.mirrors is None or t in config.mirrors]
    if not wanted:
        return {}
    with connect(config.require_source(), what="source") as conn:
        specs = [s for s in table_specs(conn, tuple(wanted)) if s.key]
    paths = {}
    for spec in specs:
        path = _spark_path(mirror_path(config.lakehouse, spec.name))
        if not DeltaTable.isDeltaTable(spark, path):
            create_mirror(spark, path, spec, config.kept_minutes("mirrors"))
        paths[mirror_view_name(spec.name)] = path
    return paths


def _line(catalog: Catalog, name: str, path: str) -> str:
    return f"registered {catalog.catalog}.{catalog.schema}.{name} at {path}"
