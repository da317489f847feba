"""``lakecdc demo`` (``run_demo``), its Notify-like traffic and freshness probe (``traffic``,
also the benchmark's) and its picture (``plot``)."""
