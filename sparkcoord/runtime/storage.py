"""Checkpoint storage: records, inbound logs and subtask state of one job, in a local directory
(``os`` calls) or under any fsspec URL.

The directory's layout and names: :mod:`sparkcoord.runtime.layout`.

Rules:
  1. A record is written to a temporary name and renamed over the final one; a record for an
     epoch Spark never logged is garbage and is overwritten (stores whose rename refuses to
     overwrite get the old file deleted first).
  2. Inbound log appends are flushed to the operating system before they return (a killed
     process loses nothing acknowledged); ``fsync=True`` also survives a machine crash. The
     inbound logs' code, with this rule and rule 4's part for the logs stated in full, is
     ``runtime/inbound_logs.py``, of which :class:`CheckpointStorage` is made.
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
     complete, intact frames and match its seal (``runtime/inbound_logs.py`` rule 4). A state
     part is checked against its name (its SHA-256).
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
import posixpath
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import CheckpointRecord, decode_checkpoint, encode_checkpoint
from sparkcoord.core.stored import StoredOnce, snapshot_parts
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import Files, FsspecFiles, LocalFiles, files_for
from sparkcoord.runtime.inbound_logs import InboundLogs

# moved to the inbound logs' module with their code, and importable from here (``X as X``: a
# re-export; docs/decisions/106-inbox-modules-and-value-compare.md)
from sparkcoord.runtime.inbound_logs import RecordNotFound as RecordNotFound
from sparkcoord.runtime.subtask_state import SubtaskStateStore

if TYPE_CHECKING:
    from sparkcoord.runtime.lease import LeaseFence


class CheckpointStorage(InboundLogs):
    """Reads and writes the files of one job's checkpoint directory (its inbound logs:
    :class:`~sparkcoord.runtime.inbound_logs.InboundLogs`)."""

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
