"""Byte formats of everything sparkcoord stores: checkpoint records, inbound logs, subtask state.

Rules:
  1. Every stored file is an *envelope*: a fixed header (magic, format version, kind, body
     length, CRC-32 of the body) and the body. A reader checks all of it before it parses a
     byte of the body, and names the file and the problem when something is off.
  2. Bodies are plain length-prefixed binary fields, not pickle: a checkpoint file is parsed
     without running code from it (event and snapshot payloads inside it stay opaque bytes
     until the user's code decodes them; a snapshot may name stored-once parts, core/stored.py).
  3. Inbound logs are a sequence of *frames* (length, CRC-32, body) appended one by one. A frame
     holds a registration (kind 0), one event (1), a run of consecutive events of one attempt
     that were accepted together (2; acknowledged together, so they are durable together), a
     request (3) or the coordinator's response to one (4; logged before the task sees it), a
     request of a client of the job (5) or its response (6), or a withdrawal (7: an attempt
     that adopted a history finished without its items from ``seq`` on, docs/protocol.md
     [every-answer-consumed-or-returned]).
  4. A frame whose checksum fails is damage wherever it is, the last frame included: an append
     that a crash cut short leaves a *short* frame, never a full-length one with other bytes in
     it. A short last frame is a torn write; only a reader that may see the log of a batch that
     never committed may drop it (``allow_torn_tail``); the restore reads only logs of
     committed batches, in which every frame was acknowledged, and there it is an error
     (docs/protocol.md [restore-reads-only-verified-files]); a restore to an uncommitted batch
     whose log holds requests keeps that log (docs/protocol.md [rerun-keeps-answered-histories])
     and may drop a torn tail.
  5. A *log seal* (written when the batch commits) records the log's length and CRC-32, so that
     a log cut at a frame boundary or missing whole frames is detected too.

Thread model: none (pure functions over bytes).
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sparkcoord.core.entries import (
    ClientRequestEntry,
    ClientResponseEntry,
    EventEntry,
    EventRunEntry,
    FinishedEntry,
    LogEntry,
    RegistrationEntry,
    RequestEntry,
    ResponseEntry,
)
from sparkcoord.core.errors import CorruptRecord, UnknownRecordVersion
from sparkcoord.core.ids import SubtaskId, TaskAttempt

MAGIC = b"SPCO"
FORMAT_VERSION = 1
KIND_CHECKPOINT = 1
KIND_SUBTASK_STATE = 2
KIND_LOG_SEAL = 3
KIND_STATE_LINEAGE = 4

_HEADER = struct.Struct(">4sHBxQI")  # magic, version, kind, pad, body length, crc32
_FRAME = struct.Struct(">II")  # body length, crc32
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_ATTEMPT = struct.Struct(">IqIQ")  # subtask index, epoch, attempt number, seq


# ------------------------------------------------------------------------------- envelope
def seal_envelope(kind: int, body: bytes) -> bytes:
    """Wrap ``body`` in a versioned, checksummed envelope."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, kind, len(body), zlib.crc32(body)) + body


