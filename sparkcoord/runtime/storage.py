"""Checkpoint storage: records, inbound logs and subtask state of one job, in a local directory
(``os`` calls) or under any fsspec URL.

The directory's layout and names: :mod:`sparkcoord.runtime.layout`.

Rules:
  1. A record is written to a temporary name and renamed over the final one; a record for an
     epoch Spark never logged is garbage and is overwritten (stores whose rename refuses to
     overwrite get the old file deleted first).
  2. Inbound log appends are flushed to the operating system before they return (a killed
     process loses nothing acknowledged); ``fsync=True`` also survives a machine crash.
  3. Retention: at ``notify complete(N)`` records older than the newest ``retain`` are pruned,
     never N itself; inbound logs older than N are pruned. Pruning deletes by name, so its cost
     does not grow with the number of past epochs. A state part (core/stored.py) is written
     before the first record that refers to it, at most once per run, and deleted once no
     record present refers to it; the first pruning of a run also deletes parts no record
     refers to (left by a run that died between writing a part and its record).
  4. Everything a restore reads is verified, and a file of an epoch that must exist is an error
     when missing (docs/protocol.md [restore-reads-only-verified-files] [log-seal]): the record
     of the restore point; the inbound log of a committed batch (created empty when its epoch
     was sealed, so it exists whenever Spark logged the epoch), which must consist of
     complete, intact frames (all of them were acknowledged before the batch could commit) and
     match its seal, written when the service learnt that the batch committed (a crash before
     that leaves no seal: then the frames alone are checked). A state part is checked against
     its name (its SHA-256).
  5. A run that lost the job's lease writes nothing more (runtime/lease.py rule 3): the fence
     is checked before a record is written (the seal then starts the epoch's inbound log)
     and before an inbound log is sealed; the service checks it as it restores, before it
     starts or truncates a log. Twice per epoch; appends are not checked (a store request per
     event): at most the appends of the epoch in flight, of a run another driver took over
     from another machine, come after.

Thread model: one writer per job (the coordination service); records and state may be read
from any thread or process. Inbound appends happen inside the service's critical section.
"""

from __future__ import annotations

import json
import os
import posixpath
import threading
import weakref
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkcoord.core.entries import ClientRequestEntry, ClientResponseEntry, LogEntry
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import (
    CheckpointRecord,
    LogSeal,
    decode_checkpoint,
    decode_log,
    decode_log_seal,
    encode_checkpoint,
    encode_log_seal,
)
from sparkcoord.core.stored import StoredOnce, snapshot_parts
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import Files, FsspecFiles, LocalFiles, files_for
from sparkcoord.runtime.subtask_state import SubtaskStateStore

if TYPE_CHECKING:
    from sparkcoord.runtime.lease import LeaseFence


class RecordNotFound(CorruptRecord):
    """A record, log or state file that must exist for the restore does not."""


