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
  shapes; ``decoding.py``, a table's rows from their text forms to values (and the shape
  check); ``output.py``, the Arrow schema of what the source emits and its record batches.
- ``io/``: ``connection.py``, where to connect and as whom (passwords never shown, logged or
  pickled); ``replication.py``, the slot read by peek and confirmed by advance over SQL
  functions; ``set_up.py``, the slot and the publication made sure of; ``slot_watch.py``, a
  slot's creation watched; ``catalog.py``, a table's columns and key, chunk boundaries and
  chunk reads; the reader's I/O: ``chunk_read.py`` (a chunk read with watermarks),
  ``stream_read.py`` (a batch's stream read), ``waits.py`` (the flushed WAL, a busy slot),
  ``key_order.py`` (keys in the server's order), ``reader_config.py``; the enumerator's I/O,
  ``enumeration.py``.
- The old paths (``sources/postgres/pgoutput.py``, ..., ``catalog.py``) are aliases of the
  moved modules (the same module object), for imports and pickles of earlier versions.
- ``enumerator.py``: the coordinator: chunk planning off the mailbox, the hand-over to the
  stream, the slot confirmed after the batch commits.
- ``reader.py``: the executor side, a split reader: a chunk read by one batch and emitted by
  the next, the stream read on from its position each batch (its reads in ``io/``).
- ``stream.py``: the builder, :class:`PostgresCDC`: options, the tables' shapes read in the
  driver program, the coordinated operator.
- ``command.py``: ``sparkcoord cdc``. These two are the modules that reach the Spark adapter.

Nothing here imports pyspark at a module's top (stream.py does inside its functions); psycopg
(the ``postgres`` extra) is imported by the I/O modules only (io/connection.py and the reader's
reads lazily, io/replication.py, io/set_up.py and io/slot_watch.py at their top).
"""

from __future__ import annotations

from sparkcoord.sources.postgres.stream import PostgresCDC

__all__ = ["PostgresCDC"]
