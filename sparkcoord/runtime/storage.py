"""Checkpoint storage on fsspec: records, inbound logs and subtask state of one job.

Layout under the job's checkpoint URL (local path by default; any fsspec URL for clusters):

    records/<epoch>.ckpt                       checkpoint record of an epoch
    inbound/<epoch>.log                        inbound log of the batch of an epoch (local fs)
    inbound/<epoch>/<n>.seg                    the same as segments (stores without append)
    state/<operator>/<index>/<epoch>.state     a subtask's state at the end of an epoch's batch

Rules:
  1. A record is written to a temporary name and renamed over the final one; a record for an
     epoch Spark never logged is garbage and is overwritten (stores whose rename refuses to
     overwrite get the old file deleted first).
  2. Inbound log appends are flushed to the operating system before they return (a killed
     process loses nothing acknowledged); ``fsync=True`` also survives a machine crash.
  3. Retention: at ``notify complete(N)`` records older than the newest ``retain`` are pruned,
     never N itself; inbound logs older than N are pruned. Pruning deletes by name, so its cost
     does not grow with the number of past epochs.

Thread model: one writer per job (the coordination service); records and state may be read
from any thread or process. Inbound appends happen inside the service's critical section.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.inbound import LogEntry
from sparkcoord.core.records import (
    CheckpointRecord,
    decode_checkpoint,
    decode_log,
    encode_checkpoint,
)
from sparkcoord.runtime.files import Files, FsspecFiles, LocalFiles
from sparkcoord.runtime.subtask_state import SubtaskStateStore


class RecordNotFound(CorruptRecord):
    """A record that the restore point needs does not exist."""


class CheckpointStorage:
    """Reads and writes the files of one job's checkpoint directory."""

    def __init__(self, url: str, *, retain: int = 3, fsync: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        # The driver side keeps an fsspec filesystem (tools and tests use ``fs``); the file
        # operations themselves go through ``files`` (os calls for a local directory).
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.fs = fs
        self._local = isinstance(fs, LocalFileSystem)
        self.files: Files = LocalFiles() if self._local else FsspecFiles(fs)
        self.url = url
        self.root = root.rstrip("/") or "/"
        self.retain = retain
        self.fsync = fsync
        self._log_epoch: int | None = None
        self._log_file: Any = None
        self._segments = 0
        self._pruned_below: int | None = None
        self.states = SubtaskStateStore(self.files, self.root, retain=retain, fsync=fsync)
        fs.makedirs(self._path("records"), exist_ok=True)
        fs.makedirs(self._path("inbound"), exist_ok=True)

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy (to read state); open handles stay behind.
        state = self.__dict__.copy()
        state["_log_file"] = None
        state["_log_epoch"] = None
        return state

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # -------------------------------------------------------------------------- records
    def record_path(self, epoch: int) -> str:
        return self._path("records", f"{epoch}.ckpt")

    def write_record(self, record: CheckpointRecord) -> None:
        """Write ``record`` atomically, replacing any garbage record of the same epoch."""
        self.files.write_atomic(self.record_path(record.epoch), encode_checkpoint(record),
                                fsync=self.fsync)

    def read_record(self, epoch: int) -> CheckpointRecord:
        path = self.record_path(epoch)
        try:
            data = self.files.read(path)
        except FileNotFoundError:
            raise RecordNotFound(f"checkpoint record of epoch {epoch} not found at {path}") from None
        record = decode_checkpoint(data, path)
        if record.epoch != epoch:
            raise CorruptRecord(f"{path}: holds epoch {record.epoch}, expected {epoch}")
        return record

    # ----------------------------------------------------------------------- inbound log
    def _log_path(self, epoch: int) -> str:
        return self._path("inbound", f"{epoch}.log")

    def _segment_dir(self, epoch: int) -> str:
        return self._path("inbound", str(epoch))

    def start_inbound_log(self, epoch: int) -> None:
        """Begin an empty inbound log for ``epoch``, discarding any garbage one."""
        self.truncate_inbound_log(epoch)
        self._log_epoch = epoch
        if self._local:
            self._log_file = open(self._log_path(epoch), "ab")  # noqa: SIM115 - kept open
        self._segments = 0

    def append_inbound(self, epoch: int, frame: bytes) -> None:
        """Append one framed entry to the log of ``epoch`` and flush it (critical section)."""
        if self._log_epoch != epoch:
            self.reopen_inbound_log(epoch)
        if self._local:
            f = self._log_file
            f.write(frame)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        else:
            self.files.write_atomic(
                posixpath.join(self._segment_dir(epoch), f"{self._segments:012d}.seg"), frame,
                fsync=self.fsync)
            self._segments += 1

    def reopen_inbound_log(self, epoch: int) -> None:
        """Continue appending to an existing log of ``epoch`` (after a restore)."""
        self._close_log()
        self._log_epoch = epoch
        if self._local:
            self._log_file = open(self._log_path(epoch), "ab")  # noqa: SIM115 - kept open
        else:
            self._segments = len(self.files.names(self._segment_dir(epoch)))

    def read_inbound_log(self, epoch: int) -> list[LogEntry]:
        """Every entry of the inbound log of ``epoch`` (a torn last frame is dropped)."""
        path = self._log_path(epoch)
        try:
            entries, _ = decode_log(self.files.read(path), path)
            return entries
        except FileNotFoundError:
            pass
        seg_dir = self._segment_dir(epoch)
        entries = []
        for name in sorted(self.files.names(seg_dir)):
            if name.endswith(".seg"):
                seg = posixpath.join(seg_dir, name)
                entries.extend(decode_log(self.files.read(seg), seg)[0])
        return entries

    def truncate_inbound_log(self, epoch: int) -> None:
        """Delete the inbound log of ``epoch`` durably."""
        if self._log_epoch == epoch:
            self._close_log()
        for path in (self._log_path(epoch), self._segment_dir(epoch)):
            self.files.remove(path)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._log_epoch = None

    # ---------------------------------------------------------------------- subtask state
    def write_subtask_state(self, subtask: SubtaskId, epoch: int, state: bytes) -> None:
        """Store ``subtask``'s state at the end of the batch of ``epoch`` (a retry overwrites);
        see :meth:`SubtaskStateStore.write` (executors use that store directly)."""
        self.states.write(subtask, epoch, state)

    def read_subtask_state(self, subtask: SubtaskId, before_epoch: int) -> tuple[int, bytes] | None:
        """The newest state of ``subtask`` from an epoch before ``before_epoch``, if any."""
        return self.states.read_before(subtask, before_epoch)

    # ------------------------------------------------------------------------- retention
    def prune(self, committed_epoch: int, operators: Sequence[SubtaskId] = ()) -> None:
        """At ``complete(committed_epoch)``: drop what no restore can need any more."""
        keep_from = committed_epoch - self.retain + 1
        start = self._pruned_below
        if start is None:
            start = self._oldest_record_epoch(keep_from)
        for epoch in range(start, keep_from):
            self.files.remove(self.record_path(epoch))
        for epoch in range(start, committed_epoch):
            if epoch != self._log_epoch:
                self.files.remove(self._log_path(epoch))
                self.files.remove(self._segment_dir(epoch))
        for sid in operators:
            for epoch in range(start, keep_from - 1):
                self.states.remove(sid, epoch)
        self._pruned_below = max(start, keep_from)

    def record_epochs(self) -> list[int]:
        """The epochs that have a record, ascending (one listing; tools and tests, any thread)."""
        epochs = []
        for base in self.files.names(self._path("records")):
            if base.endswith(".ckpt") and base[:-5].lstrip("-").isdigit():
                epochs.append(int(base[:-5]))
        return sorted(epochs)

    def _oldest_record_epoch(self, upto: int) -> int:
        # One listing per run, bounded by retention plus garbage; never repeated.
        return min([e for e in self.record_epochs() if e < upto], default=upto)

    def close(self) -> None:
        self._close_log()
