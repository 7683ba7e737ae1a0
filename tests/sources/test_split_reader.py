"""The split reader with a scripted context: resumes what its state holds before asking,
reports finished splits in its next request, stops at its row limit keeping its position, and
a second batch continues exactly where the first stopped."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.core.control import BatchRequested
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources import NextSplit, NoSplitNow, ReaderState, Split, SplitReader
from sparkcoord.testing import SplitReaderContract


class Numbers(SplitReader):
    """Split "s<k>" holds ids k*100 .. k*100+24, in record batches of 10 rows."""

    coalesce_rows = 1  # keep the batches as read, to see positions

    def read_split(self, split: Split, position: Any):
        base = int(split.split_id[1:]) * 100
        at = position or 0
        while at < 25:
            ids = list(range(base + at, base + min(at + 10, 25)))
            at += len(ids)
            yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], names=["id"]), at


def context(answers: list[Any], asked: list[Any], sent: list[Any]) -> SubtaskContext:
    def ask(request: Any, timeout_s: float) -> Any:
        asked.append(request)
        return answers.pop(0)
    return SubtaskContext("src", 0, 2, 5, 0, 0, sent.append, ask)


def run(reader: SplitReader, state: Any, answers: list[Any]) -> tuple[list[int], list[Any],
                                                                       list[Any], Any]:
    asked: list[Any] = []
    sent: list[Any] = []
    reader.open(context(answers, asked, sent), state)
    ids = [i for b in reader.process() for i in b.column(0).to_pylist()]
    return ids, asked, sent, reader.snapshot_state()


def test_a_reader_pulls_splits_until_told_none_and_reports_each_finished_one() -> None:
    ids, asked, sent, state = run(Numbers(), None, [Split("s1"), Split("s2"), NoSplitNow()])
    assert ids == list(range(100, 125)) + list(range(200, 225))
    assert asked == [NextSplit(()), NextSplit(("s1",)), NextSplit(("s2",))]
    assert sent == [] and state is None  # nothing unfinished: no state to write


def test_a_row_limit_stops_mid_split_and_the_next_batch_continues_from_the_position() -> None:
    first = Numbers()
    first.max_rows_per_batch = 15
    ids1, asked1, sent1, state = run(first, None, [Split("s1")])
    assert ids1 == list(range(100, 120))  # two batches of 10: the limit is checked per batch
    assert isinstance(state, ReaderState) and state.unfinished == [(Split("s1"), 20)]
    assert sent1 == [BatchRequested()]  # asks for the batch that will finish it
    ids2, asked2, _, state2 = run(Numbers(), state, [NoSplitNow()])
    assert ids1 + ids2 == list(range(100, 125))  # no row lost or read twice
    assert asked1 == [NextSplit(())] and asked2 == [NextSplit(("s1",))]
    assert state2 is None


def test_a_restored_state_of_the_wrong_type_is_refused_naming_the_subtask() -> None:
    with pytest.raises(TypeError, match=r"reader src\[0\]: restored state is a dict"):
        run(Numbers(), {"unfinished": []}, [])


def test_small_batches_are_joined_before_they_reach_spark() -> None:
    reader = Numbers()
    reader.coalesce_rows = 1000
    asked: list[Any] = []
    reader.open(context([Split("s1"), Split("s2"), NoSplitNow()], asked, []), None)
    batches = list(reader.process())
    assert len(batches) == 1 and batches[0].num_rows == 50


class TestNumbersKeepTheReaderContract(SplitReaderContract):
    """The reader test base (sparkcoord.testing) on this module's reader."""

    stop_after_rows = 12

    def make_reader(self) -> SplitReader:
        return Numbers()

    def splits(self) -> list[Split]:
        return [Split("s1"), Split("s2"), Split("s3")]

    def expected_rows(self, split: Split) -> list[dict[str, Any]]:
        base = int(split.split_id[1:]) * 100
        return [{"id": i} for i in range(base, base + 25)]


class LosesARowOnResume(Numbers):
    """A reader that resumes one row past its position: the contract must catch it."""

    def read_split(self, split: Split, position: Any):
        yield from super().read_split(split, None if position is None else position + 1)


def test_the_reader_contract_catches_a_reader_that_loses_a_row_when_it_resumes() -> None:
    class Broken(TestNumbersKeepTheReaderContract):
        def make_reader(self) -> SplitReader:
            return LosesARowOnResume()

    with pytest.raises(AssertionError):
        Broken().test_a_batch_stopped_mid_split_goes_on_from_its_state_with_no_row_lost_or_repeated()
    Broken().test_every_split_is_read_once_and_reported_finished_in_the_next_request()  # unstopped