def open_envelope(data: bytes, kind: int, what: str) -> memoryview:
    """Check the envelope of ``data`` (named ``what`` in errors) and return its body."""
    if len(data) < _HEADER.size:
        raise CorruptRecord(f"{what}: {len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, found_kind, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptRecord(f"{what}: not a sparkcoord file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise UnknownRecordVersion(
            f"{what}: format version {version}; this sparkcoord reads version {FORMAT_VERSION}")
    if found_kind != kind:
        raise CorruptRecord(f"{what}: holds record kind {found_kind}, expected {kind}")
    body = memoryview(data)[_HEADER.size:]
    if len(body) != length:
        raise CorruptRecord(f"{what}: body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != crc:
        raise CorruptRecord(f"{what}: checksum mismatch (file damaged)")
    return body


class _Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u32(self, v: int) -> None:
        self.parts.append(_U32.pack(v))

    def i64(self, v: int) -> None:
        self.parts.append(_I64.pack(v))

    def blob(self, b: bytes) -> None:
        self.parts.append(_U32.pack(len(b)))
        self.parts.append(b)

    def text(self, s: str) -> None:
        self.blob(s.encode())

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: memoryview, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise CorruptRecord(f"{self.what}: truncated body at byte {self.pos}")

    def u32(self) -> int:
        self._need(4)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def i64(self) -> int:
        self._need(8)
        (v,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def blob(self) -> bytes:
        n = self.u32()
        self._need(n)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def text(self) -> str:
        return self.blob().decode()

    def blobs(self, count: int) -> list[bytes]:
        """``count`` lengths, then that many payloads back to back."""
        self._need(4 * count)
        lengths = struct.unpack_from(f">{count}I", self.buf, self.pos)
        self.pos += 4 * count
        total = sum(lengths)
        self._need(total)
        data = bytes(self.buf[self.pos:self.pos + total])
        self.pos += total
        out = []
        start = 0
        for n in lengths:
            out.append(data[start:start + n])
            start += n
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise CorruptRecord(f"{self.what}: {len(self.buf) - self.pos} unexpected trailing bytes")


# ------------------------------------------------------------------------ checkpoint record
@dataclass(frozen=True)
class CheckpointRecord:
    """Checkpoint ``epoch``: coordinator snapshots at the boundary and the sealed events.

    ``events[subtask]`` is the list of encoded events that subtask receives in the batch of
    ``epoch``, in send order. Subtasks with no events may be absent.
    """

    epoch: int
    snapshots: Mapping[str, bytes | None]
    events: Mapping[SubtaskId, Sequence[bytes]] = field(default_factory=dict)

    def events_for(self, subtask: SubtaskId) -> Sequence[bytes]:
        return self.events.get(subtask, ())

    def event_count(self) -> int:
        return sum(len(v) for v in self.events.values())


def encode_checkpoint(record: CheckpointRecord) -> bytes:
    """Serialize ``record`` into an envelope."""
    w = _Writer()
    w.i64(record.epoch)
    w.u32(len(record.snapshots))
    for name, snap in record.snapshots.items():
        w.text(name)
        if snap is None:
            w.u32(0)
        else:
            w.u32(1)
            w.blob(snap)
    lists = [(sid, evs) for sid, evs in record.events.items() if evs]
    w.u32(len(lists))
    for sid, evs in lists:
        # per list: count, then every length at once, then the payloads back to back, so
        # that encoding and decoding cost one C call per list plus one slice per event
        w.text(sid.operator)
        w.u32(sid.index)
        w.u32(len(evs))
        w.parts.append(struct.pack(f">{len(evs)}I", *map(len, evs)))
        w.parts.extend(evs)
    return seal_envelope(KIND_CHECKPOINT, w.getvalue())


def decode_checkpoint(data: bytes, what: str) -> CheckpointRecord:
    """Parse a checkpoint record; raise :class:`CorruptRecord` naming ``what`` if it is bad."""
    r = _Reader(open_envelope(data, KIND_CHECKPOINT, what), what)
    epoch = r.i64()
    snapshots: dict[str, bytes | None] = {}
    for _ in range(r.u32()):
        name = r.text()
        snapshots[name] = r.blob() if r.u32() else None
    events: dict[SubtaskId, list[bytes]] = {}
    for _ in range(r.u32()):
        sid = SubtaskId(r.text(), r.u32())
        events[sid] = r.blobs(r.u32())
    r.done()
    return CheckpointRecord(epoch, snapshots, events)


# ---------------------------------------------------------------------------- inbound log
def encode_log_entry(entry: LogEntry) -> bytes:
    """One framed inbound-log entry."""
    a = entry.attempt
    if isinstance(entry, EventEntry):
        payload = entry.payload
        body = b"".join([_log_prefix(a, 1), _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, entry.seq),
                         _U32.pack(len(payload)), payload])
    elif isinstance(entry, EventRunEntry):
        # a run of events under one frame and one checksum: count, every length, the payloads
        payloads = entry.payloads
        n = len(payloads)
        body = b"".join([_log_prefix(a, 2),
                         _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, entry.first_seq),
                         struct.pack(f">I{n}I", n, *map(len, payloads)), *payloads])
    elif isinstance(entry, (RequestEntry, ClientRequestEntry)):
        payload = entry.payload
        kind = 3 if isinstance(entry, RequestEntry) else 5
        body = b"".join([_log_prefix(a, kind), _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, entry.seq),
                         _U32.pack(len(payload)), payload])
    elif isinstance(entry, (ResponseEntry, ClientResponseEntry)):
        payload = entry.payload
        kind = 4 if isinstance(entry, ResponseEntry) else 6
        body = b"".join([_log_prefix(a, kind), _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, entry.seq),
                         _U32.pack(1 if entry.failed else 0), _U32.pack(len(payload)), payload])
    elif isinstance(entry, FinishedEntry):
        body = _log_prefix(a, 7) + _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, entry.seq)
    else:
        body = _log_prefix(a, 0) + _ATTEMPT.pack(a.subtask.index, a.epoch, a.number, 0)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


@functools.lru_cache(maxsize=256)
def _log_prefix(attempt: TaskAttempt, kind: int) -> bytes:
    # kind, run and operator of an entry: the same for every event of an attempt
    w = _Writer()
    w.u32(kind)
    w.text(attempt.run)
    w.text(attempt.subtask.operator)
    return w.getvalue()


