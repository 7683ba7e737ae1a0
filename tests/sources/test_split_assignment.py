"""The split enumerator through the coordinator harness (a real service, manual mailboxes and
clock, storage in memory): splits handed out once, discovery applied only at a checkpoint
boundary (docs/protocol.md [state-changes-only-through-logged-inputs]), replays after a
restore giving the same answers, bounded sources ending, read limits. Discovery runs when the
test says so (a manual runner)."""

from __future__ import annotations

import functools
from typing import Any

from sparkcoord.coordinator import Withdrawn
from sparkcoord.core.restore import RestorePoint
from sparkcoord.sources import (
    EnumeratorState,
    NextSplit,
    NoSplitNow,
    ReadLimit,
    Split,
    SplitDiscovery,
    SplitEnumerator,
)
from sparkcoord.sources.assigners import InOrder, SplitAssigner
from sparkcoord.sources.backlog import Backlog
from sparkcoord.testing import CoordinatorHarness, ManualLane, ManualWorkers


class Listing(SplitDiscovery):
    """A directory listing the test fills in: each cycle returns what was added since."""

    def __init__(self) -> None:
        self.files: list[Split] = []

    def initial_state(self) -> int:
        return 0

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return list(self.files[state:]), len(self.files)


def ManualRunner() -> ManualLane:  # noqa: N802 - reads as the runner it stands for
    """The discovery lane (``call_async``), run by the test: ``run()`` does the queued
    cycles."""
    return ManualWorkers().lane("discovery")


def split(name: str, size: int = 10) -> Split:
    return Split(name, size)


def harness(listing: Listing, runner: ManualLane, *, url: str | None = None,
            parallelism: int = 2, **kwargs: Any) -> CoordinatorHarness:
    enumerator = functools.partial(SplitEnumerator, discovery=listing, **kwargs)
    return CoordinatorHarness(enumerator, parallelism, name="files", storage_url=url,
                              workers=runner.workers)


def test_a_fresh_source_lists_before_its_first_batch_and_hands_each_split_out_once() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b"), split("c")]
    h = harness(listing, runner)
    h.start()
    h.checkpoint()  # the listing done in start() joins the state here
    got = [h.request_from_subtask(0, NextSplit()), h.request_from_subtask(1, NextSplit()),
           h.request_from_subtask(0, NextSplit(("a",))), h.request_from_subtask(1, NextSplit())]
    assert [g.split_id for g in got[:3]] == ["a", "b", "c"]
    assert got[3] == NoSplitNow(done=False)  # continuous: more may come


def test_a_discovery_result_waits_for_the_next_checkpoint_boundary() -> None:
    listing, runner = Listing(), ManualRunner()
    h = harness(listing, runner, discovery_interval_s=1.0)
    h.start()
    h.checkpoint()
    listing.files.append(split("late"))
    h.clock.advance(1.0)  # the timer starts a discovery cycle
    h.run()
    assert runner.run() == 1
    h.run()  # its result reaches the mailbox
    assert h.request_from_subtask(0, NextSplit()) == NoSplitNow()  # not in this batch
    assert h.service.wants_batch()  # ... but a batch is asked for
    h.commit()
    h.checkpoint()
    assert h.request_from_subtask(0, NextSplit()).split_id == "late"


def test_a_restore_replays_a_batch_whose_discovery_arrived_mid_batch_with_the_same_answers() -> None:
    # decision 40's regression: had the late discovery joined the pending splits mid-batch,
    # the replay against snapshot N would answer differently and fail as nondeterministic
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a")]
    h = harness(listing, runner, discovery_interval_s=1.0)
    h.start()
    h.checkpoint()
    epoch = h.epoch
    assert h.request_from_subtask(0, NextSplit()).split_id == "a"
    listing.files.append(split("b"))
    h.clock.advance(1.0)
    h.run()
    runner.run()
    h.run()  # "b" discovered in the middle of the batch
    assert h.request_from_subtask(1, NextSplit()) == NoSplitNow()
    h.commit()
    h.service.close()
    again = harness(listing, ManualRunner(), url=h.storage_url, discovery_interval_s=1.0)
    again.service.restore(RestorePoint(epoch, committed=True))
    again.run()
    assert again.service.failure is None
    state = again.coordinator.state
    assert state.in_flight == {"a": 0} and state.handed_out == 1


def test_a_bounded_source_is_done_once_every_split_was_reported_finished_and_committed() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b")]
    h = harness(listing, runner, bounded=True)
    h.start()
    h.checkpoint()
    a = h.request_from_subtask(0, NextSplit())
    b = h.request_from_subtask(1, NextSplit())
    assert h.request_from_subtask(0, NextSplit((a.split_id,))) == NoSplitNow(done=True)
    assert h.ask_as_client("status").result()["done"] is False  # b is still being read
    assert h.request_from_subtask(1, NextSplit((b.split_id,))) == NoSplitNow(done=True)
    assert h.ask_as_client("status").result()["done"] is False  # its batch has not committed
    h.commit()
    status = h.ask_as_client("status").result()
    assert status["done"] is True and status["finished"] == 2 and status["in_flight"] == 0
    assert runner.queued == []  # a bounded source never lists again


