"""The PostgreSQL source's sans-IO parts: no connection, socket, thread or clock; inputs in,
decisions out (issue 44). ``pgoutput.py`` decodes the replication messages; ``values.py``
turns text forms into values and Arrow types; ``names.py`` quotes names; ``chunks.py`` plans
snapshot chunks; ``watermarks.py`` merges a watermarked chunk read and filters the stream
(its rules), ``rows.py`` the values those rules speak of (a decoded transaction, a snapshot's
visibility, the output rows); ``splits.py`` holds the splits, the readers' requests and
reports, and table shapes; ``decoding.py`` turns a table's rows from text forms into values;
``output.py`` is the Arrow shape of what the source emits."""