def decode_log(data: bytes, what: str, *, allow_torn_tail: bool = False
               ) -> tuple[list[LogEntry], int]:
    """Parse an inbound log. Returns the entries and the byte length of the valid prefix.

    A frame with a bad checksum raises :class:`CorruptRecord` wherever it is. A last frame cut
    short raises too, unless ``allow_torn_tail`` (a log of a batch that never committed, whose
    last append may have been torn by a crash and was then never acknowledged): then it is
    dropped and the valid length tells the caller where to truncate before appending again.
    """
    entries: list[LogEntry] = []
    valid = 0
    for entry, frame_end in _iter_frames(data, what, allow_torn_tail):
        entries.append(entry)
        valid = frame_end
    return entries, valid


def _iter_frames(data: bytes, what: str, allow_torn_tail: bool) -> Iterator[tuple[LogEntry, int]]:
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if pos + _FRAME.size > len(view):
            if allow_torn_tail:
                return
            raise CorruptRecord(
                f"{what}: ends with {len(view) - pos} bytes of a frame header at byte {pos} (the "
                f"log was cut short; expected complete frames: every frame of a committed "
                f"batch was acknowledged)")
        length, crc = _FRAME.unpack_from(view, pos)
        end = pos + _FRAME.size + length
        if end > len(view):
            if allow_torn_tail:
                return
            raise CorruptRecord(
                f"{what}: the frame at byte {pos} is cut short ({len(view) - pos} of "
                f"{end - pos} bytes; expected complete frames: every frame of a committed "
                f"batch was acknowledged)")
        body = view[pos + _FRAME.size:end]
        if zlib.crc32(body) != crc:
            raise CorruptRecord(f"{what}: checksum mismatch in the frame at byte {pos} "
                                f"({end - pos} bytes; file damaged)")
        yield _decode_entry(_Reader(body, f"{what} frame at byte {pos}")), end
        pos = end


# ------------------------------------------------------------------------------- log seal
@dataclass(frozen=True, slots=True)
class LogSeal:
    """What an inbound log held when its batch committed: its length and CRC-32."""

    epoch: int
    length: int
    crc32: int


def encode_log_seal(seal: LogSeal) -> bytes:
    w = _Writer()
    w.i64(seal.epoch)
    w.i64(seal.length)
    w.u32(seal.crc32)
    return seal_envelope(KIND_LOG_SEAL, w.getvalue())


def decode_log_seal(data: bytes, what: str) -> LogSeal:
    r = _Reader(open_envelope(data, KIND_LOG_SEAL, what), what)
    seal = LogSeal(r.i64(), r.i64(), r.u32())
    r.done()
    return seal


# -------------------------------------------------------------------------- state lineage
def encode_state_lineage(first_epoch: int) -> bytes:
    """The marker a subtask writes with its first state: it has kept state since
    ``first_epoch``, so from then on a missing state file is a loss, not statelessness."""
    w = _Writer()
    w.i64(first_epoch)
    return seal_envelope(KIND_STATE_LINEAGE, w.getvalue())


def decode_state_lineage(data: bytes, what: str) -> int:
    r = _Reader(open_envelope(data, KIND_STATE_LINEAGE, what), what)
    first_epoch = r.i64()
    r.done()
    return first_epoch


def _decode_entry(r: _Reader) -> LogEntry:
    kind = r.u32()
    run = r.text()
    operator = r.text()
    r._need(_ATTEMPT.size)
    index, epoch, number, seq = _ATTEMPT.unpack_from(r.buf, r.pos)
    r.pos += _ATTEMPT.size
    attempt = TaskAttempt(run, SubtaskId(operator, index), epoch, number)
    if kind == 1:
        payload = r.blob()
        r.done()
        return EventEntry(attempt, seq, payload)
    if kind == 2:
        payloads = tuple(r.blobs(r.u32()))
        r.done()
        return EventRunEntry(attempt, seq, payloads)
    if kind == 0:
        r.done()
        return RegistrationEntry(attempt)
    if kind in (3, 5):
        payload = r.blob()
        r.done()
        return (RequestEntry if kind == 3 else ClientRequestEntry)(attempt, seq, payload)
    if kind == 7:
        r.done()
        return FinishedEntry(attempt, seq)
    if kind in (4, 6):
        failed = r.u32()
        payload = r.blob()
        r.done()
        return (ResponseEntry if kind == 4 else ClientResponseEntry)(attempt, seq, payload,
                                                                      bool(failed))
    raise CorruptRecord(f"{r.what}: unknown entry kind {kind}")


# ----------------------------------------------------------------------------- subtask state
def encode_subtask_state(epoch: int, state: bytes) -> bytes:
    """Envelope of one subtask's state at the end of the batch of ``epoch``."""
    w = _Writer()
    w.i64(epoch)
    w.blob(state)
    return seal_envelope(KIND_SUBTASK_STATE, w.getvalue())


def decode_subtask_state(data: bytes, what: str) -> tuple[int, bytes]:
    r = _Reader(open_envelope(data, KIND_SUBTASK_STATE, what), what)
    epoch = r.i64()
    state = r.blob()
    r.done()
    return epoch, state
