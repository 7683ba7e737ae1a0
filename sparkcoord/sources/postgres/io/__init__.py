"""The PostgreSQL source's I/O: ``connection.py`` (where to connect and as whom; passwords
never shown, logged or pickled), ``replication.py`` (the slot read by peek and confirmed by
advance over SQL functions), ``set_up.py`` (the slot and the publication made sure of),
``slot_watch.py`` (a slot's creation watched), ``catalog.py`` (a table's columns and key, chunk
boundaries and chunk reads), the reader's reads (``chunk_read.py``, ``stream_read.py``, what
they wait for ``waits.py``, keys in the server's order ``key_order.py``, their configuration
``reader_config.py``) and the enumerator's (``enumeration.py``). psycopg (the ``postgres``
extra) is imported here only."""