def test_a_reader_reporting_a_split_it_does_not_hold_fails_the_job_naming_it() -> None:
    listing, runner = Listing(), ManualRunner()
    h = harness(listing, runner)
    h.start()
    h.checkpoint()
    h.ask_from_subtask(0, NextSplit(("ghost",)))
    failure = h.service.failure or ""
    assert "'ghost'" in failure and "not in flight" in failure and "subtask 0" in failure


def test_max_files_per_trigger_counts_files_not_splits_and_asks_for_another_batch() -> None:
    listing, runner = Listing(), ManualRunner()
    from sparkcoord.sources import FileSplit  # unit = the file's path

    listing.files = [FileSplit(f"{f}#{i}", 5, f) for f, i in
                     (("f1", 0), ("f1", 1), ("f2", 0), ("f3", 0))]
    h = harness(listing, runner, limit=ReadLimit(max_units=2))
    h.start()
    h.checkpoint()
    first = [h.request_from_subtask(0, NextSplit()) for _ in range(4)]
    assert [getattr(s, "split_id", None) for s in first] == ["f1#0", "f1#1", "f2#0", None]
    assert first[3] == NoSplitNow() and h.service.wants_batch()
    h.commit()
    h.checkpoint()  # a new batch, a new budget
    assert h.request_from_subtask(0, NextSplit()).split_id == "f3#0"


def test_max_bytes_per_trigger_admits_the_first_split_whatever_its_size() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("big", 100), split("small", 1)]
    h = harness(listing, runner, limit=ReadLimit(max_bytes=10))
    h.start()
    h.checkpoint()
    assert h.request_from_subtask(0, NextSplit()).split_id == "big"
    assert h.request_from_subtask(0, NextSplit()) == NoSplitNow()


def test_latest_first_hands_out_the_newest_discoveries_first() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("old"), split("new")]
    h = harness(listing, runner, latest_first=True)
    h.start()
    h.checkpoint()
    assert h.request_from_subtask(0, NextSplit()).split_id == "new"


def test_a_failing_discovery_fails_the_job_naming_the_enumerator() -> None:
    class Broken(Listing):
        def discover(self, state: Any) -> tuple[list[Split], Any]:
            if state:
                raise OSError("the bucket is gone")
            return [split("a")], 1

    runner = ManualRunner()
    h = harness(Broken(), runner, discovery_interval_s=1.0)
    h.start()
    h.checkpoint()
    h.clock.advance(1.0)
    h.run()
    runner.run()
    h.run()
    failure = h.service.failure or ""
    assert "enumerator 'files'" in failure and "discovery failed" in failure
    assert "the bucket is gone" in failure


def test_the_checkpointed_state_holds_pending_and_in_flight_splits() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b")]
    h = harness(listing, runner)
    h.start()
    h.checkpoint()
    h.request_from_subtask(1, NextSplit())
    h.commit()
    h.checkpoint()
    record = h.storage.read_record(h.epoch)
    import pickle

    state = pickle.loads(record.snapshots["files"])
    assert isinstance(state, EnumeratorState)
    pending = Backlog.restored(state.pending)  # sources/backlog.py: chunks, then positions
    assert [s.split_id for _, s in pending] == ["b"] and state.in_flight == {"a": 1}


def test_a_split_handed_out_then_withdrawn_goes_out_again_first_and_is_read_exactly_once(
) -> None:
    # docs/protocol.md [every-answer-consumed-or-returned], issue 24 item 1: a task retry
    # adopted subtask 0's history, re-sent only its first request and finished; its last two
    # requests are withdrawn. What their answers handed out (b, c) goes back to the front, in
    # order, and what they reported finished (a, b) is in flight again: the retry keeps a and
    # reports it with its next request.
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b"), split("c"), split("d")]
    h = harness(listing, runner, bounded=True)
    h.start()
    h.checkpoint()
    a = h.request_from_subtask(0, NextSplit())
    b = h.request_from_subtask(0, NextSplit(("a",)))
    c = h.request_from_subtask(0, NextSplit(("b",)))
    assert [a.split_id, b.split_id, c.split_id] == ["a", "b", "c"]
    h.coordinator.handle_items_withdrawn(0, 1, [
        Withdrawn(NextSplit(("a",)), is_request=True, answered=True, answer=b),
        Withdrawn(NextSplit(("b",)), is_request=True, answered=True, answer=c)])
    state = h.coordinator.state
    assert [s.split_id for _, s in h.coordinator._pending] == ["b", "c", "d"]
    assert state.in_flight == {"a": 0} and (state.handed_out, state.finished) == (1, 0)
    assert h.service.wants_batch()
    got: dict[str, list[int]] = {"a": [0]}
    answer = h.request_from_subtask(1, NextSplit())
    while not isinstance(answer, NoSplitNow):
        got.setdefault(answer.split_id, []).append(1)
        answer = h.request_from_subtask(1, NextSplit((answer.split_id,)))
    assert answer == NoSplitNow(done=True)
    h.commit()
    h.checkpoint()
    assert h.request_from_subtask(0, NextSplit(("a",))) == NoSplitNow(done=True)
    h.commit()
    assert got == {"a": [0], "b": [1], "c": [1], "d": [1]}  # each once, by one reader
    status = h.ask_as_client("status").result()
    assert (status["done"], status["handed_out"], status["finished"]) == (True, 4, 4)
    assert h.service.failure is None


