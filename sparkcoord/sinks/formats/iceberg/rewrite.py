"""Mode ``merge`` on Iceberg by copy-on-write of our own: one overwrite snapshot per epoch that
rewrites only the files that may hold a changed key, folds small files in, and expires the
sink's old snapshots (issue 43 finding 4).

pyiceberg's delete + upsert (what ``IcebergCommitter.merge`` did before) reads every data file
of the table to find the keys, rewrites the files of the deleted keys, and makes up to four
snapshots per epoch whose manifests every later epoch reads again: a merge of 40 keys grew
from 0.49 s to 4.15 s within 40 epochs. Here, as ``formats/delta/commit.py`` rule 4 does for
Delta (this module was ``sinks/icebergmerge.py``, which stays as its alias):

Rules:
  1. Candidates: of the current snapshot's live data files, the ones whose key bounds (their
     manifest entries' lower/upper bounds) may hold a changed key (``mergefiles.
     files_to_rewrite``); every file after a truncate. Bounds are trusted as Iceberg writers
     keep them: integers, dates, booleans and timestamps exact; a string's upper bound only
     when shorter than :data:`TRUNCATED_CHARS` (pyiceberg and Java truncate longer ones to a
     prefix by default); any other type, or a bound missing, reads the file. Manifest
     entries are read once per manifest (they never change; :class:`ManifestCache`).
  2. Each candidate is read (pyiceberg's ``ArrowScan``: field ids, the name mapping) and,
     if any of its rows holds a changed key, removed and rewritten without those rows; the
     rows taken out give the stored values of ``changes.py`` rule 3 (:func:`fill_unchanged`);
     a candidate none of whose rows holds a changed key stays as it is. After a truncate no
     candidate is read: all are removed.
  3. Small files are folded in (``mergefold.py``): read whole (rule 2's reader) and written
     with the epoch's output, removed in the same snapshot; their rows are kept exactly.
  4. The output (kept rows, folded rows, rows put) is sorted by key (narrow bounds: later
     epochs read fewer candidates) and written by pyiceberg's writer under merge names
     (``mergefiles.py`` rule 2: :func:`names.with_merge_names`), then committed as one
     overwrite snapshot (a fast append when nothing is removed) with the epoch's summary and
     properties (``commit.py`` rule 1): the fence is as before. The overwrite
     (:func:`overwrite`) lists the manifest of the entries it deletes, as Iceberg's do, but
     leaves out the parent's manifests that hold no live file (an earlier overwrite's
     deleted entries; pyiceberg's own overwrite carries them on for good: one more manifest
     for every later epoch to read, measured growing by one per epoch).
  5. Not on a snapshot with live delete files (another writer's merge-on-read): a rewrite of
     the raw data files would bring the deleted rows back; such an epoch takes pyiceberg's
     delete + upsert, which applies them (:func:`has_delete_files`).
  6. Snapshot expiry (:func:`snapshots_to_expire`), in the epoch's own transaction: of the
     snapshots the job made (its id in their summary; another writer's are its own), those
     older than the table's ``history.expire.max-snapshot-age-ms`` beyond the
     newest ``history.expire.min-snapshots-to-keep`` (Iceberg's own property names; the
     sink's defaults, when the table sets neither: :data:`KEEP_SNAPSHOTS` snapshots and no
     age), never a branch's or tag's head. The fence does not need them: the epoch and run
     are table properties (``commit.py`` rule 1), which expiry leaves. Once the
     transaction landed, the merge files of this job that the expired snapshots referenced
     and no live snapshot does are deleted (``cleanup.py`` rule 1: ours only; other writers'
     unreferenced files are their orphan removal's); a kill before that leaves them to the
     next start's sweep, which keeps what a live snapshot references (``cleanup.py`` rule 3).

Thread model: the commit worker thread (``IcebergCommitter.merge``, in ``merge.py``);
:func:`snapshots_to_expire` and :func:`trusted_range` are pure.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkcoord.sinks.mergefiles import KeyRange

#: A string bound at least this long may be a truncated prefix (rule 1): Iceberg's default
#: metrics mode is ``truncate(16)``.
TRUNCATED_CHARS = 16
#: Rule 6: snapshots kept when the table sets neither expiry property.
KEEP_SNAPSHOTS = 10
MAX_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_KEEP_PROPERTY = "history.expire.min-snapshots-to-keep"


@dataclass(frozen=True, slots=True)
class LiveFile:
    """A live data file of the current snapshot: pyiceberg's ``DataFile`` and its key range."""

    data_file: Any
    range: KeyRange


