"""The typed current-state mirrors of the captured tables, one Delta table per captured
table (docs/silver.md, "Mirrors"), module by module:

- ``mirror_writer``: the mirrors' ``foreachBatch`` writer (``MirrorWriter``): each table's
  changes netted, typed and MERGEd, per micro-batch of silver;
- ``net_changes``: a batch's changes per table, netted to one row per key, in Arrow;
- ``typed_rows``: a mirror's Spark schema and creation, and the netted rows typed as its
  columns for the MERGE (by Arrow where it can, else by Spark);
- ``mirror_types``: Postgres types as Spark types, and a value's text typed by Spark;
- ``type_map``: the type map without Spark (a Postgres type to the kind of its column);
- ``arrow_types``: a column's text typed by Arrow where its cast reads it as Spark's does;
- ``mirror_table``: what a mirror table is (its spec, columns, properties, app ids);
- ``merge``: the MERGE, written once for every engine (its clauses, jobs, app ids);
- ``store``: the one place that chooses the mirrors' store by engine (``mirror_store``);
- ``store_rs``: the store through delta-rs, with a big mirror's tail drained in the
  background;
- ``store_spark``: the store through Spark, and Spark's reads of a mirror with its tail;
- ``tail``: a big mirror's tail of MERGE source rows, and a mirror's current rows over it;
- ``chunk_load``: a table's current rows read by key-range chunks with ``COPY``, parsed to
  the mirror's types.
"""
