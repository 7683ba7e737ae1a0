"""The file source: files under any fsspec URL (local, S3, ...) read as parquet, CSV or JSON lines.

Rules:
  1. Splits: a parquet file has one split per row group; a CSV or JSON-lines file has byte
     ranges of at most ``maxSplitBytes``, and a line belongs to the range that holds its first
     byte (a reader skips the partial line at its start and reads past its end to finish the
     last line). CSV values must not contain line breaks.
  2. Discovery runs in one of two modes (option ``discoveryMode``):
     a. ``listing`` (the default; any file names): every cycle lists everything, as Spark's
        file source does, but off the trigger path and without a stat of names already seen;
        a file is new if it is not in the *seen* set. Like Spark's source, files older than
        ``maxFileAge`` (default 7 days) before the newest file seen are ignored, and the seen
        set keeps only files within that age: the state grows with the files of the last
        ``maxFileAge``.
     b. ``lexical`` (names of new files sort after older ones: timestamps, sequence numbers,
        date partitions): the state is the *marker* (the greatest path handed out) and a
        *recent* set (files handed out since the last backfill, with size and modification
        time). A cycle lists only what sorts after the marker (on S3 with ``StartAfter``;
        locally it skips the stat of every older name; in nested directories it does not
        descend into a directory that sorts wholly before the marker). A periodic *backfill*
        lists everything and picks up a file that arrived with a name before the marker, if
        its modification time is newer than the previous backfill (minus ``maxClockSkew``):
        a file moved in with an older modification time and a name before the marker is not
        seen. After a backfill the recent set keeps only files at least that new, so the state
        grows with the files of one backfill interval, never with every file ever seen.
  3. A file whose size or modification time changed after it was discovered is reported:
     discovery logs it and counts it (``status``), and a reader refuses to read it
     (:class:`FileChangedError`, naming the file and both sizes): a rewritten parquet file
     or a truncated text file cannot be read as the split that was planned.
  4. Names starting with ``_`` or ``.`` are skipped (files and directories), as Spark does.
  5. ``maxFilesPerDiscovery`` caps what one cycle of a continuous source takes; the rest is
     taken by the next cycles (and logged). A bounded source lists once, so it has no cap:
     its one listing takes every file present (docs/protocol.md [bounded-run-reads-everything]).
  6. Reading: CSV and JSON lines go through :class:`~sparkcoord.sources.files.parsing.RecordParser`
     with the source's ``mode`` (a malformed record becomes a row of nulls, is dropped, or is
     a :class:`MalformedRecord` naming the file, line and byte offset). Every other failure to
     read a split is a :class:`FileReadError` naming the file and the row group or byte range.
     A zero-byte file has no split (it gives no rows, as in Spark).
  7. With ``includeMetadata`` the rows carry Spark's file metadata as a last column
     ``_metadata`` (:func:`~.metadata.metadata_field`): the file's URL (as Spark writes it, without
     credentials), name, size and modification time as discovered, the split's byte range
     (a parquet row group: the bytes of its column chunks) and the row group (null for text).
     Every row of a split has the same value; it is outside what the files are parsed with.
     A packed split's rows (rule 8) carry each their own file's value.
  8. Packing: the CSV and JSON-lines files a discovery cycle found that are one split each
     (at most ``maxSplitBytes``) are packed, consecutive in the cycle's order and from one
     directory (one alignment lane), into splits of up to ``maxPartitionBytes`` where each
     file costs at least ``openCostInBytes`` (Spark's options), and no more than
     ``maxFilesPerTrigger`` files. As Spark's, the budget shrinks to the cycle's bytes over
     the readers (``parallelism``, here times 16 splits each) when that is less, so a few
     new files are not packed. Not with watermark alignment. A packed split
     (``FileSplit.files``) is read member by member, each checked and named as a file of its
     own (rules 3, 6, 7); its position is (member, rows of it read); on a remote filesystem
     the next members are fetched ahead (:class:`~.packed.MemberFetcher`). Parquet files are
     not packed.

Where each part runs (the rule numbers above are the ones the modules cite):
  - :mod:`.options`: the options, parsed and checked in the user's driver program thread when
    :class:`~sparkcoord.sources.files.stream.FileStream` builds the source; the parsed
    :class:`FileSourceOptions` then travel, pickled with the enumerator and the reader, to
    the other two processes.
  - :mod:`.schema`: the schema inferred from the first file (driver program thread, when the
    source is built without one).
  - :mod:`.listing`: the filesystem of a URL (one instance per process) and the
    :class:`~.listing.Lister`; used by discovery, by schema inference and (the filesystem)
    by the reader.
  - :mod:`.discovery`: :class:`FileDiscovery` and the planning of splits (rules 1, 2, 4, 5,
    8): in Spark's Python source runner process on the driver host, on the enumerator's
    discovery thread.
  - :mod:`.split`: :class:`FileSplit`, what discovery hands a reader (through the enumerator
    and the request log).
  - :mod:`.reading`: :class:`FileReader` (rules 1, 3, 6, 7, 8): in Spark's Python workers on
    the executors, on the task's thread; with :mod:`.lines`, a text split's lines by byte
    range (rule 1; also the schema inference's first lines), and :mod:`.packed`, a packed
    split's members (rule 8) fetched ahead on threads of its :class:`~.packed.MemberFetcher`,
    counted and joined.
  - :mod:`.metadata`: rule 7's ``_metadata`` column: its type (driver program and task),
    its values (task).

Pickles: :class:`FileSplit` and :class:`FileDiscoveryState` are pickled into checkpoints
(enumerator and reader state, stored-once backlog chunks, which are named by a hash of their
bytes) and into the request log, whose entries a replay compares with what it re-sends
(docs/protocol.md [pickles-stay-byte-stable]); both are encoded by name
(``core/encoding.py``).
They were defined in the module ``sparkcoord.sources.files`` before it became this package,
and pickles of sparkcoord 0.1.0 name them by that path: their ``__module__`` is set to this
package, which exports them, so those pickles load.
"""

from __future__ import annotations

from sparkcoord.sources.files.discovery import FileDiscovery, FileDiscoveryState
from sparkcoord.sources.files.options import FileSourceOptions
from sparkcoord.sources.files.reading import FileChangedError, FileReader, FileReadError
from sparkcoord.sources.files.split import FileSplit

__all__ = ["FileChangedError", "FileDiscovery", "FileDiscoveryState", "FileReadError",
           "FileReader", "FileSourceOptions", "FileSplit"]