class ManifestCache:
    """Manifest entries by manifest path (rule 1: a manifest never changes once written), for
    one committer on the commit worker thread; :meth:`retain` drops the manifests no live
    snapshot lists."""

    def __init__(self) -> None:
        self._entries: dict[str, list[Any]] = {}
        self._lists: dict[str, list[Any]] = {}

    def manifests(self, snapshot: Any, io: Any) -> list[Any]:
        """``snapshot``'s manifests (its manifest list never changes either)."""
        path = str(snapshot.manifest_list)
        got = self._lists.get(path)
        if got is None:
            got = self._lists[path] = list(snapshot.manifests(io=io))
        return got

    def entries(self, manifest: Any, io: Any) -> list[Any]:
        """Every entry of ``manifest`` (deleted ones too; callers filter by status)."""
        path = str(manifest.manifest_path)
        got = self._entries.get(path)
        if got is None:
            got = self._entries[path] = manifest.fetch_manifest_entry(io=io,
                                                                       discard_deleted=False)
        return got

    def retain(self, paths: Iterable[str], lists: Iterable[str]) -> None:
        """Forget every manifest not in ``paths`` and manifest list not in ``lists``."""
        keep, kept_lists = set(paths), set(lists)
        for path in [p for p in self._entries if p not in keep]:
            del self._entries[path]
        for path in [p for p in self._lists if p not in kept_lists]:
            del self._lists[path]


def has_delete_files(snapshot: Any, io: Any, cache: ManifestCache) -> bool:
    """Whether ``snapshot`` has live delete files (rule 5)."""
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    return any(e.status != ManifestEntryStatus.DELETED
               for m in cache.manifests(snapshot, io) if m.content == ManifestContent.DELETES
               for e in cache.entries(m, io))


