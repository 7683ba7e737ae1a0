import threading

import pytest

from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import EventEncodingError, EventTooLarge


def test_an_event_round_trips_through_the_codec() -> None:
    codec = EventCodec()
    event = {"split": ("file-7", 0, 1024), "n": 3}
    assert codec.decode(codec.encode(event)) == event


def test_an_unpicklable_event_fails_at_encode_with_its_type_named() -> None:
    with pytest.raises(EventEncodingError, match="lock"):
        EventCodec().encode(threading.Lock())


def test_an_oversized_event_fails_with_its_size_and_the_limit() -> None:
    codec = EventCodec(max_event_bytes=100)
    with pytest.raises(EventTooLarge) as info:
        codec.encode(b"x" * 200)
    assert info.value.limit == 100 and info.value.size > 200
    assert "100 bytes" in str(info.value)


def test_a_non_positive_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_event_bytes"):
        EventCodec(0)
