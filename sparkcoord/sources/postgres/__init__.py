"""PostgreSQL change data capture (issue 27): its layers without Spark.

- ``pgoutput.py``: the sans-IO decoder of pgoutput's messages (protocol version 1).
- ``values.py``: column values from their text form, and their Arrow types.
- ``names.py``: table, slot and publication names, and quoting.
- ``chunks.py``: the sans-IO snapshot chunk planner (one chunk at a time, a frontier only).
- ``connection.py``: where to connect and as whom; passwords never shown, logged or pickled.
- ``replication.py``: the slot and the publication over SQL functions (peek, advance).
- ``catalog.py``: a table's columns and key, chunk boundaries and chunk reads.

Nothing here imports pyspark; psycopg (the ``postgres`` extra) is imported by the I/O modules
only (connection.py lazily, replication.py at its top).
"""
