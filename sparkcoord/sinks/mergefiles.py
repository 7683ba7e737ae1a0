"""The data files a ``merge`` commit writes into the table, named so the sink's sweep finds them.

In mode ``merge`` the epoch's commit writes data files of its own into the table's location
(the changed rows, and the rewrites of the files that held changed keys) before the
transaction that references them. A driver killed between the two leaves them unreferenced;
to be deleted by the orphan sweep (``cleanup.py``) they must say whose they are, as the tasks'
files do (``files.py`` rule 1), without the tasks' name, which the cleanup after a commit
deletes in mode ``merge`` (the staged change files are never in the table).

Rules:
  1. A merge file is named ``sc-<job>.m<epoch>.<token>.<n>.parquet`` (:func:`merge_file_name`),
     in the table's ``data/`` directory: the job id and the epoch whose commit wrote it.
     ``.m`` and not ``.e``: the cleanup after an epoch's commit lists the epoch's prefix
     ``sc-<job>.e<epoch>.`` and never sees them; only the sweep at start (whole directory,
     table references held) decides on them (``cleanup.py`` rule 1).
  2. Iceberg: pyiceberg writes the files (its delete and upsert); it asks the table's location
     provider for each name. ``with_merge_names`` (``formats/iceberg/names.py``) gives the
     committer's in-memory copy of the table's metadata a provider
     (``write.py-location-provider.impl``, ``MergeLocationProvider``) and the job and epoch
     to name by; the table's stored properties are untouched (the catalog applies the
     transaction's updates, not our copy).
  3. Delta: delta-rs's merge names its files ``part-<n>-<uuid>...`` with no hook to change
     that, so the committer merges by copy-on-write itself (``formats/delta/commit.py`` rule
     4, done in ``formats/delta/merge.py``): the files that may hold a changed key by their
     add actions' statistics (:func:`files_to_rewrite`, no I/O), then, of those, the ones
     that do by their key columns; each is rewritten without the changed keys' rows and the
     rows put are written new, all by :class:`MergeFileWriter`, and the removes and adds go
     in the epoch's one transaction.

Thread model: the sink coordinator's commit worker thread (the committers' ``merge``);
:func:`files_to_rewrite` and the name functions are pure.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkcoord.sinks.files import DATA_DIR, TaskFileWriter, check_job_id

_MERGE_NAME = re.compile(r"sc-(?P<job>[A-Za-z0-9_-]{1,100})\.m(?P<epoch>\d+)"
                         r"\.(?P<token>[0-9a-f]{12})\.(?P<seq>\d+)\.parquet")



@dataclass(frozen=True, slots=True)
class MergeFileName:
    """The parts of a merge file's name (rule 1)."""

    job_id: str
    epoch: int


def merge_file_name(job_id: str, epoch: int, token: str, seq: int) -> str:
    """The base name of a file ``epoch``'s merge commit writes (rule 1)."""
    return f"sc-{check_job_id(job_id)}.m{epoch}.{token}.{seq}.parquet"


def parse_merge_name(name: str) -> MergeFileName | None:
    """The job and epoch of a merge file's base name, ``None`` if ``name`` is not one."""
    m = _MERGE_NAME.fullmatch(name)
    return None if m is None else MergeFileName(m["job"], int(m["epoch"]))


# ---------------------------------------------------------------------- Delta (rule 3)
@dataclass(frozen=True, slots=True)
class KeyRange:
    """One current data file of the table and its key columns' bounds (``None``: unknown)."""

    path: str
    size: int
    low: tuple[Any, ...] | None
    high: tuple[Any, ...] | None


def files_to_rewrite(files: Sequence[KeyRange], changed: Sequence[tuple[Any, ...]], *,
                     truncated: bool = False) -> list[KeyRange]:
    """Of the table's ``files``, the ones that may hold one of the ``changed`` keys (tuples in
    the key columns' order), by their bounds; every file after a truncate. A file with
    unknown bounds may hold any key. No I/O: the caller reads the candidates' keys."""
    if truncated:
        return list(files)
    if not changed:
        return []
    single = all(len(k) == 1 for k in changed)
    ordered = sorted(k[0] for k in changed) if single else []
    out = []
    for f in files:
        if f.low is None or f.high is None or any(v is None for v in (*f.low, *f.high)):
            out.append(f)
        elif single:
            at = bisect.bisect_left(ordered, f.low[0])
            if at < len(ordered) and ordered[at] <= f.high[0]:
                out.append(f)
        elif any(all(lo <= v <= hi for v, lo, hi in zip(k, f.low, f.high, strict=True))
                 for k in changed):
            out.append(f)
    return out


class MergeFileWriter(TaskFileWriter):
    """A :class:`~sparkcoord.sinks.files.TaskFileWriter` whose files carry merge names
    (rule 1); used by the Delta committer's merge on the commit worker thread. Its reports
    are the new files' add actions' sources."""

    def __init__(self, location: str, job_id: str, epoch: int, schema: Any, *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(location, job_id, epoch, 0, 0, schema,
                         storage_options=storage_options)

    def _open_next(self) -> None:
        import pyarrow.parquet as pq

        name = merge_file_name(self.job_id, self.epoch, self._token, self._seq)
        self._seq += 1
        self._relative = f"{DATA_DIR}/{name}"
        self._fs.makedirs(f"{self._root}/{DATA_DIR}", exist_ok=True)
        self._file = self._fs.open(f"{self._root}/{self._relative}", "wb")
        self._writer = pq.ParquetWriter(self._file, self.schema, compression=self.compression)
