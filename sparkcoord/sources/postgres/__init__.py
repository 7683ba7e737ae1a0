"""PostgreSQL change data capture (issue 27): ``PostgresCDC(job).option("tables", ...).load(url)``
gives a streaming DataFrame of the tables' changes (docs/cdc.md).

- ``core/`` (sans-IO: no connection, socket, thread or clock; a test checks it):
  ``pgoutput.py``, the decoder of pgoutput's messages (protocol version 1); ``values.py``,
  column values from their text form, and their Arrow types; ``names.py``, table, slot and
  publication names, and quoting; ``chunks.py``, the snapshot chunk planner (one chunk at a
  time, a frontier only); ``watermarks.py``, the snapshot-to-stream core (the watermarked
  chunk read's merge, the stream filter, the compact high-watermark map); ``rows.py``, the
  values it speaks of (a decoded transaction, a snapshot's visibility, the output rows);
  ``splits.py``, the chunk and stream splits, the readers' requests and reports, table
  shapes.
- ``io/``: ``connection.py``, where to connect and as whom (passwords never shown, logged or
  pickled); ``replication.py``, the slot and the publication over SQL functions (peek,
  advance); ``catalog.py``, a table's columns and key, chunk boundaries and chunk reads.
- The old paths (``sources/postgres/pgoutput.py``, ..., ``catalog.py``) are aliases of the
  moved modules (the same module object), for imports and pickles of earlier versions.
- ``enumerator.py``: the coordinator: chunk planning off the mailbox, the hand-over to the
  stream, the slot confirmed after the batch commits.
- ``reader.py``: the executor side: watermarked chunk reads, the stream, Arrow record batches.
- ``stream.py``: the builder, :class:`PostgresCDC`: options, the tables' shapes read in the
  driver program, the coordinated operator.
- ``command.py``: ``sparkcoord cdc``. These two are the modules that reach the Spark adapter.

Nothing here imports pyspark at a module's top (stream.py does inside its functions); psycopg
(the ``postgres`` extra) is imported by the I/O modules only (io/connection.py and reader.py
lazily, io/replication.py at its top).
"""

from __future__ import annotations

from sparkcoord.sources.postgres.stream import PostgresCDC

__all__ = ["PostgresCDC"]
