"""The inbound logs of a job's checkpoint directory: begun at a seal, appended to inside the
service's critical section, verified at a restore, sealed at a commit.

:class:`InboundLogs` holds :class:`~sparkcoord.runtime.storage.CheckpointStorage`'s inbound-log
methods; the storage (``runtime/storage.py``) is made of it and of the records, the state parts,
the subtask state and retention, so the logs read apart from the rest (no import circle: this
module imports nothing of the storage). The rules are the storage's, numbered there; the ones
this module's code carries out are stated here with it:

  2. (storage rule 2) Inbound log appends are flushed to the operating system before they
     return (a killed process loses nothing acknowledged); ``fsync=True`` also survives a
     machine crash. A local log is one file, kept open for its epoch and appended to with one
     unbuffered write; on an object store each append is a segment, numbered from 0 without
     gaps after the ``begin`` object that says the log exists.
  4. (storage rule 4, for the logs) The inbound log of a committed batch (created empty when
     its epoch was sealed, so it exists whenever Spark logged the epoch) must consist of
     complete, intact frames (all of them were acknowledged before the batch could commit)
     and match its seal, written when the service learnt that the batch committed (a crash
     before that leaves no seal: then the frames alone are checked); after the seal only
     whole client frames may follow, the last maybe torn. The log of an uncommitted epoch
     reads as empty when missing, its torn last frame dropped.

Thread model: as the storage's: one writer per job (the coordination service); appends happen
inside the service's critical section.
"""

from __future__ import annotations

import os
import posixpath
import zlib
from typing import TYPE_CHECKING, Any

from sparkcoord.core.entries import ClientRequestEntry, ClientResponseEntry, LogEntry
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.records import LogSeal, decode_log, decode_log_seal, encode_log_seal
from sparkcoord.runtime import layout

if TYPE_CHECKING:
    from sparkcoord.runtime.files import Files


class RecordNotFound(CorruptRecord):
    """A record, log or state file that must exist for the restore does not."""


class InboundLogs:
    """The inbound-log methods of :class:`~sparkcoord.runtime.storage.CheckpointStorage`
    (storage rules 2 and 4); not used alone."""

    # what the log methods use of the storage (``storage.py``), for the type checker
    files: Files
    fsync: bool
    _local: bool
    _log_epoch: int | None
    _log_file: Any
    _segments: int
    #: length and CRC-32 of the inbound logs this process wrote or verified, by epoch, until
    #: their batch commits and the seal is written
    _log_sums: dict[int, tuple[int, int]]

    if TYPE_CHECKING:
        def _path(self, *parts: str) -> str: ...
        def check_fence(self) -> None: ...

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
