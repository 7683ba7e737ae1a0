"""Compaction: the coordinator plans which small files of earlier epochs to rewrite, the tasks
rewrite them, and the swap commits in the same table transaction as an epoch's data (issue 28
item 7; option ``compaction``, mode ``append`` only).

Rules:
  1. What may be compacted: data files this job's commits added to the table, learned when
     an epoch's commit is reported done (``files_committed``), never from a listing. Of an
     epoch the table already held, only the reported files the table references count (a
     restored pending commit's or a replayed batch's reports are the table's; the files of a
     batch run again after a restore are not). A file is small below half the target file
     size.
  2. Planning is part of the checkpoint: at checkpoint N the small files, in commit order,
     are packed into bins, a bin closing once its files reach the target size or
     ``max_files`` files (a bin that never closes waits for more small files); bin i of N is
     subtask i's, at most one per subtask, sent to it as a :class:`CompactionAssigned` event
     before the checkpoint completes, so the event is sealed into epoch N (``core/valve.py``
     rule 1) and every attempt of the batch of N, a retry or a re-run after a restore, gets
     the same bin. A file in a bin is planned again only if the bin is given back (rule 5).
     Events and reports name the bin's files by path only (a wide table's statistics of 100
     files would not fit an event); the plan in the state keeps their reports. A checkpoint
     that was aborted (a tolerated failure) leaves its bins' events to the next epoch's
     seal: a subtask rewrites every bin it is handed, whatever epoch planned it.
     Not a request: a request answered in an epoch makes every task retry of the operator
     adopt the failed attempt's history (``core/inbound.py`` rule 5), and a sink task's
     retry writes files under new names, so it could not send the same reports again.
  3. A subtask rewrites its bin after its rows: the bin's files into files of the target
     size named as the epoch's data files (``files.py`` rule 1: cleanup tells an unreported
     or unswapped one by name), and reports :class:`FilesCompacted`. The task does it inside
     its batch, so the stream waits for a compaction at most the batch that does it. A bin
     one of whose files cannot be read (deleted behind the table's back) is reported with
     no outputs: nothing is swapped and its files are not planned again.
  4. The swap is part of the epoch's commit (``formats/delta/commit.py`` rule 5,
     ``formats/iceberg/commit.py`` rule 6): the inputs removed and the outputs added
     (neither a change of the table's data) with the epoch's files, in one transaction that
     fails rather than lands over a commit it did not read (the commit worker's retry reads
     the table again). A swap one of whose inputs is no
     longer in the table's current files is left out (rows would be duplicated), and so is
     every swap of a table that may hold deletes outside data files (Iceberg delete files,
     Delta deletion vectors: the rewrite reads the raw files and would bring deleted rows
     back); its outputs are cleanup's.
  5. A bin is given back (its files small again, first in line) when its epoch's batch
     committed in Spark without its swap (the subtask got no task in that batch, so its
     event was never delivered: the sink's partitions are coalesced, not shuffled). A swapped bin's files are never planned again,
     whether the swap committed or was left out.
  6. A plan of an epoch before the restored checkpoint is dropped at a restore, unswapped
     bins too (their swap may be in the table already): those files are not compacted, a
     loss of tidiness, never of rows.

Thread model: :class:`CompactionPlanner` is confined to the sink coordinator's mailbox;
:func:`rewrite` runs in a Spark task's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.sinks.files import DataFile, TaskFileWriter

log = logging.getLogger("sparkcoord.sinks")

#: A file below this fraction of the target size is small (rule 1).
SMALL_FRACTION = 0.5

#: Files per bin at most, by default (rule 2): a task opens that many files at most for one
#: rewrite, and the checkpointed plan stays small.
DEFAULT_MAX_FILES = 100

Bin = tuple[DataFile, ...]


@encoded("sinks.CompactionAssigned")
@dataclass(frozen=True)
class CompactionAssigned:
    """Event, coordinator to subtask: rewrite the files at ``inputs`` (paths relative to the
    table), planned at checkpoint ``epoch`` (rule 2)."""

    epoch: int
    inputs: tuple[str, ...]


@encoded("sinks.FilesCompacted")
@dataclass(frozen=True)
class FilesCompacted:
    """Event, subtask to coordinator: the files at ``inputs`` rewritten into ``outputs``
    (rule 3; no outputs: an input could not be read, nothing to swap)."""

    inputs: tuple[str, ...]
    outputs: tuple[DataFile, ...]


@encoded("sinks.CompactionState")
@dataclass
class CompactionState:
    """The planner's checkpointed part (rule 2)."""

    #: committed small files not in a bin, in commit order
    small: tuple[DataFile, ...] = ()
    #: bins by epoch (bin i: subtask i's) until the epoch's batch committed
    plans: dict[int, tuple[Bin, ...]] = field(default_factory=dict)


