"""What a reader says about a split it finished (reader.py rule 6, enumerator.py rule 7): kept
in the reader's state until its next request carries it with the finished report, handed to
the enumerator's ``split_finished`` in log order, undone by ``finished_report_withdrawn`` when
a task retry withdraws the request, and replayed the same after a restore. Requests and states
of version 1 (before reports) read as carrying none."""

from __future__ import annotations

import functools
import pickle
from typing import Any

from sparkcoord.coordinator import Withdrawn
from sparkcoord.core.encoding import _decoded, loads
from sparkcoord.core.restore import RestorePoint
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources import (
    NextSplit,
    NoSplitNow,
    ReaderState,
    Split,
    SplitDiscovery,
    SplitEnumerator,
    SplitReader,
)
from sparkcoord.testing import CoordinatorHarness
from tests.sources.test_split_reader import Numbers


class EndsAt(Numbers):
    """Split "s<k>" holds ids k*100 .. k*100+24 in record batches of 10 rows; it reports the
    position it ended at."""

    def finished_report(self, split: Split, position: Any) -> Any:
        return f"{split.split_id}@{position}"


def read(reader: SplitReader, state: Any, answers: list[Any]) -> tuple[list[int], list[Any], Any]:
    asked: list[Any] = []

    def ask(request: Any, timeout_s: float) -> Any:
        asked.append(request)
        return answers.pop(0)

    reader.open(SubtaskContext("src", 0, 2, 5, 0, 0, lambda event: None, ask), state)
    ids = [i for b in reader.process() for i in b.column(0).to_pylist()]
    return ids, asked, reader.snapshot_state()


def test_a_finished_report_travels_with_the_next_request_and_through_the_reader_s_state(
) -> None:
    # the batch finishes s1 (resumed at 20), then its row limit stops it inside s2 before
    # it asks anything: s1's finish and its report wait in the state, through the
    # checkpoint's encoding, for the next batch's first request
    first = EndsAt()
    first.max_rows_per_batch = 10
    ids1, asked1, state = read(first, ReaderState(unfinished=[(Split("s1"), 20),
                                                              (Split("s2"), None)]), [])
    assert ids1 == [120, 121, 122, 123, 124, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209]
    assert asked1 == []
    assert state.unreported == ["s1"] and state.reports == {"s1": "s1@25"}
    restored = loads(pickle.dumps(state))
    ids2, asked2, after = read(EndsAt(), restored, [NoSplitNow()])
    assert ids2 == list(range(210, 225))
    assert asked2 == [NextSplit(("s1", "s2"), None, (("s1", "s1@25"), ("s2", "s2@25")))]
    assert after is None  # everything reported: nothing left to carry


def test_a_reader_without_reports_asks_as_before() -> None:
    class Plain(EndsAt):
        def finished_report(self, split: Split, position: Any) -> Any:
            return None

    _, asked, _ = read(Plain(), None, [Split("s1"), NoSplitNow()])
    assert asked == [NextSplit(()), NextSplit(("s1",))]
    assert asked[1].reports == ()


class Fixed(SplitDiscovery):
    def __init__(self, splits: list[Split]) -> None:
        self.splits = splits

    def initial_state(self) -> Any:
        return None

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return list(self.splits), "listed"


class Tracking(SplitEnumerator):
    """Keeps what readers reported, as a source with per-split progress would (in its own
    state, changed only through the calls under test)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int, str, Any]] = []

    keeps_splits_in_flight = True

    def split_finished(self, subtask: int, split: Split, report: Any) -> None:
        assert split == Split(split.split_id)  # the split itself, as handed out
        self.calls.append(("finished", subtask, split.split_id, report))

    def finished_report_withdrawn(self, subtask: int, split: Split, report: Any) -> None:
        assert split == Split(split.split_id)
        self.calls.append(("withdrawn", subtask, split.split_id, report))


def harness(url: str | None = None) -> CoordinatorHarness:
    splits = [Split("a"), Split("b"), Split("c")]
    return CoordinatorHarness(functools.partial(Tracking, discovery=Fixed(splits), bounded=True),
                              2, name="src", storage_url=url)


def test_the_enumerator_gets_each_report_after_its_finish_and_a_restore_replays_the_same(
        tmp_path: Any) -> None:
    url = f"file://{tmp_path}/ckpt"
    h = harness(url)
    h.start()
    h.checkpoint()
    a = h.request_from_subtask(0, NextSplit())
    b = h.request_from_subtask(1, NextSplit())
    assert (a.split_id, b.split_id) == ("a", "b")
    h.commit()
    h.checkpoint()
    c = h.request_from_subtask(0, NextSplit(("a",), None, (("a", 7),)))
    assert c.split_id == "c"
    assert h.request_from_subtask(1, NextSplit(("b",))) == NoSplitNow(done=True)
    assert h.coordinator.calls == [("finished", 0, "a", 7), ("finished", 1, "b", None)]
    h.commit()
    epoch = h.epoch
    h.service.close()
    # the driver dies after the batch committed: the restore replays its requests against
    # the snapshot they were answered from, and the enumerator hears the same, in order
    again = harness(url)
    again.service.restore(RestorePoint(epoch, committed=True))
    again.run()
    assert again.service.failure is None
    assert again.coordinator.calls == [("finished", 0, "a", 7), ("finished", 1, "b", None)]
    assert again.coordinator.state.in_flight == {"c": 0}


def test_a_withdrawn_request_s_reports_are_undone_last_first() -> None:
    h = harness()
    h.start()
    h.checkpoint()
    a = h.request_from_subtask(0, NextSplit())
    b = h.request_from_subtask(0, NextSplit(("a",), None, (("a", "a-end"),)))
    c = h.request_from_subtask(0, NextSplit(("b",), None, (("b", "b-end"),)))
    assert [s.split_id for s in (a, b, c)] == ["a", "b", "c"]
    h.coordinator.handle_items_withdrawn(0, 1, [
        Withdrawn(NextSplit(("a",), None, (("a", "a-end"),)), is_request=True, answered=True,
                  answer=b),
        Withdrawn(NextSplit(("b",), None, (("b", "b-end"),)), is_request=True, answered=True,
                  answer=c)])
    assert h.coordinator.calls[2:] == [("withdrawn", 0, "b", "b-end"),
                                       ("withdrawn", 0, "a", "a-end")]
    assert h.coordinator.state.in_flight == {"a": 0}  # the retry reports it again


def test_a_report_on_a_split_not_reported_finished_fails_the_job_naming_it() -> None:
    h = harness()
    h.start()
    h.checkpoint()
    h.request_from_subtask(0, NextSplit())
    h.ask_from_subtask(0, NextSplit((), None, (("a", 1),)))
    failure = h.service.failure or ""
    assert "'a'" in failure and "without reporting them finished" in failure
    assert "subtask 0" in failure


def test_a_request_and_a_reader_state_of_version_1_read_as_carrying_no_reports() -> None:
    request = _decoded("sources.NextSplit", 1, {"finished": ("a",), "watermarks": None})
    assert request == NextSplit(("a",)) and request.reports == ()
    state = _decoded("sources.ReaderState", 1, {"unfinished": [], "unreported": ["a"],
                                                "event_times": {}})
    assert state.reports == {} and state.unreported == ["a"]