def test_a_withdrawn_split_no_longer_counts_against_the_batch_s_read_limit() -> None:
    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b"), split("c")]
    h = harness(listing, runner, limit=ReadLimit(max_bytes=25))
    h.start()
    h.checkpoint()
    h.request_from_subtask(0, NextSplit())
    b = h.request_from_subtask(0, NextSplit())
    h.coordinator.handle_items_withdrawn(0, 1, [
        Withdrawn(NextSplit(), is_request=True, answered=True, answer=b)])
    # 10 bytes taken (a): b and then c still fit under 25, as if b had never gone out
    assert [h.request_from_subtask(1, NextSplit()).split_id for _ in range(2)] == ["b", "c"]


def test_withdrawn_watermark_reports_are_kept_and_other_events_ignored() -> None:
    from sparkcoord.sources.alignment import AlignmentOptions, WatermarkReport

    listing, runner = Listing(), ManualRunner()
    listing.files = [split("a"), split("b")]
    aligned = AlignmentOptions("files", max_drift_ms=1000)
    h = harness(listing, runner, alignment=aligned)
    h.start()
    h.checkpoint()
    h.request_from_subtask(0, NextSplit())
    report = WatermarkReport(read=(("x", 5000),))  # a lane's, kept beyond its splits
    h.send_from_subtask(0, report)
    b = h.request_from_subtask(0, NextSplit(("a",)))
    h.send_from_subtask(0, "something else")
    h.coordinator.handle_items_withdrawn(0, 1, [
        Withdrawn(report, is_request=False),
        Withdrawn(NextSplit(("a",)), is_request=True, answered=True, answer=b),
        Withdrawn("something else", is_request=False)])
    # a watermark only moves forward and only the greatest is kept: the report stays
    assert h.coordinator.alignment.state.splits["x"].watermark == 5000
    assert h.coordinator.state.in_flight == {"a": 0}
    assert [s.split_id for _, s in h.coordinator._pending] == ["b"]


class LargestFirst(InOrder):
    """A hand-out order of a source's own: the largest pending split first."""

    def next_split(self, pending: Backlog) -> Any:
        return max(pending, key=lambda entry: (entry[1].size, entry[1].split_id), default=None)


class LargestFirstEnumerator(SplitEnumerator):
    def make_assigner(self) -> SplitAssigner:
        return LargestFirst()


def test_a_source_s_own_assigner_decides_the_hand_out_order_and_a_replay_answers_the_same(
        tmp_path: Any) -> None:
    listing = Listing()
    listing.files = [split("small", 1), split("big", 30), split("middle", 10)]
    url = f"file://{tmp_path}/ckpt"
    h = CoordinatorHarness(functools.partial(LargestFirstEnumerator, discovery=listing,
                                             bounded=True), 2, name="files", storage_url=url)
    h.start()
    h.checkpoint()
    got = [h.request_from_subtask(0, NextSplit()).split_id,
           h.request_from_subtask(1, NextSplit()).split_id]
    assert got == ["big", "middle"]
    h.commit()
    # the driver dies after the batch committed: the restore replays the batch's requests
    # against the snapshot they were answered from (assigners.py rule 1); a different answer
    # would fail the restore as nondeterministic
    epoch = h.epoch
    h.service.close()
    again = CoordinatorHarness(functools.partial(LargestFirstEnumerator, discovery=listing,
                                                 bounded=True), 2, name="files",
                               storage_url=url)
    again.service.restore(RestorePoint(epoch, committed=True))
    again.run()
    assert again.service.failure is None
    assert again.coordinator.state.in_flight == {"big": 0, "middle": 1}
    again.checkpoint()
    assert again.request_from_subtask(0, NextSplit(("big",))).split_id == "small"
