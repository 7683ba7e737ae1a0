import pytest

from sparkcoord.core.errors import IllegalTransition
from sparkcoord.core.restore import FRESH, RestorePoint, RestorePointDetector


def test_the_first_latest_offset_call_restores_to_its_start_as_committed() -> None:
    d = RestorePointDetector()
    assert d.initial_offset_requested() is None
    assert d.latest_offset_requested(4) == (RestorePoint(4, True), True)
    assert d.latest_offset_requested(5) == (RestorePoint(4, True), False)


def test_a_fresh_start_is_the_initial_epoch_and_replays_nothing() -> None:
    d = RestorePointDetector()
    point, first = d.latest_offset_requested(-1)
    assert first and point == FRESH and not point.replays_inbound_log


def test_initial_offset_decides_nothing_before_partitions_of_batch_zero() -> None:
    # after a crash inside batch 0 Spark calls initialOffset() and then partitions(initial, end0)
    d = RestorePointDetector()
    d.initial_offset_requested()
    point, first = d.partitions_requested(-1, 0)
    assert first and point == RestorePoint(0, committed=False)
    assert not point.replays_inbound_log


def test_an_empty_partition_range_is_an_error() -> None:
    with pytest.raises(IllegalTransition, match="empty range"):
        RestorePointDetector().partitions_requested(3, 3)
