"""The optional parts of lakecdc, each an extra of the package, and the one sentence that
names it.

``pip install lakecdc`` brings what shipping, pushing and watching need: delta-rs, psycopg,
pyarrow, numpy, click and the Prometheus client. The rest is an extra, required where it is
used (``require``), so a command without its extra ends in one sentence naming it (exit 2)
before any of its imports:

| extra     | brings                             | for                                        |
|-----------|------------------------------------|--------------------------------------------|
| ``spark`` | pyspark, delta-spark, pandas       | every command that runs Spark              |
| ``quality`` | great-expectations, pandas       | ``lakecdc quality`` (the gates)            |
| ``s3``    | boto3                              | an ``s3://`` lakehouse's writability check |
| ``demo``  | matplotlib                         | ``lakecdc demo``'s picture                 |

A Databricks runtime brings pyspark, delta-spark, pandas, boto3 and matplotlib itself.
"""

from __future__ import annotations

from importlib.util import find_spec

from core.errors import UserError

# extra -> (the modules it provides, what needs it)
EXTRAS = {
    "spark": (("pyspark", "delta"), "this command runs Spark"),
    "quality": (("great_expectations",), "the quality gates run Great Expectations"),
    "s3": (("boto3",), "an s3:// lakehouse is checked with boto3"),
    "demo": (("matplotlib",), "the demo draws its picture with matplotlib"),
}


def missing(extra: str) -> str:
    """The sentence for ``extra`` not installed."""
    return (f"{EXTRAS[extra][1]}, which is not installed here: install it with "
            f"pip install 'lakecdc[{extra}]' (a Databricks runtime brings its own).")


def require(extra: str) -> None:
    """``UserError`` with ``missing(extra)`` unless every module of ``extra`` imports."""
    if any(find_spec(module) is None for module in EXTRAS[extra][0]):
        raise UserError(missing(extra))
