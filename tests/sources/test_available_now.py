"""Issue 24, items 2 and 3, through the coordinator harness (no Spark): a run that ends by
itself reads everything first (docs/protocol.md [bounded-run-reads-everything]), and with P
readers a lane stays within max drift plus one record batch of the others.

``Run(..., available_now=True)`` checks what an ``availableNow`` run on Spark needs: when a
batch commits, the next one is already asked for while work is left (Spark's next
``latestOffset`` comes at once and ends the run if nothing was asked; a timer that asks a
second later is too late)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from sparkcoord.core.restore import RestorePoint
from sparkcoord.sources import (
    NextSplit,
    NoSplitNow,
    ReadLimit,
    Split,
    SplitDiscovery,
    SplitEnumerator,
)
from sparkcoord.sources.alignment import AlignmentOptions, WatermarkReport
from sparkcoord.testing import CoordinatorHarness, ManualWorkers
from tests.sources.test_alignment_wiring import (
    Run,
    Splits,
    TimedSplit,
    everything,
    two_lanes,
)

ALIGNED = {"maxDrift": "120s", "eventTimeColumn": "ts"}


def one_lane(files: int, rows: int = 20, step_ms: int = 15_000) -> list[TimedSplit]:
    """One flat directory: ``files`` files of ``rows`` rows, each 300 s of event time."""
    return [TimedSplit(f"one/{k}", rows=rows, step_ms=step_ms, first=rows * k, lane="one")
            for k in range(files)]


def test_an_available_now_run_of_one_aligned_lane_reads_every_file_and_never_pauses() -> None:
    # issue 24 item 2b: three files of 300 s each in one directory, max drift 2 minutes, two
    # files per trigger, two readers. The lane was held at its own watermark + max drift
    # inside a batch, its rest kept paused, and the run ended at the next trigger
    files = one_lane(3)
    run = Run(files, options=ALIGNED, rows_per_batch=None, bounded=True,
              limit=ReadLimit(max_units=2), available_now=True)
    run.until_done()
    assert sorted(run.read()) == everything(files)
    assert all(d.paused == () for b in run.batches for ds in b.decisions.values() for d in ds)
    assert run.most_held == 0  # no reader kept a split: a single lane is never paused
    assert len(run.batches) == 2  # two files, then the third (the limit), nothing waits


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_an_available_now_run_of_two_aligned_lanes_reads_everything_without_a_timer(
        parallelism: int) -> None:
    # a lane paused behind another: its kept split and the pending files are read in the
    # following batches, each asked for by the last request of the batch before
    slow, fast = two_lanes(6)
    splits = [split for pair in zip(fast, slow, strict=True) for split in pair]
    run = Run(splits, options={**ALIGNED, "maxDrift": "100s"}, parallelism=parallelism,
              rows_per_batch=None, bounded=True, available_now=True)
    run.until_done()
    assert sorted(run.read()) == everything(splits)


def test_a_split_paused_in_the_last_batch_of_a_bounded_source_is_read_in_the_next_one() -> None:
    # docs/protocol.md [bounded-run-reads-everything]: the fast directory's last file pauses
    # in the middle (past the allowed maximum) while the slow directory is read to its end.
    # Nothing is pending; the reader keeps the file. The batch that resumes it must be asked for
    # before this one commits, or an availableNow run ends with the file half read (the
    # alignment timer asks a second later, too late)
    slow = [TimedSplit(f"slow/{k}", rows=8, step_ms=1000, first=8 * k, lane="slow")
            for k in range(2)]  # 0-7 s, 8-15 s
    fast = [TimedSplit("fast/0", rows=2, step_ms=20_000, lane="fast"),  # 0-20 s
            TimedSplit("fast/1", rows=40, step_ms=20_000, first=2, lane="fast")]  # 40-820 s
    splits = [fast[0], slow[0], slow[1], fast[1]]
    run = Run(splits, options={**ALIGNED, "maxDrift": "100s"}, parallelism=2,
              rows_per_batch=None, bounded=True, limit=ReadLimit(max_units=2),
              available_now=True)
    run.batch()
    second = run.batch()
    assert second.rows[0][-1] == "fast/1:5"  # paused at 140 s, past 20 + 100 s
    assert run.status()["pending"] == 0
    run.until_done()
    assert sorted(run.read()) == everything(splits)


def test_a_lane_catching_up_alone_reads_past_its_own_drift_in_one_batch() -> None:
    # issue 24 item 3, related: the slow directory catching up while the fast one waits
    # moved one file per batch (paced by the update interval) when a file spans more than
    # max drift; held only by the fast lane, it reads up to the fast lane + max drift at once
    slow = [TimedSplit(f"slow/{k}", rows=20, step_ms=15_000, first=20 * k, lane="slow")
            for k in range(6)]  # 300 s per file, 30 minutes in all
    fast = [TimedSplit("fast/0", rows=2, step_ms=1_000, first=1_800, lane="fast")]
    run = Run(slow + fast, options=ALIGNED, parallelism=2, rows_per_batch=None,
              bounded=True, available_now=True)
    run.until_done()
    assert sorted(run.read()) == everything(slow + fast)
    assert len(run.batches) <= 3, [b.rows for b in run.batches]


def enumerator_harness(splits: list[Split], url: str, *, parallelism: int,
                       limit: ReadLimit | None = None) -> CoordinatorHarness:
    """A continuous aligned source of ``splits`` (max drift 200 s), without readers: the
    test asks as the readers would."""
    options = AlignmentOptions.from_options({**ALIGNED, "maxDrift": "200s"},
                                            default_group="timed")
    clock: list[CoordinatorHarness] = []
    enumerator = functools.partial(SplitEnumerator, discovery=Splits(splits),
                                   alignment=options, limit=limit,
                                   clock=lambda: clock[0].clock.now())
    h = CoordinatorHarness(enumerator, parallelism, name="timed", storage_url=url)
    clock.append(h)
    return h


def lane_files(lane: str, files: int, step_ms: int) -> list[TimedSplit]:
    return [TimedSplit(f"{lane}/{k}", rows=8, step_ms=step_ms, first=8 * k, lane=lane)
            for k in range(files)]


def test_readers_asking_at_once_after_a_restart_get_one_file_of_a_held_back_lane(
        tmp_path: Any) -> None:
    # issue 24 item 3: a live slow directory (one file, then nothing) holds the minimum; the
    # fast one is within the allowed maximum. After a driver restart both readers asked
    # before either reported and each took the fast directory's next file: the lane ended
    # two files past the allowed maximum. Now a lane held back by another one has at most
    # one split in flight; its next file goes out once that one is reported finished.
    slow, fast = lane_files("slow", 1, 1000), lane_files("fast", 6, 20_000)
    url = f"file://{tmp_path}/records"
    h = enumerator_harness(slow + fast, url, parallelism=2, limit=ReadLimit(max_units=2))
    h.start()
    h.checkpoint()
    assert h.request_from_subtask(0, NextSplit()).split_id == "slow/0"
    assert h.request_from_subtask(1, NextSplit()).split_id == "fast/0"
    h.request_from_subtask(0, NextSplit(("slow/0",), WatermarkReport(read=(("slow", 7000),))))
    h.request_from_subtask(1, NextSplit(("fast/0",), WatermarkReport(read=(("fast", 140_000),))))
    h.commit()
    h.checkpoint()  # minimum 7 s (slow), allowed maximum 207 s: the fast lane may read
    epoch = h.epoch
    h.commit()
    h.service.close()
    h = enumerator_harness(slow + fast, url, parallelism=2)  # the driver restarts
    h.start(RestorePoint(epoch, committed=True))
    h.checkpoint()
    decision = h.coordinator.alignment.decision
    assert decision.lowest == "slow" and decision.allows(140_000, "fast")
    assert h.request_from_subtask(0, NextSplit()).split_id == "fast/1"
    assert h.request_from_subtask(1, NextSplit()) == NoSplitNow()  # not fast/2 as well
    # the reader of fast/1 reports it (still within the allowed maximum): the next goes out
    assert h.request_from_subtask(0, NextSplit(
        ("fast/1",), WatermarkReport(read=(("fast", 190_000),)))).split_id == "fast/2"
    # past the allowed maximum: the lane waits
    assert h.request_from_subtask(0, NextSplit(
        ("fast/2",), WatermarkReport(read=(("fast", 340_000),)))) == NoSplitNow()
    assert h.service.failure is None


def test_readers_of_a_lane_nothing_holds_back_take_its_files_at_once(tmp_path: Any) -> None:
    # one flat directory: a single lane is held by nothing, so every reader reads it
    files = lane_files("one", 6, 20_000)
    h = enumerator_harness(files, f"file://{tmp_path}/records", parallelism=3)
    h.start()
    h.checkpoint()
    h.request_from_subtask(0, NextSplit())
    h.request_from_subtask(0, NextSplit(("one/0",), WatermarkReport(read=(("one", 140_000),))))
    h.request_from_subtask(0, NextSplit(("one/1",), WatermarkReport(read=(("one", 300_000),))))
    h.commit()
    h.checkpoint()
    decision = h.coordinator.alignment.decision
    assert decision.lowest == "one" and decision.allowed_maximum_of("one") is None
    got = [h.request_from_subtask(s, NextSplit()) for s in range(3)]
    assert [g.split_id for g in got] == ["one/3", "one/4", "one/5"]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_continuous_source_in_an_available_now_run_reads_every_file_of_its_paused_lanes(
        parallelism: int) -> None:
    # issue 24 item 2, the continuous case: without ``bounded`` an availableNow run ended
    # with a paused split kept by a reader and files of the paused lane pending (nothing
    # asked for the batch that would read them), and a lane that had nothing left held the
    # minimum as "empty" until an idle timeout (here none is set). The run lists once as it
    # starts and is bounded for its length (rule 5 of the enumerator, decision 53)
    slow, fast = two_lanes(6)
    splits = [*fast, *slow[:2]]  # the slow lane ends early: the fast one must not wait on it
    run = Run(splits, options={**ALIGNED, "maxDrift": "100s"}, parallelism=parallelism,
              rows_per_batch=None, bounded=False, limit=ReadLimit(max_units=2),
              available_now=True)
    run.until_done()
    assert sorted(run.read()) == everything(splits)
    assert any(d.paused for b in run.batches for ds in b.decisions.values() for d in ds)
    assert run.h.service.wants_batch() is False  # done: the run ends at the next trigger


class Arriving(SplitDiscovery):
    """A directory whose files arrive while the job runs: a listing finds what arrived."""

    def __init__(self, arrived: list[Split]) -> None:
        self.arrived = arrived

    def initial_state(self) -> int:
        return 0

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return list(self.arrived[state:]), len(self.arrived)


def test_a_continuous_source_in_an_available_now_run_reads_what_its_start_found_and_ends(
        ) -> None:
    # as Spark's file source: an availableNow run reads what is present when it starts; a
    # file that arrives during the run waits for the next run, which reads it
    arrived: list[Split] = [Split(f"f{k}") for k in range(3)]
    runs: list[Any] = []

    def enumerator(context: Any) -> SplitEnumerator:
        return SplitEnumerator(context, Arriving(arrived), discovery_interval_s=1.0)

    url = "memory://sparkcoord-available-now/arriving"
    for run_number in range(2):
        h = CoordinatorHarness(enumerator, 1, name="files", storage_url=url, available_now=True,
                               workers=ManualWorkers(inline=True))
        h.start() if run_number == 0 else h.start(RestorePoint(runs[-1], committed=True))
        got: list[str] = []
        while h.service.wants_batch():
            h.checkpoint()
            unreported: tuple[str, ...] = ()
            while isinstance(answer := h.request_from_subtask(0, NextSplit(unreported)), Split):
                got.append(answer.split_id)
                unreported = (answer.split_id,)  # read it; reported with the next request
            h.commit()
            if run_number == 0 and len(arrived) == 3:
                arrived.append(Split("late"))  # arrives during the first run
            h.clock.advance(5.0)  # discovery timers would fire here
            h.run()
        runs.append(h.epoch)
        h.service.close()
        assert got == (["f0", "f1", "f2"] if run_number == 0 else ["late"]), (run_number, got)


def test_a_continuous_source_in_an_available_now_run_lists_past_its_per_cycle_cap() -> None:
    # a continuous file source takes at most maxFilesPerDiscovery files per listing cycle;
    # the one listing of an availableNow run goes on until a cycle finds nothing
    arrived: list[Split] = [Split(f"f{k}") for k in range(7)]

    class Capped(Arriving):
        def discover(self, state: Any) -> tuple[list[Split], Any]:
            return list(self.arrived[state:state + 3]), min(state + 3, len(self.arrived))

    h = CoordinatorHarness(functools.partial(SplitEnumerator, discovery=Capped(arrived)), 1, name="files",
                           available_now=True)
    h.start()
    h.checkpoint()
    got = []
    while isinstance(answer := h.request_from_subtask(0, NextSplit(tuple(got[-1:]))), Split):
        got.append(answer.split_id)
    assert got == [f"f{k}" for k in range(7)]


def test_before_the_first_decision_a_lane_slow_to_report_gets_no_second_file(
        tmp_path: Any) -> None:
    # soak 'aligned', seeds 41003 and 41009: in the first batch (no decision with a minimum
    # is in force) the reader of the fast directory's first file was retried and reported
    # late; the other reader finished a slow file and took the fast directory's second file,
    # as a lane not yet reported came first. The fast lane went two files ahead in one batch
    # and the slow lane's rows fell behind the watermark (160 of 640 dropped as late). Now,
    # before a decision, a lane has one split in flight and a reported lane waits for the
    # others' reports, then reads only within max drift of the lowest
    fast, slow = lane_files("fast", 4, 20_000), lane_files("slow", 4, 1000)
    h = enumerator_harness(fast + slow, f"file://{tmp_path}/records", parallelism=2,
                           limit=ReadLimit(max_units=3))
    h.start()
    h.checkpoint()
    assert h.coordinator.alignment.decision.minimum is None  # the first batch: no decision
    assert h.request_from_subtask(0, NextSplit()).split_id == "fast/0"
    assert h.request_from_subtask(1, NextSplit()).split_id == "slow/0"
    # the slow reader reports first: the fast lane has its file in flight and no report
    assert h.request_from_subtask(1, NextSplit(
        ("slow/0",), WatermarkReport(read=(("slow", 7000),)))) == NoSplitNow()
    # the fast reader reports 140 s: the slow lane, lowest at 7 s, goes next
    assert h.request_from_subtask(0, NextSplit(
        ("fast/0",), WatermarkReport(read=(("fast", 140_000),)))).split_id == "slow/1"
    assert h.service.failure is None
