"""The one place that picks the storage engine (``core.engine``), from the configuration."""

from __future__ import annotations

from core.engine.api import Engine


def engine_for(config, spark=None) -> Engine:
    """The engine ``config`` asks for (``LAKECDC_WRITER``): Spark's Delta in a session of
    its own made from ``spark`` (started here when None), else delta-rs, and no JVM."""
    if not config.spark_writes:
        from core.engine.delta_rs import DeltaRs
        from core.storage import Lakehouse

        return DeltaRs(Lakehouse.from_config(config).delta_rs_options())
    from core.engine.spark_delta import SparkDelta

    if spark is None:
        from core.spark import get_or_create
        from core.storage import Lakehouse

        spark = get_or_create(lakehouse=Lakehouse.from_config(config),
                              master=config.spark_master)
    return SparkDelta(spark)


def start_engine(config, spark_factory=None) -> Engine:
    """``engine_for`` where the session, when one is needed, comes from ``spark_factory()``
    (None: ``core.spark``'s for the lakehouse): no JVM starts on delta-rs."""
    if not config.spark_writes or spark_factory is None:
        return engine_for(config)
    return engine_for(config, spark_factory())