def live_files(table: Any, keys: Sequence[str], cache: ManifestCache) -> list[LiveFile]:
    """The current snapshot's live data files with their key ranges (rule 1)."""
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    schema = table.schema()
    fields = [schema.find_field(k) for k in keys]
    out = []
    for manifest in cache.manifests(snapshot, table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in cache.entries(manifest, table.io):
            if entry.status == ManifestEntryStatus.DELETED:
                continue
            f = entry.data_file
            low, high = trusted_range(fields, f.lower_bounds or {}, f.upper_bounds or {})
            out.append(LiveFile(f, KeyRange(str(f.file_path), int(f.file_size_in_bytes),
                                            low, high)))
    return out


def trusted_range(fields: Sequence[Any], lower: dict[int, bytes], upper: dict[int, bytes]
                  ) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
    """A file's key bounds as rule 1 trusts them, in :func:`key_value`'s terms (``None``:
    the file may hold any key)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import (
        BooleanType,
        DateType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
    )

    exact = (BooleanType, DateType, IntegerType, LongType, TimestampType, TimestamptzType)
    lows, highs = [], []
    for field in fields:
        lo, hi = lower.get(field.field_id), upper.get(field.field_id)
        kind = field.field_type
        if lo is None or hi is None or not isinstance(kind, (*exact, StringType)):
            return None, None
        low, high = from_bytes(kind, lo), from_bytes(kind, hi)
        if isinstance(kind, StringType) and len(high) >= TRUNCATED_CHARS:
            return None, None
        lows.append(low)
        highs.append(high)
    return tuple(lows), tuple(highs)


def key_value(value: Any) -> Any:
    """A changed key's value as :func:`trusted_range`'s bounds are: a date as days, a
    timestamp as microseconds since the epoch (a zone's as UTC), else itself; also a
    parquet bound as pyiceberg's serializer takes it (``commit.py``'s column statistics)."""
    from pyiceberg.utils.datetime import date_to_days, datetime_to_micros

    if isinstance(value, datetime.datetime):
        return datetime_to_micros(value)
    if isinstance(value, datetime.date):
        return date_to_days(value)
    return value


def read_file(table: Any, data_file: Any, schema: Any) -> Any:
    """A data file's rows in the sink's ``schema`` (pyiceberg's reader: field ids, the name
    mapping)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(
        [FileScanTask(data_file)])
    return rows.select(schema.names).cast(schema)


def write_files(table: Any, rows: Any) -> list[Any]:
    """``rows`` written as data files of ``table`` by pyiceberg's writer (its location
    provider names them: rule 4)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    if rows.num_rows == 0:
        return []
    return list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io))


def snapshots_to_expire(snapshots: Sequence[tuple[int, int]], protected: set[int],
                        properties: dict[str, str], now_ms: int) -> list[int]:
    """Rule 6: of ``snapshots`` ((id, timestamp ms), oldest first), the ids to expire:
    beyond the newest ``min-snapshots-to-keep`` (default :data:`KEEP_SNAPSHOTS` when the
    table sets neither property, else 1, Iceberg's) and older than ``max-snapshot-age-ms``
    (default 0 when the table sets neither, else Iceberg's 5 days); never a ``protected``
    one (a branch's or tag's head)."""
    explicit = MAX_AGE_PROPERTY in properties or MIN_KEEP_PROPERTY in properties
    keep = int(properties.get(MIN_KEEP_PROPERTY, 1 if explicit else KEEP_SNAPSHOTS))
    age = int(properties.get(MAX_AGE_PROPERTY, 5 * 24 * 3600 * 1000 if explicit else 0))
    ordered = sorted(snapshots, key=lambda s: (s[1], s[0]))
    older = ordered[:max(0, len(ordered) - max(keep, 1))]
    return [sid for sid, at in older if sid not in protected and at < now_ms - age]


def referenced_by(snapshots: Iterable[Any], io: Any, cache: ManifestCache
                  ) -> tuple[set[str], set[str], set[str]]:
    """The data file paths the ``snapshots`` reference (their live entries), the paths of
    their manifests and of their manifest lists."""
    from pyiceberg.manifest import ManifestEntryStatus

    paths: set[str] = set()
    manifests: set[str] = set()
    lists: set[str] = set()
    for snapshot in snapshots:
        lists.add(str(snapshot.manifest_list))
        for manifest in cache.manifests(snapshot, io):
            manifests.add(str(manifest.manifest_path))
            for entry in cache.entries(manifest, io):
                if entry.status != ManifestEntryStatus.DELETED:
                    paths.add(str(entry.data_file.file_path))
    return paths, manifests, lists


def overwrite(update: Any) -> Any:
    """Rule 4: the overwrite snapshot producer of ``update`` (a pyiceberg ``UpdateSnapshot``
    of the epoch's transaction), without the parent's manifests that hold no live file."""
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class Overwrite(_OverwriteFiles):
        def _process_manifests(self, manifests: list[Any]) -> list[Any]:
            return [m for m in manifests if m.added_snapshot_id == self._snapshot_id
                    or m.has_added_files() or m.has_existing_files()]

    return Overwrite(operation=Operation.OVERWRITE, transaction=update._transaction,
                     io=update._io, branch=update._branch,
                     snapshot_properties=update._snapshot_properties)
