"""Discovery of new files and the planning of their splits (rules 1, 2, 4, 5, 8 of
:mod:`sparkcoord.sources.files`).

Runs in Spark's Python source runner process on the driver host, inside the source's
:class:`~sparkcoord.sources.enumerator.SplitEnumerator`.

Thread model: :meth:`FileDiscovery.discover` runs on the enumerator's discovery thread
(``sparkcoord-discovery``), one cycle at a time; a fresh or bounded source, and any source
starting an ``availableNow`` run, lists once in the enumerator's ``start``, on its mailbox.
``discover`` changes only a copy of the state it is given (:class:`FileDiscoveryState`, with a
copied :class:`~sparkcoord.sources.files.seen.SeenFiles`) and returns it; the enumerator applies it
on the mailbox at the next checkpoint boundary. ``initial_state`` and ``size_of`` run on the
mailbox. The planning functions (:func:`plan_files`, :func:`pack_files`, ...) are pure
functions of the listed files and the options, called by ``discover`` (parquet's
:func:`plan_splits` reads each file's footer).

:class:`FileDiscoveryState` is checkpointed with the enumerator: its pickle names it
``sparkcoord.sources.files.FileDiscoveryState`` (:data:`~.split.PICKLED_MODULE`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.sources.enumerator import SplitDiscovery
from sparkcoord.sources.files.listing import FileEntry, Lister, filesystem
from sparkcoord.sources.files.options import DISCOVERY_MODES, FileSourceOptions
from sparkcoord.sources.files.seen import SeenFiles
from sparkcoord.sources.files.split import PICKLED_MODULE, FileSplit
from sparkcoord.sources.splits import Split

log = logging.getLogger("sparkcoord.sources")


@encoded("files.FileDiscoveryState")
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


FileDiscoveryState.__module__ = PICKLED_MODULE


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
