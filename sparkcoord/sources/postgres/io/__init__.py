"""The PostgreSQL source's I/O: ``connection.py`` (where to connect and as whom; passwords
never shown, logged or pickled), ``replication.py`` (the slot and the publication over SQL
functions: peek, advance) and ``catalog.py`` (a table's columns and key, chunk boundaries and
chunk reads). psycopg (the ``postgres`` extra) is imported here and by the reader only."""
