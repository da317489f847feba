"""``make test``'s first Spark start (``python -m tests.jvm_warmup ARCHIVE``).

It resolves the Delta jars into the Ivy cache before the workers start theirs (recording
them, ``core.spark_jars``: the suite's JVMs do not resolve them again), and, run
with ``SPARK_SUBMIT_OPTS=-XX:ArchiveClassesAtExit=ARCHIVE``, leaves a class data-sharing
archive of the classes a lakecdc JVM loads (Spark, Delta: a write, a MERGE, a read). Every
Spark JVM of the suite then maps it instead of loading and verifying those classes again
(``-XX:SharedArchiveFile``, see the Makefile): the suite starts one JVM per CLI test.

The JVM writes the archive as it exits, which it does when its stdin closes; this waits
for that, so the archive is complete before the first test starts.
"""

from __future__ import annotations

import sys
import tempfile


def main() -> None:
    from delta.tables import DeltaTable

    from core.spark import get_or_create

    spark = get_or_create("lakecdc-warmup")
    with tempfile.TemporaryDirectory() as scratch:
        path = f"{scratch}/t"
        spark.range(5).write.format("delta").save(path)
        (DeltaTable.forPath(spark, path).alias("t")
         .merge(spark.range(3, 8).alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        rows = spark.read.format("delta").load(path).count()
    gateway = spark.sparkContext._gateway
    spark.stop()
    jvm = gateway.proc
    gateway.shutdown()
    jvm.stdin.close()
    jvm.wait(timeout=600)
    print(f"Spark warmed up ({rows} rows through Delta); JVM exited {jvm.returncode}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
