"""The Delta format (delta-rs): the committer and its append path (``commit.py``), its merge by
key (``merge.py``), and the add actions and log entries both write (``actions.py``).
Imports nothing: deltalake is loaded only with the committer (``formats/__init__.py`` rule 2)."""
