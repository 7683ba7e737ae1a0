"""The Iceberg format (pyiceberg): the committer and its append path (``commit.py``), its merge
by key (``merge.py``) and that merge's copy-on-write pieces (``rewrite.py``), and the names
the sink gives in a table (``names.py``). Imports nothing: pyiceberg is loaded only with the
committer (``formats/__init__.py`` rule 2)."""
