"""slot → bronze: the JVM-free shipper (psycopg 3 + pyarrow + deltalake).

``slot`` reads the replication slot, ``records`` turns peek rows into bronze records,
``buffer`` bounds memory, ``table`` is the bronze Delta table and its progress, ``ship`` is
the delivery rule and the loop, ``source`` checks and prepares the source database.
"""
