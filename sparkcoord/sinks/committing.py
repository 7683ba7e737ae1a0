"""The commit worker's half of the lake sink's coordinator: the open (the table's fence, the
orphan sweep), each epoch's commit and the cleanup after it (``coordinator.py`` rules 3 to
10), and the errors they fail the job with.

:class:`EpochCommits` holds the coordinator's methods that run on the commit worker's
thread; :class:`~sparkcoord.sinks.coordinator.SinkCoordinator` is made of it and of its
mailbox half (the reports, the checkpoints, the ledger, the worker's start), so the
commit's path reads apart from the mailbox's, and a subclass (a test's) overrides
``_commit`` or ``_sweep`` on the coordinator as before. No import circle: the coordinator
imports this module, this module nothing of the coordinator. A rule number alone is
``coordinator.py``'s.

:class:`FilesMissing` and :class:`ValueOutOfRange` are named
``sparkcoord.sinks.coordinator.FilesMissing`` and ``...ValueOutOfRange``, their path before
this module, which exports them: a failed job's text (``context.fail_job`` writes a permanent
error's qualified name) and a pickled error read the same as before
(docs/decisions/107-file-reading-and-sink-modules.md).

Thread model: every method here on the commit worker's thread
(``sparkcoord-commit-<operator>``), one command at a time; :func:`written_paths` and
:func:`epoch_of` are pure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import CoordinatorContext
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.runtime.kills import kill_point
from sparkcoord.sinks.changes import ChangeStreamError, reduce_changes
from sparkcoord.sinks.cleanup import (
    delete_files,
    epoch_prefix,
    files_to_delete,
    list_data_files,
)
from sparkcoord.sinks.compaction import FilesCompacted
from sparkcoord.sinks.fencing import NO_EPOCH, SinkFenceError
from sparkcoord.sinks.files import DataFile, parse_file_name, read_files
from sparkcoord.sinks.tables import TableCommitter, TableShapeError
from sparkcoord.sinks.target import SinkTarget

log = logging.getLogger("sparkcoord.sinks")

#: the module that exports these errors, and names them (see above)
EXPORTED_BY = "sparkcoord.sinks.coordinator"


class FilesMissing(SparkCoordError):
    """Data files an epoch's tasks reported are gone before its commit (rule 10); permanent:
    a restart meets the same directory."""

    permanent = True


class ValueOutOfRange(ValueError):
    """A commit that can never succeed: a value of the epoch is past its type's range
    (rule 6)."""


FilesMissing.__module__ = ValueOutOfRange.__module__ = EXPORTED_BY


class EpochCommits:
    """The commit worker's methods of :class:`~sparkcoord.sinks.coordinator.SinkCoordinator`
    (rules 3 to 10); not used alone."""

    # what the commit path uses of the coordinator (``coordinator.py``), for the type checker
    context: CoordinatorContext
    target: SinkTarget
    #: rule 9: done once the commit worker's open passed the table's fence
    _fenced: Future[None] | None
    #: the newest epoch Spark committed before the restored checkpoint (the sweep's bound)
    _final_at_start: int
    #: how long the commit that ran last took, and the files it added to the table
    _last_commit_s: float
    _last_committed_files: tuple[DataFile, ...]
    #: the committer of this start, and the newest cleaned epoch
    _committer: TableCommitter | None
    _cleaned_through: int

    def _open(self, last_committed: int, pending: list[int], held: set[str]) -> None:
        """Rule 4's fence check and rule 5's sweep (worker thread, before any commit)."""
        committer = self.target.committer()
        assert self._fenced is not None
        try:
            committer.open(last_committed, pending)
        except (SinkFenceError, TableShapeError) as e:
            self.context.fail_job(e)  # rule 6
            if not self._fenced.done():
                self._fenced.set_exception(e)  # rule 9
            raise
        if not self._fenced.done():
            self._fenced.set_result(None)  # rule 9: the sweep below need not hold it up
        self._sweep(self._final_at_start, committer.referenced_paths() | held)
        self._committer = committer
        self._cleaned_through = self._final_at_start

    def _commit(self, epoch: int, items: Sequence[Any]) -> None:
        """Rule 3's commit and rule 5's cleanup of one epoch (worker thread)."""
        started = time.perf_counter()
        kill_point("lake-committing", epoch)  # tests only
        files = [i for i in items if isinstance(i, DataFile)]
        swaps = [i for i in items if isinstance(i, FilesCompacted) and i.outputs]
        self._check_files_present(epoch, items)
        try:
            if self.target.mode == "merge":
                def load() -> Any:
                    # only for an epoch not in the table yet: once merged, the cleanup after
                    # the commit deletes the staged files, and a restore that commits the
                    # epoch again must not need them
                    staged = read_files(self.target.location, files, storage_options=dict(
                        self.target.storage_options) or None)
                    return reduce_changes(staged, self.target.table)

                decision = self._open_committer().merge(epoch, load, self.target.keys)
            else:
                decision = self._open_committer().commit(epoch, files, swaps)
        except (ChangeStreamError, SinkFenceError) as e:
            self.context.fail_job(e)  # rule 6: loud, the commit stays pending
            raise
        except OverflowError as e:  # rule 6: the same values overflow on every retry
            refused = ValueOutOfRange(
                f"sink {self.context.operator_id!r}: the commit of epoch {epoch} to table "
                f"{self.target.name} cannot succeed: a value is out of its type's range "
                f"({e}). Nothing of the epoch is in the table; the epoch stays pending. "
                f"Drop or correct the row upstream and restart from a checkpoint location "
                f"that does not hold the epoch")
            self.context.fail_job(refused)
            raise refused from e
        kill_point("lake-committed", epoch)  # tests only
        swapped = [s for s in swaps if s not in getattr(self._committer, "left_out", ())]
        log.info("sink %r: epoch %d %s to %s (%d file(s)%s)", self.context.operator_id, epoch,
                 "committed" if decision == "commit" else "was in the table already",
                 self.target.name, len(files),
                 f", {len(swapped)} compaction(s)" if swaps else "")
        added = tuple(files) + tuple(o for s in swapped for o in s.outputs)
        referenced: set[str] | None = None
        if decision != "commit":
            referenced = self._open_committer().referenced_paths()
            # compaction.py rule 1: what the table holds of this epoch's reports (a pending
            # commit restored or a replayed batch: all; a re-run batch's new files: none)
            added = tuple(f for f in added if f.path in referenced)
        self._last_committed_files = added
        if epoch > self._cleaned_through:
            # rule 7: a merge's staged files are never in the table: garbage once merged
            held = set() if self.target.mode == "merge" else {f.path for f in added}
            if referenced is not None:
                # in the table already: whatever it holds is kept, ours or not (a fence
                # that let another writer's epoch pass must still never cost its files)
                held |= referenced
            self._sweep(epoch, held, epochs=(self._cleaned_through + 1, epoch))
            self._cleaned_through = epoch
        else:
            # after a restore: an epoch pending in the restored checkpoint at or below the
            # sweep's bound (the sweep at start held what it reported, for this commit; the
            # cleanups after commits start above it): what the commit did not put in the
            # table is garbage now, a merge's staged files (rule 7) and the outputs of a
            # swap left out (rule 8)
            kept = {f.path for f in added}
            doomed = ([f.path for f in files] if self.target.mode == "merge" else
                      [o.path for s in swaps for o in s.outputs if o.path not in kept])
            if doomed:
                delete_files(self.target.location, doomed,
                             storage_options=dict(self.target.storage_options) or None)
        self._last_commit_s = time.perf_counter() - started  # read by the done report

    def _open_committer(self) -> TableCommitter:
        """The committer the worker's ``open`` made (worker thread, after it)."""
        assert self._committer is not None, "the commit worker runs commits after open"
        return self._committer

    def _check_files_present(self, epoch: int, items: Sequence[Any]) -> None:
        """Rule 10 (worker thread, before the epoch's commit): every file the epoch's tasks
        reported is still in the table's directory (one listing of the epoch's prefix), or
        the table holds the epoch already; otherwise :class:`FilesMissing` fails the job."""
        reported = {path for item in items for path in written_paths(item)}
        if not reported:
            return
        present = set(list_data_files(self.target.location,
                                      prefix=epoch_prefix(self.target.job_id, epoch),
                                      storage_options=dict(self.target.storage_options)
                                      or None))
        missing = sorted(reported - present)
        if not missing or self._open_committer().table_epoch() >= epoch:
            return  # in the table already: its maintenance may delete what it replaced
        error = FilesMissing(
            f"sink {self.context.operator_id!r}: {len(missing)} of the {len(reported)} data "
            f"file(s) the tasks wrote for epoch {epoch} are gone from table "
            f"{self.target.name} before the epoch's commit ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): something deleted files no commit "
            f"referenced yet (a Delta VACUUM with a retention of less than the job's commit "
            f"delay, an Iceberg orphan-file removal with a short older_than). The epoch was "
            f"not committed and stays pending: restore the files (object versioning, a "
            f"backup) and restart, or rebuild the table from its source. Keep maintenance "
            f"retentions above a few minutes while a job writes (docs/sinks.md, "
            f"'Maintenance while a job runs')")
        self.context.fail_job(error)
        raise error

    def _sweep(self, final_through: int, held: set[str],
               epochs: tuple[int, int] | None = None) -> None:
        """Delete what rule 5 says, of the whole data directory (``epochs`` None: the sweep at
        start) or of the files of epochs ``epochs[0]..epochs[1]`` (one prefix listing each,
        or one listing of the directory for a longer run of epochs without files)."""
        if final_through < 0:
            return
        options = dict(self.target.storage_options) or None
        job = self.target.job_id
        if epochs is None:
            listed = list_data_files(self.target.location, storage_options=options)
        else:
            low, high = epochs
            prefixes = ([epoch_prefix(job, e) for e in range(low, high + 1)]
                        if high - low < 8 else [f"sc-{job}.e"])
            listed = [path for prefix in prefixes
                      for path in list_data_files(self.target.location, prefix=prefix,
                                                  storage_options=options)
                      if low <= epoch_of(path) <= high]
        doomed = files_to_delete(self.target.job_id, listed, final_through=final_through,
                                 held=held)
        if doomed:
            deleted = delete_files(self.target.location, doomed[:1], storage_options=options)
            kill_point("lake-cleaning", final_through)  # tests only: one deleted, not all
            deleted += delete_files(self.target.location, doomed[1:], storage_options=options)
            log.info("sink %r: deleted %d data file(s) no commit holds (%s)",
                     self.context.operator_id, deleted, ", ".join(doomed[:3]))


def written_paths(item: DataFile | FilesCompacted) -> list[str]:
    """The paths of the files a ledger item's task wrote."""
    if isinstance(item, FilesCompacted):
        return [f.path for f in item.outputs]
    return [item.path]


def epoch_of(path: str) -> int:
    """The epoch in a data file's name, ``NO_EPOCH`` if it is not one of ours."""
    name = parse_file_name(path.rsplit("/", 1)[-1])
    return NO_EPOCH if name is None else name.epoch