class CompactionPlanner:
    """Rules 1, 2, 5 and 6: which small files to rewrite, by epoch and subtask."""

    def __init__(self, target_bytes: int, max_files: int = DEFAULT_MAX_FILES,
                 state: CompactionState | None = None) -> None:
        if target_bytes <= 0 or max_files < 2:
            raise ValueError(f"compaction needs a target size > 0 and at least 2 files per "
                             f"bin, got {target_bytes} and {max_files}")
        self.target_bytes = target_bytes
        self.max_files = max_files
        state = state or CompactionState()
        self._small: list[DataFile] = list(state.small)
        self._plans: dict[int, tuple[Bin, ...]] = dict(state.plans)
        #: the newest checkpoint taken by this start (ids only grow)
        self._snapshot = -1

    # ------------------------------------------------------------------ inputs (facts)
    def files_committed(self, files: Iterable[DataFile]) -> None:
        """A commit made by this coordinator added ``files`` to the table (rule 1)."""
        limit = self.target_bytes * SMALL_FRACTION
        self._small.extend(f for f in files if f.bytes < limit)

    def batch_committed(self, epoch: int, swapped: Iterable[tuple[str, ...]]) -> None:
        """The batch of ``epoch`` committed in Spark with the swaps of the bins whose paths
        are ``swapped`` among its reports (rule 5): the bins of ``epoch`` and before that
        were not swapped are given back."""
        done = set(swapped)
        back: list[DataFile] = []
        for planned in sorted(e for e in self._plans if e <= epoch):
            back.extend(f for b in self._plans.pop(planned) if _paths(b) not in done
                        for f in b)
        self._small[:0] = back

    def restored(self, checkpoint_id: int) -> None:
        """The coordinator was reset to ``checkpoint_id`` (rule 6)."""
        for planned in [e for e in self._plans if e < checkpoint_id]:
            del self._plans[planned]

    # ------------------------------------------------------------------ commands
    def checkpoint_taken(self, epoch: int, parallelism: int) -> CompactionState:
        """Plan ``epoch``'s bins (rule 2) and return the state to checkpoint with it."""
        if epoch <= self._snapshot:
            raise CheckpointIdRegression("compaction: checkpoint taken", epoch, self._snapshot)
        self._snapshot = epoch
        bins: list[Bin] = []
        # a plan restored for this very epoch stands (rule 2: its events may be sealed)
        while epoch not in self._plans and len(bins) < parallelism:
            taken, size = 0, 0
            while taken < len(self._small) and size < self.target_bytes \
                    and taken < self.max_files:
                size += self._small[taken].bytes
                taken += 1
            if size < self.target_bytes and taken < self.max_files:
                break  # not enough for a full bin yet
            bins.append(tuple(self._small[:taken]))
            del self._small[:taken]
        if bins:
            self._plans[epoch] = tuple(bins)
        return CompactionState(tuple(self._small), dict(self._plans))

    # ------------------------------------------------------------------ queries
    def bin_for(self, epoch: int, subtask: int) -> Bin:
        """The bin of ``subtask`` in ``epoch`` (rule 2; empty: none)."""
        bins = self._plans.get(epoch, ())
        return bins[subtask] if subtask < len(bins) else ()

    @property
    def small_files(self) -> int:
        return len(self._small)


def _paths(files: Bin) -> tuple[str, ...]:
    return tuple(f.path for f in files)


def bin_paths(files: Bin) -> tuple[str, ...]:
    """A bin as its events name it (rule 2)."""
    return _paths(files)


def rewrite(location: str, job_id: str, epoch: int, subtask: int, attempt: int, schema: Any,
            inputs: tuple[str, ...], *, target_file_bytes: int,
            storage_options: Mapping[str, Any] | None = None) -> FilesCompacted:
    """Rewrite ``inputs`` (files of the table at ``location``) into files of the target size
    named as ``epoch``'s data files of ``subtask`` (rule 3). Spark task thread, after the
    task's rows. An input that is gone gives a report with no outputs; what was written is
    deleted."""
    import pyarrow.parquet as pq
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(location, **dict(storage_options or {}))
    writer = TaskFileWriter(location, job_id, epoch, subtask, attempt, schema,
                            target_file_bytes=target_file_bytes, filesystem=fs,
                            storage_options=storage_options)
    try:
        for path in inputs:
            try:
                with fs.open(f"{str(root).rstrip('/')}/{path}", "rb") as handle:
                    table = pq.read_table(handle)
            except FileNotFoundError:
                log.warning("compaction: %s of epoch %d is gone from the table's storage; "
                            "its bin of %d file(s) is not compacted", path, epoch,
                            len(inputs))
                writer.abort()
                return FilesCompacted(inputs, ())
            writer.write(table)
        return FilesCompacted(inputs, tuple(writer.close()))
    except BaseException:
        writer.abort()
        raise
