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
     its one listing takes every file present (DESIGN 2c, docs/decisions.md 49).
  6. Reading: CSV and JSON lines go through :class:`~sparkcoord.sources.parsing.RecordParser`
     with the source's ``mode`` (a malformed record becomes a row of nulls, is dropped, or is
     a :class:`MalformedRecord` naming the file, line and byte offset). Every other failure to
     read a split is a :class:`FileReadError` naming the file and the row group or byte range.
     A zero-byte file has no split (it gives no rows, as in Spark).
  7. With ``includeMetadata`` the rows carry Spark's file metadata as a last column
     ``_metadata`` (:func:`metadata_field`): the file's URL (as Spark writes it, without
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
     new files are not packed. Not with watermark alignment. A packed split (``FileSplit.files``) is read member by member, each checked and
     named as a file of its own (rules 3, 6, 7); its position is (member, rows of it read);
     on a remote filesystem the next members are fetched ahead (:class:`MemberFetcher`).
     Parquet files are not packed.
"""

from __future__ import annotations

import fnmatch
import io
import json
import logging
import os
import re
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from sparkcoord.core.errors import MalformedRecord, SparkCoordError
from sparkcoord.sources.alignment import AlignmentOptions
from sparkcoord.sources.enumerator import SplitDiscovery
from sparkcoord.sources.parsing import Parsed, RecordParser
from sparkcoord.sources.reader import SplitReader
from sparkcoord.sources.seen import SeenFiles
from sparkcoord.sources.splits import Split

log = logging.getLogger("sparkcoord.sources")

FORMATS = ("parquet", "csv", "json")
DISCOVERY_MODES = ("listing", "lexical")


class FileChangedError(RuntimeError):
    """A file changed after it was discovered (its split no longer describes it)."""


#: a file packed into a split (rule 8): its path, size and modification time as discovered
Member = tuple[str, int, float]


@dataclass(frozen=True)
class FileSplit(Split):
    """A parquet row group (``row_group``) or a byte range ``[start, end)`` of a text file.
    ``lane``: the file's directory, the key of watermark alignment (decision 43).

    A *packed* split (rule 8) reads several small text files whole, in order: ``files`` holds
    them (path, size, modification time, as discovered; two or more), ``size`` is their bytes,
    and ``path``, ``file_size`` and ``mtime`` are those of the first (``start`` and ``end`` are
    0). Every other split has ``files == ()`` and pickles as before packing existed."""

    path: str = ""
    file_size: int = 0
    mtime: float = 0.0
    row_group: int | None = None
    start: int = 0
    end: int = 0
    lane: str = ""
    files: tuple[Member, ...] = ()

    added_fields: ClassVar[tuple[str, ...]] = ("lane", "files")

    @property
    def unit(self) -> str:
        return self.path

    @property
    def units(self) -> tuple[str, ...]:
        """The paths of the files it reads: ``maxFilesPerTrigger`` counts a packed split as
        its number of files (enumerator, mailbox thread)."""
        return self.paths

    @property
    def paths(self) -> tuple[str, ...]:
        """The files this split reads (one, or a packed split's members): what a committer
        names in a manifest (docs/committer.md)."""
        return tuple(m[0] for m in self.files) if self.files else (self.path,)

    @property
    def alignment_key(self) -> str:
        return self.lane or self.split_id


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    mtime: float


@dataclass
class FileDiscoveryState:
    """Checkpointed by the enumerator: see rule 2."""

    marker: str = ""
    #: files seen (path -> size, mtime), held in chunks written once (sources/seen.py; a
    #: dict in states checkpointed before)
    recent: SeenFiles | dict[str, tuple[int, float]] = field(default_factory=SeenFiles)
    #: mode ``listing``: the newest modification time seen (``maxFileAge`` counts from it)
    newest: float = 0.0
    #: when the last backfill listing started (seconds since the epoch), None before the first
    backfill_at: float | None = None
    #: files seen changed after discovery (rule 3), and the last few of them
    changed: int = 0
    changed_paths: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- filesystems
_FILESYSTEMS: dict[tuple[str, str], Any] = {}


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it; one instance per process and
    set of options (readers run many tasks in one Python worker)."""
    import fsspec

    key = (url.split("://", 1)[0] if "://" in url else "file",
           json.dumps(storage_options or {}, sort_keys=True, default=str))
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs, _ = fsspec.core.url_to_fs(url, **(storage_options or {}))
        _FILESYSTEMS[key] = fs
    return fs, fs._strip_protocol(url)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _is_s3(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols or "s3a" in protocols


def _mtime(info: dict[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            from datetime import datetime

            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return 0.0


def _visible(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not base.startswith(("_", "."))


def _skip_dir(directory: str, marker: str) -> bool:
    """Every path under ``directory`` sorts at or before ``marker`` (rule 2)."""
    prefix = directory.rstrip("/") + "/"
    return bool(marker) and marker > prefix and not marker.startswith(prefix)


class Lister:
    """Lists files under a root in lexical path order, optionally only after a marker."""

    def __init__(self, fs: Any, root: str, *, recursive: bool, glob: str | None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.recursive = recursive
        self.glob = glob

    def _wanted(self, path: str) -> bool:
        base = path.rsplit("/", 1)[-1]
        return _visible(base) and (self.glob is None or fnmatch.fnmatchcase(base, self.glob))

    def after(self, marker: str, limit: int | None,
              skip: Container[str] = ()) -> list[FileEntry]:
        """Files whose path sorts after ``marker`` ("" for all), at most ``limit``, in order;
        paths in ``skip`` are left out (locally without a stat)."""
        if _is_s3(self.fs):
            out = [e for e in self._s3_after(marker, None if skip else limit)
                   if e.path not in skip]
        else:
            out = sorted(self._walk(self.root, marker, skip), key=lambda e: e.path)
        return out if limit is None else out[:limit]

    def _walk(self, directory: str, marker: str, skip: Container[str]) -> Iterator[FileEntry]:
        if _is_local(self.fs):
            entries = self._local_entries(directory, marker)
        else:
            entries = self._generic_entries(directory)
        for path, is_dir, info in entries:
            if is_dir:
                if self.recursive and _visible(path) and not _skip_dir(path, marker):
                    yield from self._walk(path, marker, skip)
            elif path > marker and path not in skip and self._wanted(path):
                entry = info() if callable(info) else info
                if entry is not None:
                    yield entry

    def _local_entries(self, directory: str, marker: str) -> Iterator[tuple[str, bool, Any]]:
        # scandir, and stat only the names after the marker: a directory of 100k old files
        # costs one readdir, not 100k stats
        try:
            scan = os.scandir(directory)
        except FileNotFoundError:
            return
        with scan:
            for entry in scan:
                path = f"{directory}/{entry.name}"
                if entry.is_dir(follow_symlinks=True):
                    yield path, True, None
                elif path > marker:
                    def stat(e: os.DirEntry[str] = entry, p: str = path) -> FileEntry | None:
                        try:
                            st = e.stat()
                        except FileNotFoundError:
                            return None  # deleted while listing
                        return FileEntry(p, st.st_size, st.st_mtime)
                    yield path, False, stat

    def _generic_entries(self, directory: str) -> Iterator[tuple[str, bool, Any]]:
        try:
            infos = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return
        for info in infos:
            path = str(info["name"]).rstrip("/")
            if info.get("type") == "directory":
                yield path, True, None
            else:
                yield path, False, FileEntry(path, int(info.get("size") or 0), _mtime(info))

    def _s3_after(self, marker: str, limit: int | None) -> list[FileEntry]:
        bucket, _, prefix = self.root.partition("/")
        prefix = f"{prefix}/" if prefix else ""
        start_after = marker.partition("/")[2] if marker else ""
        out: list[FileEntry] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if not self.recursive:
            kwargs["Delimiter"] = "/"
        if start_after:
            kwargs["StartAfter"] = start_after
        while True:
            page = self.fs.call_s3("list_objects_v2", **kwargs)
            for obj in page.get("Contents", []):
                path = f"{bucket}/{obj['Key']}"
                if obj["Key"].endswith("/") or not self._wanted(path):
                    continue
                if self.recursive and not all(_visible(p) for p in obj["Key"][len(prefix):].split("/")):
                    continue
                out.append(FileEntry(path, int(obj["Size"]), _mtime(obj)))
            if limit is not None and len(out) >= limit:
                break
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
            kwargs.pop("StartAfter", None)
        return out


# ----------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class FileSourceOptions:
    """Parsed options of a file source (see :func:`parse_options` for the option names)."""

    url: str
    format: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    glob: str | None = None
    recursive: bool = False
    latest_first: bool = False
    bounded: bool = False
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    max_split_bytes: int = 64 << 20
    max_files_per_discovery: int = 10_000
    discovery_interval_s: float = 1.0
    backfill_interval_s: float = 600.0
    max_clock_skew_s: float = 10.0
    discovery_mode: str = "listing"
    max_file_age_s: float = 7 * 86400.0
    parallelism: int = 2
    header: bool = False
    sep: str = ","
    batch_rows: int = 1 << 16
    #: CSV and JSON: what a malformed record becomes (sparkcoord.sources.parsing, rule 4)
    mode: str = "PERMISSIVE"
    #: CSV and JSON: the column that holds a malformed record's text, if the schema has it
    corrupt_column: str = "_corrupt_record"
    #: rule 7: the rows end with Spark's file metadata column ``_metadata``
    include_metadata: bool = False
    #: rule 8: the bytes of small files packed into one split, each counted at least
    #: ``open_cost_bytes`` (Spark's ``maxPartitionBytes`` and ``openCostInBytes``)
    max_partition_bytes: int = 128 << 20
    open_cost_bytes: int = 4 << 20
    #: rule 8: members of a packed split a reader fetches ahead (remote filesystems)
    prefetch_files: int = 8
    #: rule 8: small files are packed (off with watermark alignment: set by FileStream)
    packing: bool = True


class FileDiscovery(SplitDiscovery):
    """Discovery of new files under ``options.url`` (rules 2-4). Runs on the discovery thread."""

    def __init__(self, options: FileSourceOptions,
                 clock: Callable[[], float] = time.time) -> None:
        if options.discovery_mode not in DISCOVERY_MODES:
            raise ValueError(f"discoveryMode {options.discovery_mode!r}: use one of "
                             f"{', '.join(DISCOVERY_MODES)}")
        self.options = options
        self.clock = clock

    def initial_state(self) -> FileDiscoveryState:
        return FileDiscoveryState()

    def size_of(self, state: Any) -> int:
        return 1 + len(state.recent) if isinstance(state, FileDiscoveryState) else 0

    @property
    def cap(self) -> int | None:
        """New files one cycle takes (rule 5): none for a bounded source."""
        return None if self.options.bounded else self.options.max_files_per_discovery

    def discover(self, state: Any) -> tuple[list[Split], FileDiscoveryState]:
        o = self.options
        fs, root = filesystem(o.url, o.storage_options)
        lister = Lister(fs, root, recursive=o.recursive, glob=o.glob)
        recent = state.recent
        recent = recent.copy() if isinstance(recent, SeenFiles) else SeenFiles(recent)
        state = replace(state, recent=recent, changed_paths=list(state.changed_paths))
        if o.discovery_mode == "listing":
            new = self._listing(lister, state)
        else:
            new = self._lexical(lister, state)
        splits: list[Split] = list(plan_files(fs, new, o))  # rule 8: packs small files
        return splits, state

    def _listing(self, lister: Lister, state: FileDiscoveryState) -> list[FileEntry]:
        """Mode ``listing`` (rule 2a): everything is listed; new = not seen, not too old."""
        o = self.options
        unseen = lister.after("", None, skip=state.recent)
        state.newest = max([state.newest] + [e.mtime for e in unseen])
        floor = state.newest - o.max_file_age_s
        # arrival order (modification time), then name; the rest waits for the next cycle
        new = sorted((e for e in unseen if e.mtime >= floor), key=lambda e: (e.mtime, e.path))
        new = self._capped(new, len(new))
        recent = state.recent
        assert isinstance(recent, SeenFiles)
        recent.forget_older(floor)
        for e in new:
            state.recent[e.path] = (e.size, e.mtime)
        return new

    def _lexical(self, lister: Lister, state: FileDiscoveryState) -> list[FileEntry]:
        """Mode ``lexical`` (rule 2b): only names after the marker, and a periodic backfill."""
        o = self.options
        now = self.clock()
        late: list[FileEntry] = []
        if state.backfill_at is not None and now - state.backfill_at >= o.backfill_interval_s:
            late = self._backfill(lister, state, now)
        cap = self.cap
        fresh = lister.after(state.marker, None if cap is None else cap + 1)
        fresh = self._capped(fresh, None)
        if state.backfill_at is None:
            state.backfill_at = now  # the first listing sees everything: it is a backfill
        if fresh:
            state.marker = fresh[-1].path
        new = late + fresh
        floor = state.backfill_at - o.max_clock_skew_s
        for e in new:
            if e.mtime >= floor:
                state.recent[e.path] = (e.size, e.mtime)
        return new

    def _capped(self, new: list[FileEntry], found: int | None) -> list[FileEntry]:
        """The first ``cap`` of ``new`` (rule 5); a cut is logged with how many files wait
        (``found``: all that were found, None when the listing stopped early)."""
        cap = self.cap
        if cap is None or len(new) <= cap:
            return new
        log.info("discovery of %s took %d new files (maxFilesPerDiscovery); %s more wait for "
                 "the next cycles", self.options.url, cap,
                 found - cap if found is not None else "some")
        return new[:cap]

    def _backfill(self, lister: Lister, state: FileDiscoveryState, now: float) -> list[FileEntry]:
        floor = state.backfill_at - self.options.max_clock_skew_s  # type: ignore[operator]
        late = []
        for e in lister.after("", None):
            if e.path > state.marker:
                continue  # the incremental listing takes it
            known = state.recent.get(e.path)
            if known is not None:
                if known != (e.size, e.mtime):
                    state.changed += 1
                    state.changed_paths = (state.changed_paths + [e.path])[-20:]
                    log.warning("file %s changed after it was discovered (size %d -> %d); "
                                "it is not read again", e.path, known[0], e.size)
            elif e.mtime >= floor:
                late.append(e)
        if late:
            log.info("backfill found %d file(s) that arrived after the marker passed them",
                     len(late))
        # compaction: the next backfill only looks at files newer than this one's start
        new_floor = now - self.options.max_clock_skew_s
        assert isinstance(state.recent, SeenFiles)
        state.recent.forget_older(new_floor)
        state.backfill_at = now
        return late


def plan_files(fs: Any, entries: list[FileEntry], options: FileSourceOptions) -> list[FileSplit]:
    """The splits of the files one discovery cycle found, in their order: small text files
    packed (rule 8, :func:`pack_files`), every other file as :func:`plan_splits` plans it.
    Called by :meth:`FileDiscovery.discover` (discovery thread)."""
    out: list[FileSplit] = []
    for group in pack_files(entries, options):
        if len(group) == 1:
            out.extend(plan_splits(fs, group[0], options))
        else:
            out.append(packed_split(group))
    return out


#: rule 8: a discovery cycle's files make at least this many splits per reader (when it found
#: that many files): readers pull splits as they go, so several each keep them balanced
SPLITS_PER_READER = 16


def pack_budget(entries: list[FileEntry], options: FileSourceOptions) -> int:
    """The bytes one packed split may cost (rule 8): Spark's ``min(maxPartitionBytes,
    max(openCostInBytes, bytes per split))``, where a file costs at least the open cost and
    the bytes per split are those of ``entries`` over ``parallelism`` times
    :data:`SPLITS_PER_READER` (Spark divides by its cores: one task each; readers pull, so
    a few splits each balance better). A cycle that found a few new files (fewer than 32 with
    two readers) packs none of them; a backlog of tiny files packs them
    ``maxPartitionBytes / openCostInBytes`` to a split. A pure function (discovery thread)."""
    o = options
    total = sum(max(e.size, o.open_cost_bytes) for e in entries if e.size)
    per_split = -(-total // (max(1, o.parallelism) * SPLITS_PER_READER))
    return max(1, min(o.max_partition_bytes, max(o.open_cost_bytes, per_split)))


def pack_files(entries: list[FileEntry], options: FileSourceOptions) -> list[list[FileEntry]]:
    """Rule 8 as a pure function of the entries (in discovery's order) and the options: groups
    of consecutive files, each read as one split. A CSV or JSON-lines file that is one split
    anyway (at most ``maxSplitBytes``) joins the open group if it is in the same directory (its
    alignment lane), the group's cost (each file at least ``openCostInBytes``) stays within
    :func:`pack_budget` and, with ``maxFilesPerTrigger``, the group holds fewer files than
    that; otherwise the group closes and the file starts the next. Parquet files and bigger
    files are groups of one (split by row group or byte range, rule 1), as is every file
    with ``packing`` off (watermark alignment); zero-byte files are left out (they give no
    split). Called by :func:`plan_files` (discovery thread)."""
    o = options
    present = [e for e in entries if e.size or o.format == "parquet"]
    if o.format == "parquet" or not o.packing:
        return [[e] for e in present]
    budget = pack_budget(present, o)
    cap = o.max_files_per_trigger
    groups: list[list[FileEntry]] = []
    cost = 0
    open_group: list[FileEntry] | None = None
    for e in present:
        if e.size > o.max_split_bytes:
            groups.append([e])
            open_group = None
            continue
        weight = max(e.size, o.open_cost_bytes)
        if (open_group is not None and lane_of(e.path) == lane_of(open_group[0].path)
                and cost + weight <= budget and (cap is None or len(open_group) < cap)):
            open_group.append(e)
            cost += weight
            continue
        open_group = [e]
        cost = weight
        groups.append(open_group)
    return groups


def packed_split(group: list[FileEntry]) -> FileSplit:
    """The split of a group of small files (rule 8; :func:`pack_files` made the group)."""
    first = group[0]
    return FileSplit(f"{first.path}#pack", sum(e.size for e in group), first.path, first.size,
                     first.mtime, lane=lane_of(first.path),
                     files=tuple((e.path, e.size, e.mtime) for e in group))


def plan_splits(fs: Any, entry: FileEntry, options: FileSourceOptions) -> list[FileSplit]:
    """The splits of one file (rule 1); parquet reads the footer."""
    if options.format == "parquet":
        import pyarrow.parquet as pq

        with fs.open(entry.path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
        return [FileSplit(f"{entry.path}#rg{i}", meta.row_group(i).total_byte_size, entry.path,
                          entry.size, entry.mtime, row_group=i, lane=lane_of(entry.path))
                for i in range(meta.num_row_groups)]
    if entry.size == 0:
        return []
    step = max(1, options.max_split_bytes)
    return [FileSplit(f"{entry.path}#{start}", min(step, entry.size - start), entry.path,
                      entry.size, entry.mtime, start=start, end=min(entry.size, start + step),
                      lane=lane_of(entry.path))
            for start in range(0, entry.size, step)]


def lane_of(path: str) -> str:
    """A file's alignment lane: its directory (a partition path, one producer's directory),
    whose files follow each other in event time. Called by :func:`plan_splits` (discovery
    thread)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


# ----------------------------------------------------------------------------- metadata
#: the column of rule 7, under Spark's name for its hidden file metadata column
METADATA_COLUMN = "_metadata"
#: what :func:`file_url` leaves unencoded in a path: what java.net.URI leaves in one (Spark's
#: ``file_path`` is a Hadoop ``Path`` URI), so the same file gives Spark's text
_URI_SAFE = "/!$&'()*+,;=:@-._~"


def metadata_field() -> Any:
    """The ``StructField`` of rule 7: Spark's ``_metadata`` fields, names, types and
    nullability (``file_path``, ``file_name``, ``file_size``, ``file_block_start``,
    ``file_block_length``, ``file_modification_time``), then ``row_group`` (an int, null for
    CSV and JSON). Called by :class:`~sparkcoord.sources.stream.FileStream` (driver program
    thread) and by the reader (task thread)."""
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructField(METADATA_COLUMN, StructType([
        StructField("file_path", StringType(), False),
        StructField("file_name", StringType(), False),
        StructField("file_size", LongType(), False),
        StructField("file_block_start", LongType(), False),
        StructField("file_block_length", LongType(), False),
        StructField("file_modification_time", TimestampType(), False),
        StructField("row_group", IntegerType(), True),
    ]), False)


def file_url(url: str, path: str) -> str:
    """Spark's ``file_path`` of a file: ``path`` (as fsspec lists it under the source's
    ``url``) as a percent-encoded URL: ``file:/data/a%20b.json`` for a local file (Spark's
    form, one slash), ``s3://bucket/key`` with the scheme the user wrote (``s3a`` stays
    ``s3a``). A filesystem whose paths drop the host (sftp, ftp) gets it back from ``url``.
    Never any ``user:password@``: it is stripped wherever it came from. Reader (task thread),
    once per split."""
    from urllib.parse import quote, urlsplit, urlunsplit

    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file", "local"):
        return "file:" + quote(path, safe=_URI_SAFE)
    if "://" in path:  # a filesystem whose paths are URLs (http): as it is
        full = path
    elif path.startswith("/"):
        parts = urlsplit(url)
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        full = f"{scheme}://{host}{quote(path, safe=_URI_SAFE)}"
    else:  # object stores: the bucket is the path's first part
        full = f"{scheme}://{quote(path, safe=_URI_SAFE)}"
    parts = urlsplit(full)
    if "@" in parts.netloc:
        full = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return full


def row_group_bytes(row_group: Any) -> tuple[int, int]:
    """Where a parquet row group (``pyarrow`` ``RowGroupMetaData``) lies in its file: the
    offset of its first page and its length up to the end of its last column chunk. Reader
    (task thread), from the footer it read to read the row group."""
    first, last = None, 0
    for i in range(row_group.num_columns):
        chunk = row_group.column(i)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            start = min(start, chunk.dictionary_page_offset)
        first = start if first is None else min(first, start)
        last = max(last, start + chunk.total_compressed_size)
    return (0, 0) if first is None else (first, last - first)


class SplitMetadata:
    """The ``_metadata`` column of one split's record batches (rule 7): one struct value,
    repeated to each batch's length (a C++ fill; the last length is kept, as most batches of a
    split have ``batchRows`` rows). Made by the reader in its task thread, once per split."""

    def __init__(self, arrow_type: Any, value: dict[str, Any]) -> None:
        import pyarrow as pa

        self._pa = pa
        self.scalar = pa.scalar(value, type=arrow_type)
        self._last: Any = None

    def column(self, rows: int) -> Any:
        if self._last is None or len(self._last) != rows:
            self._last = self._pa.repeat(self.scalar, rows)
        return self._last


# ----------------------------------------------------------------------------- reading
class FileReadError(SparkCoordError):
    """A split could not be read: the file is gone, its store failed, a parquet row group is
    damaged or lacks a column, ... Raised by :class:`FileReader` in a Spark task; the message
    names the file (as :func:`display_path` writes it), what was read (a row group, a byte
    range) and the original exception, which is also the ``__cause__`` (Spark's task failure
    text drops a cause, so the message repeats it)."""


def display_path(url: str, path: str) -> str:
    """``path`` (as fsspec gives it, without a scheme) written as the user wrote the source's
    ``url``: with its scheme (``s3://bucket/key``), a local path as it is. Only the scheme of
    ``url`` is taken, so credentials in a URL never reach a message."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return path if scheme in ("", "file", "local") else f"{scheme}://{path}"


def line_range(f: Any, start: int, end: int, file_size: int,
               chunk: int = 1 << 20) -> tuple[int, bytes]:
    """The lines whose first byte lies in ``[start, end)`` of open file ``f`` (rule 1), and
    the offset in the file of the first of them."""
    if start >= end:
        return start, b""
    first = 0
    if start == 0:
        f.seek(0)
        data = f.read(end)
    else:
        f.seek(start - 1)
        data = f.read(end - start + 1)
        cut = data.find(b"\n")
        if cut == -1 or start + cut >= end:
            return start, b""  # no line starts in the range
        data = data[cut + 1:]
        first = start + cut
    if end < file_size and not data.endswith(b"\n"):
        parts = [data]
        f.seek(end)
        while True:
            more = f.read(chunk)
            if not more:
                break
            cut = more.find(b"\n")
            if cut != -1:
                parts.append(more[:cut + 1])
                break
            parts.append(more)
        data = b"".join(parts)
    return first, bytes(data)


def read_line_range(f: Any, start: int, end: int, file_size: int, chunk: int = 1 << 20) -> bytes:
    """The lines whose first byte lies in ``[start, end)`` of open file ``f`` (rule 1)."""
    return line_range(f, start, end, file_size, chunk)[1]


def lines_before(f: Any, offset: int, chunk: int = 1 << 20) -> int:
    """How many lines of open file ``f`` end before byte ``offset``: a line number is this
    plus the line's index in its split. Reads the file up to ``offset``, so only a reader that
    has a malformed record to name calls it."""
    f.seek(0)
    count, left = 0, offset
    while left > 0:
        block = f.read(min(chunk, left))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count


class FileReader(SplitReader):
    """Reads :class:`FileSplit` objects into record batches of the source's schema.

    CSV and JSON lines go through a :class:`~sparkcoord.sources.parsing.RecordParser` with the
    source's ``mode`` (malformed records: a row of nulls, dropped, or :class:`MalformedRecord`;
    one warning per split that had any). Every other failure to read a split is a
    :class:`FileReadError` naming the file.

    ``schema_json`` is the rows' ``StructType`` as JSON; with ``options.include_metadata``
    (rule 7) the reader adds the ``_metadata`` column to each batch (at its place in
    ``schema_json``, or last if a wrapper gave the schema without it).
    """

    def __init__(self, options: FileSourceOptions, schema_json: str,
                 alignment: AlignmentOptions | None = None) -> None:
        self.options = options
        self.schema_json = schema_json
        # keyed by lane, the file's directory (decision 43)
        self.alignment = alignment
        self._arrow_schema: Any = None
        self._data_schema: Any = None
        self._parser: RecordParser | None = None

    @property
    def arrow_schema(self) -> Any:
        """The Arrow schema of the record batches :meth:`read_split` yields (task thread)."""
        if self._arrow_schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            struct = StructType.fromJson(json.loads(self.schema_json))
            if self.options.include_metadata and METADATA_COLUMN not in struct.fieldNames():
                struct = StructType([*struct.fields, metadata_field()])
            self._arrow_schema = to_arrow_schema(struct, timezone="UTC")
        return self._arrow_schema

    @property
    def data_schema(self) -> Any:
        """What is read from the files: :attr:`arrow_schema` without the ``_metadata``
        column of rule 7 (the same schema without ``includeMetadata``)."""
        if self._data_schema is None:
            schema = self.arrow_schema
            index = schema.get_field_index(METADATA_COLUMN)
            self._data_schema = (schema.remove(index)
                                 if self.options.include_metadata and index >= 0 else schema)
        return self._data_schema

    @property
    def parser(self) -> RecordParser:
        """The CSV or JSON parser of this reader (made once; task thread). A bad
        corrupt-record column is a ``ValueError`` (the driver checked it already)."""
        if self._parser is None:
            o = self.options
            self._parser = RecordParser(o.format, self.data_schema, mode=o.mode,
                                        corrupt_column=o.corrupt_column, sep=o.sep)
        return self._parser

    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        """Task thread. ``position``: the rows of the split read so far (an int), or for a
        packed split (rule 8) a pair (index of the member file, rows of it read)."""
        assert isinstance(split, FileSplit)
        if split.files:
            yield from self._read_packed(split, position)
            return
        try:
            yield from self._read_file(split, int(position or 0))
        except (SparkCoordError, FileChangedError):
            raise  # named already
        except Exception as exc:
            where = display_path(self.options.url, split.path)
            what = (f"row group {split.row_group}" if split.row_group is not None
                    else f"bytes [{split.start}, {split.end})")
            raise FileReadError(f"cannot read {where} ({what}): {type(exc).__name__}: "
                                f"{exc}") from exc

    def _read_file(self, split: FileSplit, skip: int) -> Iterator[tuple[Any, Any]]:
        fs, _ = filesystem(self.options.url, self.options.storage_options)
        emitted = 0
        with fs.open(split.path, "rb") as f:
            size = getattr(f, "size", None)
            if size is None:
                size = fs.size(split.path)
            if size != split.file_size:
                raise FileChangedError(
                    f"file {split.path} changed after it was discovered: it had "
                    f"{split.file_size} bytes, now {size} (split {split.split_id})")
            if self.options.format == "parquet":
                import pyarrow.parquet as pq

                source: Any = pq.ParquetFile(f)  # the footer, read once for both uses
            else:
                source = f
            metadata = (self._split_metadata(split, source)
                        if self.options.include_metadata else None)
            for batch in self._batches(source, split):
                n = batch.num_rows
                if emitted + n <= skip:
                    emitted += n
                    continue
                if emitted < skip:
                    batch = batch.slice(skip - emitted)
                    emitted = skip
                emitted += batch.num_rows
                out = self._conform(batch)
                if metadata is not None:
                    out = self._with_metadata(out, metadata)
                yield out, emitted

    def _batches(self, source: Any, split: FileSplit) -> Iterator[Any]:
        """The split's rows from ``source``: a ``pyarrow.parquet.ParquetFile`` for parquet,
        else the open file."""
        o = self.options
        if o.format == "parquet":
            yield from source.iter_batches(batch_size=o.batch_rows,
                                           row_groups=[split.row_group],
                                           columns=self.data_schema.names)
            return
        f = source
        first, data = line_range(f, split.start, split.end, split.file_size)
        if not data:
            return
        # the header is the file's first line, so only the split at byte 0 has it
        parsed = self.parser.parse(data, header=o.header and split.start == 0)
        if parsed.malformed:
            self._malformed(f, split.path, split.start, split.end, first, parsed)
        yield from parsed.table.to_batches(max_chunksize=o.batch_rows)

    def _malformed(self, f: Any, file: str, start: int, end: int, first: int,
                   parsed: Parsed) -> None:
        """Name the malformed records of bytes ``[start, end)`` of ``file`` (a split, or a
        member of a packed split): raise for the first one when parsing stopped there, else
        one warning for the range (not one per record)."""
        bad = parsed.first
        assert bad is not None
        path = display_path(self.options.url, file)
        line = (lines_before(f, first) if first else 0) + bad.line + 1
        offset = first + bad.offset
        where = f"{path} line {line} (byte offset {offset})"
        mode, column = self.parser.mode, self.parser.corrupt_column
        if parsed.table is None:
            if mode == "FAILFAST":
                hint = "mode FAILFAST; mode PERMISSIVE or DROPMALFORMED reads past it"
            else:
                hint = (f"mode PERMISSIVE cannot read it as a row of nulls: column "
                        f"{self.parser.not_null!r} is NOT NULL in the schema; make it "
                        f"nullable, or use mode DROPMALFORMED")
            raise MalformedRecord(f"malformed record in {where}: {bad.reason}; the record: "
                                  f"{bad.excerpt()!r} ({hint})",
                                  path=path, line=line, offset=offset)
        if mode == "DROPMALFORMED":
            became = "dropped (mode DROPMALFORMED)"
        elif column is not None:
            became = f"read as rows of nulls with their text in column {column!r}"
        else:
            became = "read as rows of nulls (mode PERMISSIVE; the schema has no " \
                     f"{self.options.corrupt_column!r} column for their text)"
        log.warning("%d malformed record(s) in %s bytes [%d, %d), %s; the first at line %d "
                    "(byte offset %d): %s", parsed.malformed, path, start, end,
                    became, line, offset, bad.reason)

    def _split_metadata(self, split: FileSplit, source: Any) -> SplitMetadata:
        """Rule 7's value for ``split``; ``source`` is the parquet footer (``ParquetFile``) or
        the open text file."""
        if split.row_group is not None:
            start, length = row_group_bytes(source.metadata.row_group(split.row_group))
        else:
            start, length = split.start, split.end - split.start
        return self._file_metadata((split.path, split.file_size, split.mtime), start, length,
                                   split.row_group)

    def _file_metadata(self, file: Member, start: int, length: int,
                       row_group: int | None) -> SplitMetadata:
        """Rule 7's value for bytes ``[start, start + length)`` of ``file`` (path, size and
        modification time as discovered)."""
        arrow_type = self.arrow_schema.field(METADATA_COLUMN).type
        return SplitMetadata(arrow_type, self._metadata_value(file, start, length, row_group))

    def _metadata_value(self, file: Member, start: int, length: int,
                        row_group: int | None) -> dict[str, Any]:
        path, size, mtime = file
        return {
            "file_path": file_url(self.options.url, path),
            "file_name": path.rstrip("/").rsplit("/", 1)[-1],
            "file_size": size,
            "file_block_start": start,
            "file_block_length": length,
            # as discovery recorded it (and the reader checked the size against), in
            # microseconds: Spark's timestamp precision
            "file_modification_time": round(mtime * 1_000_000),
            "row_group": row_group,
        }

    def _read_packed(self, split: FileSplit, position: Any) -> Iterator[tuple[Any, Any]]:
        """A packed split (rule 8): its members in order (a member is one whole CSV or
        JSON-lines file, at most ``maxSplitBytes``), their rows joined into record batches
        of ``batchRows`` (the last may be shorter). Each batch yields the position after its
        last row, (member index, rows of that member read), so a resumed split starts in the
        right member at the right row (members before it are not read again). Consecutive
        members are parsed together, in groups of up to :data:`PARSE_GROUP_BYTES`
        (:meth:`_parse_members`)."""
        import bisect

        o = self.options
        index, skip = position if position else (0, 0)
        fs, _ = filesystem(o.url, o.storage_options)
        fetcher = MemberFetcher(fs, split.files, index, ahead=o.prefetch_files,
                                max_bytes=PREFETCH_BYTES)
        pending: list[Any] = []
        rows = 0
        after = (index, skip)
        i = index
        try:
            while i < len(split.files):
                group: list[tuple[int, bytes]] = []
                held = 0
                while i < len(split.files) and (not group or held + split.files[i][1]
                                                <= PARSE_GROUP_BYTES):
                    data = self._member_data(split, i, fetcher)
                    group.append((i, data))
                    held += len(data)
                    i += 1
                table, counts = self._parse_members(split, group)
                first = group[0][0]
                done_before = skip if first == index else 0  # rows of the first member read
                if done_before:
                    table = table.slice(min(done_before, table.num_rows))
                    counts[0] = max(0, counts[0] - done_before)
                if o.include_metadata:
                    table = self._with_member_metadata(split, group, counts, table)
                ends = list(_cumulative(counts))
                offset, total = 0, table.num_rows
                while offset < total:
                    take = min(total - offset, o.batch_rows - rows)
                    pending.append(table.slice(offset, take))
                    offset += take
                    rows += take
                    # the member of the last row taken, and its rows read
                    k = bisect.bisect_left(ends, offset)
                    before = ends[k - 1] if k else -done_before  # rows of it before the table
                    after = (group[k][0], offset - before)
                    if rows >= o.batch_rows:
                        yield _joined_tables(pending), after
                        pending, rows = [], 0
            if pending:
                yield _joined_tables(pending), after
        finally:
            fetcher.close()

    def _member_data(self, split: FileSplit, i: int, fetcher: MemberFetcher) -> bytes:
        """Member ``i``'s bytes, checked against its size as discovered (rule 3)."""
        path, size, _ = split.files[i]
        try:
            data = fetcher.get(i)
        except Exception as exc:
            raise self._member_error(split, i, exc) from exc
        if len(data) != size:
            raise FileChangedError(
                f"file {path} changed after it was discovered: it had {size} bytes, now "
                f"{len(data)} (file {i + 1} of {len(split.files)} of split {split.split_id})")
        return data

    def _member_error(self, split: FileSplit, i: int, exc: BaseException) -> FileReadError:
        path, size, _ = split.files[i]
        return FileReadError(f"cannot read {display_path(self.options.url, path)} (bytes "
                             f"[0, {size}), file {i + 1} of {len(split.files)} of split "
                             f"{split.split_id}): {type(exc).__name__}: {exc}")

    def _parse_members(self, split: FileSplit,
                       group: list[tuple[int, bytes]]) -> tuple[Any, list[int]]:
        """The rows of consecutive members (index, bytes) as one table of the data's schema,
        and how many rows each member gave. Fast path: the members' records (a CSV member
        without its header line) in one parse, when that parse finds no malformed record and
        the rows are as many as the members' non-blank lines. Otherwise each member on its
        own (:meth:`_member_table`), which names a malformed record's member, line and byte
        offset, as a file of its own would be (rule 6)."""
        o = self.options
        if len(group) > 1:
            bodies, counts = [], []
            for _, data in group:
                body = data
                if o.header:
                    cut = data.find(b"\n")
                    body = data[cut + 1:] if cut >= 0 else b""
                count = _record_count(body)
                if count is None:
                    break
                counts.append(count)
                bodies.append(body if not body or body.endswith(b"\n") else body + b"\n")
            else:
                try:
                    parsed = self.parser.parse(b"".join(bodies), header=False)
                except Exception:  # noqa: BLE001 - each member again, named
                    parsed = None
                if (parsed is not None and not parsed.malformed and parsed.table is not None
                        and parsed.table.num_rows == sum(counts)):
                    return self._conform(parsed.table), counts
        tables = [self._member_table(split, i, data) for i, data in group]
        import pyarrow as pa

        return pa.concat_tables(tables), [t.num_rows for t in tables]

    def _member_table(self, split: FileSplit, i: int, data: bytes) -> Any:
        """Member ``i`` of packed ``split`` parsed alone (a file of its own: its header, its
        malformed records named with its path and line), in the data's schema."""
        path, size, _ = split.files[i]
        try:
            parsed = self.parser.parse(data, header=self.options.header)
            if parsed.malformed:
                self._malformed(io.BytesIO(data), path, 0, size, 0, parsed)
            return self._conform(parsed.table)
        except (SparkCoordError, FileChangedError):
            raise  # named already
        except Exception as exc:
            raise self._member_error(split, i, exc) from exc

    def _with_member_metadata(self, split: FileSplit, group: list[tuple[int, bytes]],
                              counts: list[int], table: Any) -> Any:
        """``table`` (the rows of ``group``'s members, ``counts`` each) with the
        ``_metadata`` column of rule 7: every row its own member's file."""
        import numpy as np
        import pyarrow as pa

        arrow_type = self.arrow_schema.field(METADATA_COLUMN).type
        values = pa.array([self._metadata_value(split.files[i], 0, split.files[i][1], None)
                           for i, _ in group], type=arrow_type)
        column = values.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
        columns = [column if f.name == METADATA_COLUMN else table.column(f.name)
                   for f in self.arrow_schema]
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)

    def _with_metadata(self, batch: Any, metadata: SplitMetadata) -> Any:
        """``batch`` (of :attr:`data_schema`) with the ``_metadata`` column at its place."""
        import pyarrow as pa

        schema = self.arrow_schema
        column = metadata.column(batch.num_rows)
        columns = [column if f.name == METADATA_COLUMN else batch.column(f.name)
                   for f in schema]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _conform(self, batch: Any) -> Any:
        """The record batch (or table: a parse of several packed members) with exactly the
        data's Arrow schema (column order, types, nullability), which Spark requires of a
        record batch; the ``_metadata`` column (rule 7) is added after."""
        schema = self.data_schema
        if batch.schema.equals(schema):
            return batch
        import pyarrow as pa

        columns = [batch.column(batch.schema.get_field_index(f.name)).cast(f.type)
                   for f in schema]
        kind = pa.Table if isinstance(batch, pa.Table) else pa.RecordBatch
        return kind.from_arrays(columns, schema=schema)


class MemberFetcher:
    """The bytes of a packed split's members (rule 8), in order, from member ``first`` on.
    A local file is read when asked for; on a remote filesystem (S3, ...) a small thread pool
    fetches the next members ahead with ``cat_file`` while the reader parses: at most
    ``ahead`` members and, past the one being read, ``max_bytes`` bytes (a member may be
    bigger alone). Made and used by :class:`FileReader` in the Spark task's thread; the
    pool's threads only fetch. :meth:`close` drops what was fetched and not read."""

    def __init__(self, fs: Any, members: tuple[Member, ...], first: int, *, ahead: int,
                 max_bytes: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.fs = fs
        self.members = members
        self.ahead = max(1, ahead)
        self.max_bytes = max_bytes
        self.local = _is_local(fs)
        self._next = first
        self._waiting: dict[int, Any] = {}
        self._pool = (None if self.local or self.ahead == 1 else
                      ThreadPoolExecutor(self.ahead, thread_name_prefix="sparkcoord-fetch"))

    def _read(self, path: str) -> bytes:
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        data: bytes = self.fs.cat_file(path)
        return data

    def _fill(self) -> None:
        assert self._pool is not None
        held = sum(self.members[i][1] for i in self._waiting)
        while self._next < len(self.members) and len(self._waiting) < self.ahead:
            size = self.members[self._next][1]
            if self._waiting and held + size > self.max_bytes:
                break
            self._waiting[self._next] = self._pool.submit(self._read, self.members[self._next][0])
            held += size
            self._next += 1

    def get(self, index: int) -> bytes:
        """Member ``index``'s bytes (members are asked for in order); a failure to fetch it
        is raised here."""
        if self._pool is None:
            return self._read(self.members[index][0])
        if index not in self._waiting:
            self._next = max(self._next, index)
            self._fill()
        future = self._waiting.pop(index)
        self._fill()
        data: bytes = future.result()
        return data

    def close(self) -> None:
        if self._pool is not None:
            for future in self._waiting.values():
                future.cancel()
            self._waiting.clear()
            self._pool.shutdown(wait=False, cancel_futures=True)


#: rule 8: consecutive members of a packed split parsed in one call, up to these many bytes
PARSE_GROUP_BYTES = 8 << 20
#: rule 8: the bytes of members a reader fetches ahead of the one it parses (a bigger member
#: is fetched alone)
PREFETCH_BYTES = 16 << 20
#: a line with nothing but white space (or nothing), where CSV and JSON count differently
_BLANK_LINE = re.compile(rb"(?:^|\n)[ \t\r\f\v]*(?:\n|$)")


def _record_count(body: bytes) -> int | None:
    """The records of ``body`` (whole lines, no header): its non-blank lines; None when a line
    holds white space only (whether that is a record depends on the format). Reader (task
    thread), for the one-parse path of a packed split."""
    if body.endswith(b"\n"):
        body = body[:-1]
    if not body:
        return 0
    if _BLANK_LINE.search(body) is None:
        return body.count(b"\n") + 1
    count = 0
    for line in body.split(b"\n"):
        if line.strip():
            count += 1
        elif line:
            return None
    return count


def _joined_tables(tables: list[Any]) -> Any:
    """One record batch of the rows of ``tables`` (same schema, some rows)."""
    import pyarrow as pa

    return pa.concat_tables(tables).combine_chunks().to_batches()[0]


def _cumulative(counts: list[int]) -> Iterator[int]:
    total = 0
    for count in counts:
        total += count
        yield total


def infer_schema(options: FileSourceOptions) -> Any:
    """The Arrow schema of the first file under ``options.url`` (driver program)."""
    fs, root = filesystem(options.url, options.storage_options)
    first = Lister(fs, root, recursive=options.recursive, glob=options.glob).after("", 1)
    if not first:
        raise ValueError(f"cannot infer the schema of {options.url!r}: it holds no "
                         f"{options.format} file yet; give the schema with .schema(...)")
    path = first[0].path
    if options.format == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as f:
            return pq.read_schema(f)
    with fs.open(path, "rb") as f:
        data = read_line_range(f, 0, min(first[0].size, 1 << 20), first[0].size)
    try:
        if options.format == "json":
            import pyarrow.json as pj

            # a line "null" would crash pyarrow (parsing.py rule 6); it is no record anyway
            lines = [line for line in data.splitlines(keepends=True)
                     if not line.lstrip().startswith(b"null")]
            return pj.read_json(io.BytesIO(b"".join(lines))).schema
        import pyarrow.csv as pc

        read = (pc.ReadOptions() if options.header
                else pc.ReadOptions(autogenerate_column_names=True))
        return pc.read_csv(io.BytesIO(data), read_options=read,
                           parse_options=pc.ParseOptions(delimiter=options.sep)).schema
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no file
        raise ValueError(f"cannot infer the schema of {options.url!r} from its first file "
                         f"{path}: {type(exc).__name__}: {exc}; give the schema with "
                         f".schema(...)") from exc
