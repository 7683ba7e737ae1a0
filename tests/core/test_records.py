import struct
import zlib

import pytest

from sparkcoord.core.entries import EventEntry, EventRunEntry, LogEntry, RegistrationEntry
from sparkcoord.core.errors import CorruptRecord, UnknownRecordVersion
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.records import (
    CheckpointRecord,
    LogSeal,
    decode_checkpoint,
    decode_log,
    decode_log_seal,
    decode_state_lineage,
    decode_subtask_state,
    encode_checkpoint,
    encode_log_entry,
    encode_log_seal,
    encode_state_lineage,
    encode_subtask_state,
)

RECORD = CheckpointRecord(
    7, {"a": b"state-a", "b": None},
    {SubtaskId("a", 0): [b"e1", b"e2"], SubtaskId("a", 1): [], SubtaskId("b", 3): [b""]})


def test_a_checkpoint_record_round_trips() -> None:
    back = decode_checkpoint(encode_checkpoint(RECORD), "r")
    assert back.epoch == 7 and back.snapshots == {"a": b"state-a", "b": None}
    assert back.events_for(SubtaskId("a", 0)) == [b"e1", b"e2"]
    assert back.events_for(SubtaskId("a", 1)) == ()
    assert back.events_for(SubtaskId("b", 3)) == [b""]


def test_a_flipped_byte_is_reported_as_a_checksum_mismatch_naming_the_file() -> None:
    data = bytearray(encode_checkpoint(RECORD))
    data[-3] ^= 0xFF
    with pytest.raises(CorruptRecord, match="records/7.ckpt: checksum mismatch"):
        decode_checkpoint(bytes(data), "records/7.ckpt")


def test_an_unknown_version_and_a_foreign_file_are_refused() -> None:
    data = bytearray(encode_checkpoint(RECORD))
    struct.pack_into(">H", data, 4, 99)
    with pytest.raises(UnknownRecordVersion, match="version 99"):
        decode_checkpoint(bytes(data), "f")
    with pytest.raises(CorruptRecord, match="not a sparkcoord file"):
        decode_checkpoint(b"PK\x03\x04" + bytes(40), "f")
    with pytest.raises(CorruptRecord, match="shorter than"):
        decode_checkpoint(b"SP", "f")
    with pytest.raises(CorruptRecord, match="kind"):
        decode_checkpoint(encode_subtask_state(1, b"s"), "f")


def test_a_truncated_record_is_corrupt() -> None:
    data = encode_checkpoint(RECORD)
    with pytest.raises(CorruptRecord, match="header says"):
        decode_checkpoint(data[:-1], "f")


def test_a_body_with_a_valid_checksum_but_bad_structure_is_corrupt() -> None:
    body = b"\x00" * 8 + b"\x00\x00\x00\x05"  # claims 5 coordinators, has none
    header = struct.pack(">4sHBxQI", b"SPCO", 1, 1, len(body), zlib.crc32(body))
    with pytest.raises(CorruptRecord, match="truncated body"):
        decode_checkpoint(header + body, "f")


def _log() -> tuple[list[LogEntry], bytes]:
    a = TaskAttempt("run", SubtaskId("op", 1), 4, 2)
    entries: list[LogEntry] = [RegistrationEntry(a), EventEntry(a, 0, b"p0"),
                               EventEntry(a, 1, b"p1"), EventRunEntry(a, 2, (b"p2", b"", b"p4"))]
    return entries, b"".join(encode_log_entry(e) for e in entries)


def test_the_inbound_log_round_trips_and_a_reader_that_allows_it_drops_a_torn_last_frame() -> None:
    entries, data = _log()
    assert decode_log(data, "log") == (entries, len(data))
    for torn in (data[:-2], data[:-len(encode_log_entry(entries[-1])) + 3]):
        back, valid = decode_log(torn, "log", allow_torn_tail=True)
        assert back == entries[:3] and valid == sum(len(encode_log_entry(e)) for e in entries[:3])


def test_a_log_cut_short_is_an_error_naming_the_byte_where_its_last_frame_starts() -> None:
    entries, data = _log()
    start = len(data) - len(encode_log_entry(entries[-1]))
    with pytest.raises(CorruptRecord, match=f"log: the frame at byte {start} is cut short"):
        decode_log(data[:-2], "log")
    with pytest.raises(CorruptRecord, match=f"log: ends with 3 bytes of a frame header at byte {start}"):
        decode_log(data[:start + 3], "log")


def test_a_full_length_last_frame_with_a_bad_checksum_is_damage_even_where_a_torn_tail_is_allowed(
) -> None:
    entries, data = _log()
    start = len(data) - len(encode_log_entry(entries[-1]))
    damaged = bytearray(data)
    damaged[-3] ^= 0x01
    for allow in (False, True):
        with pytest.raises(CorruptRecord, match=f"checksum mismatch in the frame at byte {start}"):
            decode_log(bytes(damaged), "log", allow_torn_tail=allow)


def test_log_seals_and_state_lineage_markers_round_trip_and_their_damage_is_named() -> None:
    seal = LogSeal(7, 1234, 0xDEADBEEF)
    assert decode_log_seal(encode_log_seal(seal), "s") == seal
    assert decode_state_lineage(encode_state_lineage(5), "m") == 5
    bad = bytearray(encode_log_seal(seal))
    bad[-1] ^= 0x01
    with pytest.raises(CorruptRecord, match="seal file: checksum mismatch"):
        decode_log_seal(bytes(bad), "seal file")
    with pytest.raises(CorruptRecord, match="holds record kind 4, expected 3"):
        decode_log_seal(encode_state_lineage(5), "x")


def test_a_damaged_frame_in_the_middle_of_the_log_is_corruption() -> None:
    a = TaskAttempt("run", SubtaskId("op", 1), 4, 0)
    first = bytearray(encode_log_entry(EventEntry(a, 0, b"payload")))
    first[-1] ^= 0xFF
    data = bytes(first) + encode_log_entry(EventEntry(a, 1, b"next"))
    with pytest.raises(CorruptRecord, match="frame at byte 0"):
        decode_log(data, "log")


def test_subtask_state_round_trips() -> None:
    assert decode_subtask_state(encode_subtask_state(3, b"st"), "s") == (3, b"st")
