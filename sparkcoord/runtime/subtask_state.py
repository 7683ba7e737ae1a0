"""Subtask state files: what a subtask stored at the end of each batch, read back by its next
batch, a retry or a restore.

Layout under the job's checkpoint root: ``state/<operator>/<index>/<epoch>.state``.

Rules:
  1. A state is written atomically (temporary name, rename); a retry of the batch overwrites
     it.
  2. A subtask restores the newest state from an epoch *before* the batch it runs.
  3. After a write, states older than the ``retain`` newest before it are deleted: Spark only
     ever reruns its newest batch, so the directory stays at ``retain + 1`` files whatever the
     number of past epochs.

This module runs in Spark's Python workers and imports nothing heavy (see
:mod:`sparkcoord.runtime.files`).

Thread model: one store per job per Python worker process; a worker runs one task at a time.
"""

from __future__ import annotations

import posixpath

from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import decode_subtask_state, encode_subtask_state
from sparkcoord.runtime.files import Files, files_for


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
    def for_url(cls, url: str, *, retain: int = 3, fsync: bool = False) -> SubtaskStateStore:
        """The store of the job at ``url`` (a subtask's task, executor Python worker)."""
        files, root = files_for(url)
        return cls(files, root, retain=retain, fsync=fsync)

    def directory(self, subtask: SubtaskId) -> str:
        return posixpath.join(self.root, "state", subtask.operator, str(subtask.index))

    def path(self, subtask: SubtaskId, epoch: int) -> str:
        return posixpath.join(self.directory(subtask), f"{epoch}.state")

    def write(self, subtask: SubtaskId, epoch: int, state: bytes) -> None:
        """Store ``subtask``'s state at the end of the batch of ``epoch``, then prune (rule 3).

        Called by the subtask's task at the end of its batch (executor Python worker)."""
        self.files.write_atomic(self.path(subtask, epoch), encode_subtask_state(epoch, state),
                                fsync=self.fsync)
        known = self._known_epochs.pop(subtask, None)
        if known is None:
            known = self.epochs(subtask)
        older = sorted(e for e in known if e < epoch)
        for stale in older[:-self.retain]:
            self.files.remove(self.path(subtask, stale))

    def read_before(self, subtask: SubtaskId, before_epoch: int) -> tuple[int, bytes] | None:
        """The newest state of ``subtask`` from an epoch before ``before_epoch``, if any.

        Called by the subtask's task at the start of its batch (executor Python worker)."""
        epochs = self.epochs(subtask)
        self._known_epochs[subtask] = epochs  # the write at the end of the batch prunes with it
        older = [e for e in epochs if e < before_epoch]
        if not older:
            return None
        path = self.path(subtask, max(older))
        return decode_subtask_state(self.files.read(path), path)

    def remove(self, subtask: SubtaskId, epoch: int) -> None:
        """Delete one state file, if present (retention on the driver)."""
        self.files.remove(self.path(subtask, epoch))

    def epochs(self, subtask: SubtaskId) -> list[int]:
        """The epochs that have a state file for ``subtask`` (one listing)."""
        epochs = []
        for base in self.files.names(self.directory(subtask)):
            if base.endswith(".state") and base[:-6].lstrip("-").isdigit():
                epochs.append(int(base[:-6]))
        return epochs
