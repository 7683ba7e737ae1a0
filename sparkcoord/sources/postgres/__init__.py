"""PostgreSQL change data capture (issue 27): ``PostgresCDC(job).option("tables", ...).load(url)``
gives a streaming DataFrame of the tables' changes (docs/cdc.md).

- ``pgoutput.py``: the sans-IO decoder of pgoutput's messages (protocol version 1).
- ``values.py``: column values from their text form, and their Arrow types.
- ``names.py``: table, slot and publication names, and quoting.
- ``chunks.py``: the sans-IO snapshot chunk planner (one chunk at a time, a frontier only).
- ``connection.py``: where to connect and as whom; passwords never shown, logged or pickled.
- ``replication.py``: the slot and the publication over SQL functions (peek, advance).
- ``catalog.py``: a table's columns and key, chunk boundaries and chunk reads.
- ``watermarks.py``: the sans-IO snapshot-to-stream core: the watermarked chunk read's merge,
  the stream filter, the compact high-watermark map.
- ``splits.py``: the chunk and stream splits, the readers' requests and reports, table shapes.
- ``enumerator.py``: the coordinator: chunk planning off the mailbox, the hand-over to the
  stream, the slot confirmed after the batch commits.
- ``reader.py``: the executor side: watermarked chunk reads, the stream, Arrow record batches.
- ``stream.py``: the builder, :class:`PostgresCDC`: options, the tables' shapes read in the
  driver program, the coordinated operator.
- ``command.py``: ``sparkcoord cdc``. These two are the modules that reach the Spark adapter.

Nothing here imports pyspark at a module's top (stream.py does inside its functions); psycopg
(the ``postgres`` extra) is imported by the I/O modules only (connection.py and reader.py
lazily, replication.py at its top).
"""

from __future__ import annotations

from sparkcoord.sources.postgres.stream import PostgresCDC

__all__ = ["PostgresCDC"]