class CheckpointStorage:
    """Reads and writes the files of one job's checkpoint directory."""

    def __init__(self, url: str, *, retain: int = 3, fsync: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        # os calls for a local directory: fsspec is not even imported then (its import is
        # ~25 ms of every source runner's start and restart:
        # docs/decisions/085-compiled-bench-local-files.md)
        files, root = files_for(url, storage_options)
        self.files: Files = files
        self._local = isinstance(files, LocalFiles)
        self.url = url
        self.root = root
        self.retain = retain
        self.fsync = fsync
        self._log_epoch: int | None = None
        self._log_file: Any = None
        self._segments = 0
        # length and CRC-32 of the inbound logs this process wrote or verified, by epoch,
        # until their batch commits and the seal is written
        self._log_sums: dict[int, tuple[int, int]] = {}
        self._pruned_below: int | None = None
        # rule 3's state parts: the parts each record present refers to (None until the first
        # pruning of this run reads the records), the parts present, and the parts alive in
        # this process (a coordinator reset to a record gets the objects it already holds)
        self._parts_lock = threading.Lock()
        self._record_parts: dict[int, frozenset[str]] | None = None
        self._parts_present: set[str] = set()
        self._parts_alive: weakref.WeakValueDictionary[str, StoredOnce[Any]] = (
            weakref.WeakValueDictionary())
        self.states = SubtaskStateStore(self.files, self.root, retain=retain, fsync=fsync)
        #: rule 5: the lease generation this run writes under (set by the source runner as
        #: its run starts; None: no fence)
        self.fence: LeaseFence | None = None
        files.makedirs(self._path(layout.RECORDS))
        files.makedirs(self._path(layout.INBOUND))

    @property
    def fs(self) -> Any:
        """The directory's fsspec filesystem, for tools and tests (any thread, any time). For a
        local directory it is made (and fsspec imported) only when asked for."""
        if isinstance(self.files, FsspecFiles):
            return self.files.fs
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem()

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy (to read state); open handles stay behind.
        state = self.__dict__.copy()
        state["_log_file"] = None
        state["_log_epoch"] = None
        state["fence"] = None  # executors write no record nor log
        return state

    def check_fence(self) -> None:
        """Rule 5: raise :class:`~sparkcoord.core.lease.LeaseLost` if a newer run took the
        job's lease over. Called before each write of a record or of an inbound log's start,
        truncation or seal (the service's threads), and by the service as it restores."""
        if self.fence is not None:
            self.fence.check()

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # -------------------------------------------------------------------------- records
    def record_path(self, epoch: int) -> str:
        return self._path(layout.RECORDS, layout.record_name(epoch))

    def write_record(self, record: CheckpointRecord,
                     parts: dict[str, StoredOnce[Any]] | None = None) -> None:
        """Write ``record`` atomically, replacing any garbage record of the same epoch, after
        the state parts its snapshots refer to (``parts``; rule 3: each written once)."""
        self.check_fence()
        names = frozenset(n for snapshot in record.snapshots.values()
                          for n in snapshot_parts(snapshot))
        with self._parts_lock:
            for name in sorted(names):
                part = (parts or {}).get(name)
                if name in self._parts_present:
                    continue
                if part is None:
                    raise ValueError(f"the record of epoch {record.epoch} refers to state part "
                                     f"{name}, which was not handed over to be written")
                self.files.write_atomic(self.part_path(name), part.data, fsync=self.fsync)
                self._parts_present.add(name)
                self._parts_alive[name] = part
            self.files.write_atomic(self.record_path(record.epoch), encode_checkpoint(record),
                                    fsync=self.fsync)
            if self._record_parts is not None:
                self._record_parts[record.epoch] = names

    def part_path(self, name: str) -> str:
        return self._path(layout.PARTS, name)

    def read_part(self, name: str) -> StoredOnce[Any]:
        """The state part ``name``, checked (rule 4). Called while a coordinator's snapshot is
        loaded (its mailbox thread) or by ``inspect``; the object alive in this process when
        there is one (parts are immutable)."""
        part = self._parts_alive.get(name)
        if part is not None:
            return part
        path = self.part_path(name)
        try:
            data = self.files.read(path)
        except FileNotFoundError:
            raise RecordNotFound(f"state part {name} not found at {path}") from None
        try:
            part = StoredOnce.read_back(name, data)
        except CorruptRecord as exc:
            raise CorruptRecord(f"{path}: {exc}") from None
        with self._parts_lock:
            self._parts_present.add(name)
            self._parts_alive[name] = part
        return part

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
        return self._path(layout.INBOUND, layout.log_name(epoch))

    def _segment_dir(self, epoch: int) -> str:
        return self._path(layout.INBOUND, str(epoch))

    def _seal_path(self, epoch: int) -> str:
        return self._path(layout.INBOUND, layout.seal_name(epoch))

    def start_inbound_log(self, epoch: int, initial: bytes = b"") -> None:
        """Begin the inbound log of ``epoch`` holding only ``initial`` (framed entries; empty
        by default), discarding any garbage one.

        Called by the service (driver thread) when ``epoch`` is sealed, before its offset is
        handed to Spark, and at a restore to an uncommitted epoch (with the entries it keeps,
        docs/protocol.md [rerun-keeps-answered-histories]): so the log of every epoch Spark
        logged exists (rule 4). A local log is replaced atomically (a new file renamed over
        the old one); on an object store the old segments are deleted first, then the
        ``begin`` object is written with ``initial``.
        The fence (rule 5) was checked just before: by the record's write at a seal, by the
        service at a restore."""
        if self._local:
            if self._log_epoch == epoch:
                self._close_log()
            self._log_sums.pop(epoch, None)
            self.files.remove(self._seal_path(epoch))
            self.files.write_atomic(self._log_path(epoch), initial, fsync=self.fsync)
            self._log_epoch = epoch
            self._log_file = self._open_log(epoch)
        else:
            self.truncate_inbound_log(epoch)
            self._log_epoch = epoch
            # an object store has no empty directories: this object says the log exists
            self.files.write_atomic(posixpath.join(self._segment_dir(epoch), layout.SEGMENTS_BEGIN), initial,
                                    fsync=self.fsync)
        self._segments = 0
        self._log_sums[epoch] = (len(initial), zlib.crc32(initial))

    def read_uncommitted_inbound_log(self, epoch: int) -> list[LogEntry]:
        """The entries of the inbound log of ``epoch``, whose batch Spark logged but did not
        commit: a missing log reads as empty, a torn last frame (never acknowledged) is
        dropped, any other damage raises :class:`CorruptRecord` naming the file. Called by the
        service (driver thread) at a restore to an uncommitted epoch."""
        try:
            parts = self._log_parts(epoch)
        except RecordNotFound:
            return []
        data = b"".join(part for _, part in parts)
        where = parts[0][0] if len(parts) == 1 else self._segment_dir(epoch)
        return decode_log(data, where, allow_torn_tail=True)[0]

    def append_inbound(self, epoch: int, frame: bytes) -> None:
        """Append one framed entry to the log of ``epoch`` and flush it (critical section)."""
        if self._log_epoch != epoch:
            self.reopen_inbound_log(epoch)
        if self._local:
            f = self._log_file
            written = f.write(frame)  # unbuffered: one write(2), in the OS when it returns
            while written < len(frame):  # a short write (rare): the rest, or an OSError
                written += f.write(memoryview(frame)[written:])
            if self.fsync:
                os.fsync(f.fileno())
        else:
            self.files.write_atomic(
                posixpath.join(self._segment_dir(epoch), layout.segment_name(self._segments)), frame,
                fsync=self.fsync)
            self._segments += 1
        length, crc = self._log_sums.get(epoch, (0, 0))
        self._log_sums[epoch] = (length + len(frame), zlib.crc32(frame, crc))

    def _open_log(self, epoch: int) -> Any:
        # kept open for the epoch; unbuffered, so an append is one system call (no flush)
        return open(self._log_path(epoch), "ab", buffering=0)  # noqa: SIM115

    def reopen_inbound_log(self, epoch: int) -> None:
        """Continue appending to an existing log of ``epoch`` (after a restore)."""
        self._close_log()
        self._log_epoch = epoch
        if self._local:
            self._log_file = self._open_log(epoch)
        else:
            self._segments = len(self._segment_names(epoch))
        if epoch not in self._log_sums:
            data = b"".join(part for _, part in self._log_parts(epoch))
            self._log_sums[epoch] = (len(data), zlib.crc32(data))

    def _segment_names(self, epoch: int) -> list[str]:
        return sorted(n for n in self.files.names(self._segment_dir(epoch)) if n.endswith(layout.SEGMENT_SUFFIX))

    def _log_parts(self, epoch: int) -> list[tuple[str, bytes]]:
        """The log of ``epoch`` as (file, bytes) parts in order; RecordNotFound if missing."""
        path = self._log_path(epoch)
        try:
            return [(path, self.files.read(path))]
        except FileNotFoundError:
            pass
        seg_dir = self._segment_dir(epoch)
        names = self.files.names(seg_dir)
        if layout.SEGMENTS_BEGIN not in names:
            raise RecordNotFound(
                f"{path}: the inbound log of epoch {epoch} is missing. It is created when the "
                f"epoch is sealed, before Spark logs the epoch, and only a later completion "
                f"prunes it, so it must exist for the restore of epoch {epoch} (was the "
                f"checkpoint directory damaged, or copied in part?)")
        segments = sorted(n for n in names if n.endswith(layout.SEGMENT_SUFFIX))
        expected = [layout.segment_name(i) for i in range(len(segments))]
        if segments != expected:
            missing = sorted(set(expected) - set(segments))[:1] or expected[-1:]
            raise RecordNotFound(f"{seg_dir}: segment {missing[0]} of the inbound log of epoch "
                                 f"{epoch} is missing (segments are numbered from 0 without gaps)")
        begin = posixpath.join(seg_dir, layout.SEGMENTS_BEGIN)
        # the entries a restore kept (docs/protocol.md [rerun-keeps-answered-histories]),
        # usually none
        head = self.files.read(begin)
        return ([(begin, head)] if head else []) + [
            (posixpath.join(seg_dir, n), self.files.read(posixpath.join(seg_dir, n)))
            for n in segments]

    def read_inbound_log(self, epoch: int, *, remember: bool = False) -> list[LogEntry]:
        """Every entry of the inbound log of the committed batch of ``epoch``, verified.

        Called by the service (driver thread) when it restores to committed ``epoch``, with
        ``remember`` (the verified length and CRC-32 are kept for the seal written at its
        completion), and by tools and tests (any thread; nothing kept). Raises :class:`RecordNotFound` if the log is missing and
        :class:`CorruptRecord` for a damaged or short frame, or a log that does not match its
        seal; each error names the file, the epoch and what was expected (rule 4).
        """
        parts = self._log_parts(epoch)
        where = (parts[0][0] if parts and parts[0][0].endswith(layout.LOG_SUFFIX)
                 else self._segment_dir(epoch))
        seal_path = self._seal_path(epoch)
        try:
            seal = decode_log_seal(self.files.read(seal_path), seal_path)
        except FileNotFoundError:
            seal = None  # the run crashed before it learnt that the batch committed
        if seal is None:
            entries: list[LogEntry] = []
            length, crc = 0, 0
            for name, data in parts:
                entries.extend(decode_log(data, name)[0])
                length += len(data)
                crc = zlib.crc32(data, crc)
        else:
            # The seal covers what the batch logged; a client of the job may have appended
            # requests after the batch committed (docs/protocol.md
            # [client-requests-logged-in-current-epoch]): whole client frames, of which the
            # last may be torn (it was never answered) and is cut off here.
            data = b"".join(part for _, part in parts)
            prefix = data[:seal.length]
            entries = decode_log(prefix, where)[0]  # a damaged frame is named first
            if (seal.epoch, len(prefix), zlib.crc32(prefix)) != (epoch, seal.length, seal.crc32):
                raise CorruptRecord(
                    f"{where}: the inbound log of epoch {epoch} holds {len(prefix)} bytes with "
                    f"CRC-32 {zlib.crc32(prefix):#010x}, but its seal {seal_path} says epoch "
                    f"{seal.epoch}, {seal.length} bytes, CRC-32 {seal.crc32:#010x} (frames are "
                    f"missing or the log was cut at a frame boundary)")
            after, valid = decode_log(data[seal.length:], f"{where} (after its seal)",
                                      allow_torn_tail=True)
            stray = next((e for e in after if not isinstance(
                e, (ClientRequestEntry, ClientResponseEntry))), None)
            if stray is not None:
                raise CorruptRecord(f"{where}: the inbound log of epoch {epoch} holds a "
                                    f"{type(stray).__name__} after its seal (only client "
                                    f"requests may follow a committed batch's entries)")
            entries.extend(after)
            length = seal.length + valid
            crc = zlib.crc32(data[:length])
            if remember and length < len(data):
                self._cut_torn_tail(epoch, length)
        if remember:
            self._log_sums[epoch] = (length, crc)
        return entries

    def _cut_torn_tail(self, epoch: int, length: int) -> None:
        # Before anything is appended after it: a torn last frame (a client request the
        # crash cut short, never answered) is cut off, so that later appends follow whole
        # frames. On an object store (segments are written whole, so this is damage rather
        # than a crash) the last segment is rewritten with its whole frames.
        if self._log_epoch == epoch:
            self._close_log()
        if self._local:
            os.truncate(self._log_path(epoch), length)
            return
        parts = self._log_parts(epoch)
        start = sum(len(data) for _, data in parts[:-1])
        name, data = parts[-1]
        self.files.write_atomic(name, data[:max(0, length - start)], fsync=self.fsync)

    def seal_inbound_log(self, epoch: int) -> None:
        """The batch of ``epoch`` committed: record its log's length and CRC-32 (rule 4).

        Called by the service (driver thread) at the completion of ``epoch``, after the inbound
        gate stopped admitting events of that epoch. Nothing if this process neither wrote nor
        verified the log (it then knows nothing to record)."""
        self.check_fence()
        sums = self._log_sums.pop(epoch, None)
        if sums is None:
            return
        for older in [e for e in self._log_sums if e < epoch]:
            del self._log_sums[older]
        self.files.write_atomic(self._seal_path(epoch),
                                encode_log_seal(LogSeal(epoch, sums[0], sums[1])),
                                fsync=self.fsync)

    def truncate_inbound_log(self, epoch: int) -> None:
        """Delete the inbound log of ``epoch`` (and any seal of it) durably."""
        if self._log_epoch == epoch:
            self._close_log()
        self._log_sums.pop(epoch, None)
        for path in (self._log_path(epoch), self._segment_dir(epoch), self._seal_path(epoch)):
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

    def read_subtask_state(self, subtask: SubtaskId, before_epoch: int,
                           previous_epoch: int | None = None) -> tuple[int, bytes] | None:
        """The newest state of ``subtask`` from an epoch before ``before_epoch``, if any; see
        :meth:`SubtaskStateStore.read_before` (tools and tests, any thread)."""
        return self.states.read_before(subtask, before_epoch, previous_epoch)

    # --------------------------------------------------------------------------- failures
    def failure_path(self) -> str:
        return self._path(layout.FAILURE_REPORT)

    def record_failure(self, run_id: str, cause: str) -> None:
        """Keep the cause of run ``run_id``'s global failure for the job runner, which reads it
        with :func:`read_failure` to report the cause (with the user's traceback) instead of
        Spark's wrapper text. Called once per failed run by the service (any thread)."""
        self.files.write_atomic(self.failure_path(),
                                json.dumps({"run": run_id, "cause": cause}).encode())

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
                self.files.remove(self._seal_path(epoch))
        for sid in operators:
            for epoch in range(start, keep_from - 1):
                self.states.remove(sid, epoch)
        self._pruned_below = max(start, keep_from)
        self._prune_parts(keep_from)

    def _prune_parts(self, keep_from: int) -> None:
        # Rule 3, under the lock that writes parts with their record: a part written for a
        # record not yet written is never seen here without that record.
        with self._parts_lock:
            if self._record_parts is None:
                # once per run: what the records present refer to, and the parts present
                self._record_parts = {}
                for epoch in self.record_epochs():
                    try:
                        record = self.read_record(epoch)
                    except CorruptRecord:
                        continue  # garbage no restore reads: it refers to nothing we keep
                    self._record_parts[epoch] = frozenset(
                        n for snapshot in record.snapshots.values()
                        for n in snapshot_parts(snapshot))
                self._parts_present |= {n for n in self.files.names(self._path(layout.PARTS))
                                        if not n.startswith(".")}
            for epoch in [e for e in self._record_parts if e < keep_from]:
                del self._record_parts[epoch]
            live: set[str] = set().union(*self._record_parts.values())
            for name in self._parts_present - live:
                self.files.remove(self.part_path(name))
                self._parts_alive.pop(name, None)
            self._parts_present &= live

    def record_epochs(self) -> list[int]:
        """The epochs that have a record, ascending (one listing; tools and tests, any thread)."""
        epochs = []
        for base in self.files.names(self._path(layout.RECORDS)):
            epoch = layout.epoch_in(base, layout.RECORD_SUFFIX)
            if epoch is not None:
                epochs.append(epoch)
        return sorted(epochs)

    def _oldest_record_epoch(self, upto: int) -> int:
        # One listing per run, bounded by retention plus garbage; never repeated.
        return min([e for e in self.record_epochs() if e < upto], default=upto)

    def close(self) -> None:
        self._close_log()
