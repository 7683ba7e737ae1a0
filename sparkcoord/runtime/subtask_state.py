"""Subtask state files: what a subtask stored at the end of each batch, read back by its next
batch, a retry or a restore.

Layout under the job's checkpoint root: ``state/<operator>/<index>/<epoch>.state`` and
``state/<operator>/<index>/lineage``.

Rules:
  1. A state is written atomically (temporary name, rename); a retry of the batch overwrites
     it.
  2. A subtask restores the newest state from an epoch *before* the batch it runs.
  3. After a write, states older than the ``retain`` newest before it are deleted: Spark only
     ever reruns its newest batch, so the directory stays at ``retain + 1`` files whatever the
     number of past epochs.
  4. A missing state is an error, never a silent step back (docs/protocol.md
     [missing-state-is-an-error]). A subtask that once wrote a state writes one in every later
     batch it runs, so: (a) the first state of a subtask is preceded by a ``lineage`` marker
     naming its epoch, and a subtask with a marker but no state before the batch it runs has
     lost its state (a stateless subtask has no marker); (b) the caller passes the epoch of the
     subtask's previous batch when it knows it (a source subtask runs in every batch of its
     source, to its end, as long as the query consumes the source fully): if states exist but
     none for that epoch, the newest one is missing. Downstream subtasks pass none (Spark may
     leave them out of a batch).

This module runs in Spark's Python workers and imports nothing heavy (see
:mod:`sparkcoord.runtime.files`).

Thread model: one store per job per Python worker process; a worker runs one task at a time.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import (
    decode_state_lineage,
    decode_subtask_state,
    encode_state_lineage,
    encode_subtask_state,
)
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import Files, files_for


class StateMissing(CorruptRecord):
    """A subtask kept state, but the state file its batch must restore from is gone."""


class SubtaskStateStore:
    """Reads and writes the state files of the subtasks of one job."""

    def __init__(self, files: Files, root: str, *, retain: int = 3, fsync: bool = False) -> None:
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        self.files = files
        self.root = root
        self.retain = retain
        self.fsync = fsync
        # the listing a read made, reused by the write at the end of the same batch
        self._known_epochs: dict[SubtaskId, list[int]] = {}

    @classmethod
    def for_url(cls, url: str, *, retain: int = 3, fsync: bool = False,
                storage_options: dict[str, Any] | None = None) -> SubtaskStateStore:
        """The store of the job at ``url`` (a subtask's task, executor Python worker)."""
        files, root = files_for(url, storage_options)
        return cls(files, root, retain=retain, fsync=fsync)

    def directory(self, subtask: SubtaskId) -> str:
        return posixpath.join(self.root, layout.STATE, subtask.operator, str(subtask.index))

    def path(self, subtask: SubtaskId, epoch: int) -> str:
        return posixpath.join(self.directory(subtask), layout.state_name(epoch))

    def write(self, subtask: SubtaskId, epoch: int, state: bytes) -> None:
        """Store ``subtask``'s state at the end of the batch of ``epoch``, then prune (rule 3).

        Called by the subtask's task at the end of its batch (executor Python worker)."""
        known = self._known_epochs.pop(subtask, None)
        if known is None:
            known = self.epochs(subtask)
        older = sorted(e for e in known if e < epoch)
        if not older:  # the subtask's first state: from now on a missing state is a loss
            self.files.write_atomic(self.lineage_path(subtask), encode_state_lineage(epoch),
                                    fsync=self.fsync)
        self.files.write_atomic(self.path(subtask, epoch), encode_subtask_state(epoch, state),
                                fsync=self.fsync)
        for stale in older[:-self.retain]:
            self.files.remove(self.path(subtask, stale))

    def lineage_path(self, subtask: SubtaskId) -> str:
        return posixpath.join(self.directory(subtask), layout.LINEAGE)

    def read_before(self, subtask: SubtaskId, before_epoch: int,
                    previous_epoch: int | None = None) -> tuple[int, bytes] | None:
        """The newest state of ``subtask`` from an epoch before ``before_epoch``; None for a
        stateless subtask. ``previous_epoch``: the epoch (or batch) of the subtask's previous
        batch, if the caller knows it.

        Called by the subtask's task at the start of its batch (executor Python worker).
        Raises :class:`StateMissing` when the state it must restore is gone (rule 4) and
        :class:`CorruptRecord` for a damaged file, naming the file and the epochs.
        """
        epochs = self.epochs(subtask)
        self._known_epochs[subtask] = epochs  # the write at the end of the batch prunes with it
        older = [e for e in epochs if e < before_epoch]
        if not older:
            lineage = self.lineage_path(subtask)
            try:
                since = decode_state_lineage(self.files.read(lineage), lineage)
            except FileNotFoundError:
                return None  # never wrote a state: a stateless subtask
            if since < before_epoch:
                raise StateMissing(
                    f"{self.directory(subtask)}: {subtask} has kept state since epoch {since} "
                    f"({lineage}), but no state file from before epoch {before_epoch} is left "
                    f"(expected {self.path(subtask, previous_epoch if previous_epoch is not None else since)})")
            return None  # a rerun of (or a batch before) the subtask's first stateful batch
        newest = max(older)
        if previous_epoch is not None and newest < previous_epoch < before_epoch:
            raise StateMissing(
                f"{self.path(subtask, previous_epoch)} is missing: {subtask} ran the batch of "
                f"epoch {previous_epoch} with state (its newest state file left is from epoch "
                f"{newest}), so the batch of epoch {before_epoch} must restore that state. "
                f"Either the file was deleted, or that batch did not run the subtask's task to "
                f"its end (a coordinated source must be consumed fully: no limit(), take() or "
                f"first() on it in foreachBatch); its events may be lost either way")
        path = self.path(subtask, newest)
        return decode_subtask_state(self.files.read(path), path)

    def remove(self, subtask: SubtaskId, epoch: int) -> None:
        """Delete one state file, if present (retention on the driver)."""
        self.files.remove(self.path(subtask, epoch))

    def epochs(self, subtask: SubtaskId) -> list[int]:
        """The epochs that have a state file for ``subtask`` (one listing)."""
        epochs = []
        for base in self.files.names(self.directory(subtask)):
            epoch = layout.epoch_in(base, layout.STATE_SUFFIX)
            if epoch is not None:
                epochs.append(epoch)
        return epochs
