"""The lake sink's table formats: a package per format, each implementing
:class:`~sparkcoord.sinks.tables.TableCommitter` for its tables (issue 44, decision 101).

Rules:
  1. A format imports, of the sink, only the modules below the formats (``changes.py``,
     ``fencing.py``, ``files.py``, ``mergefiles.py``, ``mergefold.py``, ``tables.py``) and
     never another format; of the sink's other modules only ``target.py``, which picks a
     format, imports one (and the old paths ``sinks/delta.py``, ``iceberg.py``,
     ``icebergmerge.py``, which are aliases of the moved modules). No import circle joins a
     format and the sink (``tests/test_layering.py`` checks both).
  2. A format's library (the ``lake`` extra: deltalake, pyiceberg) is imported only when its
     committer is: this package and each format's ``__init__`` import nothing.
  3. In a format, ``commit.py`` holds the committer: its rules, the append path, the fence
     and the queries. Its merge by key is ``merge.py``: a class of the committer's merge
     methods that the committer is made of, so ``commit.py`` imports ``merge.py`` and never
     the reverse; what both use lives in a third module (Delta's ``actions.py``, Iceberg's
     ``names.py`` and ``rewrite.py``).

Thread model: as the committers': the sink coordinator's commit worker thread.
"""
