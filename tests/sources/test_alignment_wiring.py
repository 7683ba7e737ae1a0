"""Watermark alignment wired into the split enumerator and reader (docs/alignment.md, decision
43), without Spark: a real coordination service through the coordinator harness (manual
mailboxes and clock, storage in memory) and real ``SplitReader`` objects run batch by batch as
Spark tasks would, their requests and events going through the service.

A batch runs only when something asked for one (``wants_batch``), as on Spark: a run that would
hang there fails the test instead of waiting."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.restore import RestorePoint
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources import (
    NextSplit,
    ReadLimit,
    Split,
    SplitDiscovery,
    SplitEnumerator,
    SplitReader,
)
from sparkcoord.sources.alignment import AlignmentDecision, AlignmentOptions, WatermarkReport
from sparkcoord.sources.files.options import alignment_options, parse_options
from sparkcoord.testing import CoordinatorHarness

ROWS_PER_RECORD_BATCH = 2


@dataclass(frozen=True)
class TimedSplit(Split):
    """``rows`` rows; row ``i`` has event time ``(first + i) * step_ms``; ``lane``: the
    alignment key shared with the lane's other splits (a file source's directory)."""

    rows: int = 0
    step_ms: int = 1000
    first: int = 0
    lane: str = ""

    @property
    def alignment_key(self) -> str:
        return self.lane or self.split_id


class Splits(SplitDiscovery):
    """A fixed set of splits, found by the first listing."""

    def __init__(self, splits: list[Split]) -> None:
        self.splits = splits

    def initial_state(self) -> bool:
        return False

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return ([] if state else list(self.splits)), True


class TimedReader(SplitReader):
    """Reads a :class:`TimedSplit` in record batches of two rows (``id``, ``ts`` in epoch ms).
    A split is *live* when ``available`` limits it: past that many rows it has nothing now
    (``(None, position)``) until the test makes more available."""

    coalesce_rows = 1  # keep record batches as read

    def __init__(self, alignment: AlignmentOptions | None, available: dict[str, int],
                 max_rows_per_batch: int | None) -> None:
        self.alignment = alignment
        self.available = available
        self.max_rows_per_batch = max_rows_per_batch

    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        assert isinstance(split, TimedSplit)
        at = position or 0
        while at < split.rows:
            if at >= self.available.get(split.split_id, split.rows):
                yield None, at
                return
            ids = list(range(at, min(at + ROWS_PER_RECORD_BATCH, split.rows)))
            at += len(ids)
            yield pa.RecordBatch.from_arrays(
                [pa.array([f"{split.split_id}:{i}" for i in ids]),
                 pa.array([(split.first + i) * split.step_ms for i in ids], pa.int64())],
                names=["id", "ts"]), at


@dataclass
class Batch:
    """What one batch did: the decision each subtask got and the rows it read."""

    epoch: int
    decisions: dict[int, list[AlignmentDecision]]
    rows: dict[int, list[str]]
    event_times: dict[str, int] = field(default_factory=dict)


class Run:
    """A source of ``parallelism`` readers, run batch by batch through a harness."""

    def __init__(self, splits: list[Split], *, parallelism: int = 2,
                 options: dict[str, str] | None = None, rows_per_batch: int | None = 4,
                 url: str | None = None, bounded: bool = False,
                 limit: ReadLimit | None = None, available_now: bool = False) -> None:
        self.bounded = bounded
        self.limit = limit
        #: as an ``availableNow`` run: the next batch must be wanted as the last one commits
        #: (Spark's next ``latestOffset`` comes then; a timer that asks later is too late)
        self.available_now = available_now
        self.wanted_at_commit = True
        self.alignment = AlignmentOptions.from_options(
            options if options is not None else {"maxDrift": "100s", "eventTimeColumn": "ts"},
            default_group="timed")
        self.parallelism = parallelism
        self.available: dict[str, int] = {}
        self.rows_per_batch = rows_per_batch
        self.splits = splits
        self.lanes = {s.split_id: s.lane for s in splits if isinstance(s, TimedSplit) and s.lane}
        self.h = self._harness(url)
        self.h.start()
        #: each reader's pickled state after the last committed batch
        self.states: dict[int, bytes | None] = {s: None for s in range(parallelism)}
        self.batches: list[Batch] = []
        self.greatest: dict[str, int] = {}
        #: the most unfinished splits of one lane a reader kept at the end of a batch
        self.most_held = 0

    def _harness(self, url: str | None) -> CoordinatorHarness:
        enumerator = functools.partial(
            SplitEnumerator, discovery=Splits(self.splits), bounded=self.bounded,
            alignment=self.alignment, clock=lambda: self.h.clock.now(), limit=self.limit)
        return CoordinatorHarness(enumerator, self.parallelism, name="timed", storage_url=url,
                                  available_now=self.available_now)

    def restart(self) -> None:
        """The driver restarts after the last batch committed: a fresh service restored from
        the records (its clock where the old one was), the readers from their states."""
        epoch, now, old = self.h.epoch, self.h.clock.now(), self.h
        self.h.service.close()
        self.h = self._harness(self.h.storage_url)
        self.h.clock.advance(now)
        # the test's client goes on numbering its requests (a number it used before is a
        # re-send, answered from the log with the old status)
        self.h._client_seqs = dict(old._client_seqs)
        self.h.start(RestorePoint(epoch, committed=True))
        assert self.h.service.failure is None, self.h.service.failure

    def reader(self) -> TimedReader:
        return TimedReader(self.alignment, self.available, self.rows_per_batch)

    def run_reader(self, subtask: int, events: list[Any], *,
                   stop_after: int | None = None) -> tuple[list[str], bytes | None]:
        """One task of ``subtask`` in the running batch: its rows and pickled state
        (``stop_after`` record batches: the task dies there, as before a retry)."""
        h = self.h
        state = self.states[subtask]
        reader = self.reader()
        context = SubtaskContext(
            "timed", subtask, self.parallelism, h.epoch, 0, 0,
            lambda event: h.send_from_subtask(subtask, event),
            lambda request, timeout_s: h.request_from_subtask(subtask, request))
        reader.open(context, None if state is None else pickle.loads(state))
        for event in events:
            reader.handle_operator_event(event)
        rows: list[str] = []
        for index, batch in enumerate(reader.process()):
            if stop_after is not None and index >= stop_after:
                break
            rows.extend(batch.column(0).to_pylist())
            for row_id, ts in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                  strict=True):
                key = self.lanes.get(row_id.split(":")[0], row_id.split(":")[0])
                self.greatest[key] = max(self.greatest.get(key, ts), ts)
        reader.close()
        return rows, pickle.dumps(reader.snapshot_state())

    def crash_in_a_batch_and_rerun_it(self) -> Batch:
        """The driver dies in the middle of the next batch (subtask 0 took a split and read a
        record batch; nothing committed) and restarts: Spark runs that batch again, and its
        new tasks get the sealed events of the epoch and the logged answers."""
        assert self.h.service.wants_batch()
        events = self.h.checkpoint()
        assert events is not None
        self.run_reader(0, events[0], stop_after=1)
        epoch, now = self.h.epoch, self.h.clock.now()
        self.h.service.close()
        self.h = self._harness(self.h.storage_url)
        self.h.clock.advance(now)
        self.h.start(RestorePoint(epoch, committed=False))
        assert self.h.service.failure is None, self.h.service.failure
        record = self.h.storage.read_record(epoch)
        codec = self.h.service.codec
        sealed = {s: [codec.decode(p) for p in record.events_for(SubtaskId("timed", s))]
                  for s in range(self.parallelism)}
        assert sealed == events  # the same decision for the rerun
        return self._finish_batch(sealed)

    def batch(self, *, retry: int | None = None) -> Batch:
        """Run the next batch; fails if nothing asked for it (the run would hang on Spark).
        ``retry``: that subtask's first task dies after one record batch and is retried."""
        assert self.h.service.wants_batch(), "nothing asked for a batch: the run would hang"
        assert self.wanted_at_commit or not self.available_now, (
            "nothing asked for a batch when the last one committed: an availableNow run "
            "would end here with work left")
        events = self.h.checkpoint()
        assert events is not None
        return self._finish_batch(events, retry)

    def _finish_batch(self, events: dict[int, list[Any]], retry: int | None = None) -> Batch:
        rows: dict[int, list[str]] = {}
        states: dict[int, bytes | None] = {}
        for subtask in range(self.parallelism):
            if subtask == retry:
                self.run_reader(subtask, events[subtask], stop_after=1)
                self.h.retry_task(subtask)
            rows[subtask], states[subtask] = self.run_reader(subtask, events[subtask])
        assert self.h.service.failure is None, self.h.service.failure
        self.h.commit()
        self.wanted_at_commit = self.h.service.wants_batch()
        self.states = states
        for state in states.values():
            restored = pickle.loads(state) if state is not None else None
            if restored is not None:
                lanes = [split.alignment_key for split, _ in restored.unfinished]
                self.most_held = max([self.most_held, *map(lanes.count, lanes)])
        decisions = {s: [e for e in events[s] if isinstance(e, AlignmentDecision)]
                     for s in range(self.parallelism)}
        done = Batch(self.h.epoch, decisions, rows, dict(self.greatest))
        self.batches.append(done)
        self.h.clock.advance(1.0)  # a second between batches: timers fire, time for idleness
        self.h.run()
        return done

    def until_done(self, limit: int = 200, **kwargs: Any) -> list[Batch]:
        while not self.finished():
            assert len(self.batches) < limit, f"not done after {limit} batches"
            self.batch(**kwargs)
        return self.batches

    def finished(self) -> bool:
        if not self.batches:
            return False  # a client is answered once the first epoch is sealed
        status = self.status()
        return status["pending"] == 0 and status["in_flight"] == 0

    def read(self) -> list[str]:
        return [row for b in self.batches for s in sorted(b.rows) for row in b.rows[s]]

    def status(self) -> dict[str, Any]:
        return self.h.ask_as_client("status").result()


def everything(splits: list[Any]) -> list[str]:
    return sorted(f"{s.split_id}:{i}" for s in splits for i in range(s.rows))


SLOW = TimedSplit("slow", rows=120, step_ms=1000)       # 1x: a second per row
FAST = TimedSplit("fast", rows=120, step_ms=20_000)     # 20x
FAST_SPAN_MS = (ROWS_PER_RECORD_BATCH - 1) * FAST.step_ms + FAST.step_ms  # one record batch


def test_two_splits_at_1x_and_20x_stay_within_max_drift_plus_one_record_batch() -> None:
    run = Run([SLOW, FAST])
    run.until_done()
    assert sorted(run.read()) == everything([SLOW, FAST])  # no row lost or read twice
    drift = run.alignment.max_drift_ms
    fast_paused = checked = 0
    for batch in run.batches:
        got = batch.decisions[0]
        assert len(got) == 1 and got == batch.decisions[1]  # every reader, every batch
        times = batch.event_times
        if times["slow"] < (SLOW.rows - 1) * SLOW.step_ms:
            # while the slow split is not at its end, the fast one is within the drift of the
            # slow one's watermark plus one record batch of its own, after every batch
            assert times["fast"] - times["slow"] <= drift + FAST_SPAN_MS, batch
            checked += 1
        fast_paused += "fast" in got[0].paused
    assert checked >= 25 and fast_paused >= 20  # the fast split did wait, most of the run
    # every decision lists at most the fast split as paused, never the slow one
    assert all("slow" not in b.decisions[0][0].paused for b in run.batches)
    # unaligned, the same run ends with the fast split far ahead after its first batches
    unaligned = Run([SLOW, FAST], options={})
    for _ in range(10):
        unaligned.batch()
    times = unaligned.batches[-1].event_times
    assert times["fast"] - times["slow"] > 3 * (drift + FAST_SPAN_MS)


def test_a_paused_split_resumes_from_its_position_once_the_slow_one_catches_up() -> None:
    run = Run([SLOW, FAST])
    batches = run.until_done()
    fast_rows = [row for b in batches for s in b.rows for row in b.rows[s]
                 if row.startswith("fast:")]
    assert fast_rows == [f"fast:{i}" for i in range(FAST.rows)]  # in order, from its position
    paused_at = [b.epoch for b in batches if "fast" in b.decisions[0][0].paused]
    resumed = [b.epoch for b in batches if b.epoch > paused_at[0]
               and any(r.startswith("fast:") for s in b.rows for r in b.rows[s])]
    assert resumed, "the fast split never read again after it was paused"
    assert run.status()["alignment"]["paused"] == []


def test_a_reader_with_no_unaligned_options_behaves_as_before() -> None:
    run = Run([SLOW, FAST], options={})
    run.until_done()
    assert sorted(run.read()) == everything([SLOW, FAST])
    assert all(b.decisions[s] == [] for b in run.batches for s in b.decisions)
    assert "alignment" not in run.status()


def transcript(run: Run) -> list[tuple[int, dict[int, list[str]], dict[int, Any]]]:
    return [(b.epoch, b.rows, {s: [pickle.dumps(d) for d in ds]
                               for s, ds in b.decisions.items()}) for b in run.batches]


LANES = [split for k in range(6) for split in (
    TimedSplit(f"slow/{k}", rows=8, first=8 * k, lane="slow"),
    TimedSplit(f"fast/{k}", rows=8, step_ms=20_000, first=8 * k, lane="fast"))]
WORKLOADS = pytest.mark.parametrize("splits", [[SLOW, FAST], LANES], ids=["splits", "lanes"])


@WORKLOADS
def test_a_task_retry_reads_and_decides_the_same(splits: list[Split]) -> None:
    options = {"maxDrift": "100s", "eventTimeColumn": "ts", "idleTimeout": "3s"}
    plain = Run(splits, options=options)
    plain.until_done()
    retried = Run(splits, options=options)
    while not retried.finished():
        # every third batch, a task dies after its first record batch and Spark retries it
        retried.batch(retry=len(retried.batches) % 2 if len(retried.batches) % 3 == 0 else None)
    assert transcript(retried) == transcript(plain)


@WORKLOADS
def test_a_restore_from_a_checkpoint_reads_and_decides_the_same(tmp_path: Any,
                                                                 splits: list[Split]) -> None:
    options = {"maxDrift": "100s", "eventTimeColumn": "ts", "idleTimeout": "3s"}
    plain = Run(splits, options=options)
    plain.until_done()
    run = Run(splits, options=options, url=f"file://{tmp_path}/records")
    run.batch()
    while "fast" not in run.batches[-1].decisions[0][0].paused:  # into a paused phase
        assert len(run.batches) < 20
        run.batch()
    run.restart()  # the replayed log asks for the next batch as the live run did
    paused = run.status()["alignment"]["paused"]
    assert paused == ["fast"]  # the pause survived with the alignment state
    run.until_done()
    assert transcript(run) == transcript(plain)
    assert sorted(run.read()) == everything(splits)


@WORKLOADS
def test_a_batch_run_again_after_a_driver_crash_reads_and_decides_the_same(
        tmp_path: Any, splits: list[Split]) -> None:
    options = {"maxDrift": "100s", "eventTimeColumn": "ts", "idleTimeout": "3s"}
    plain = Run(splits, options=options)
    plain.until_done()
    run = Run(splits, options=options, url=f"file://{tmp_path}/records")
    run.batch()
    while "fast" not in run.batches[-1].decisions[0][0].paused:
        assert len(run.batches) < 20
        run.batch()
    run.crash_in_a_batch_and_rerun_it()  # a paused batch, its log kept for the rerun
    run.batch()
    run.crash_in_a_batch_and_rerun_it()
    run.until_done()
    assert transcript(run) == transcript(plain)
    assert sorted(run.read()) == everything(splits)


def test_a_subtask_with_no_split_holds_nobody_back() -> None:
    run = Run([SLOW, FAST], parallelism=3)
    run.until_done()
    assert sorted(run.read()) == everything([SLOW, FAST])
    assert all(b.rows[2] == [] for b in run.batches)  # subtask 2 never had a split


def test_a_single_split_is_never_paused() -> None:
    run = Run([FAST], parallelism=1)
    batches = run.until_done()
    # four rows per batch (and one that finds the split's end after the limit stopped it)
    assert len(batches) == FAST.rows // 4 + 1
    assert all(b.decisions[0][0].paused == () for b in batches)


def test_an_empty_split_goes_idle_and_the_others_go_on() -> None:
    # the slow split is live and stops having data at row 10: the fast one waits until the
    # slow one was found empty for idleTimeout, then reads on; when the slow one has data
    # again it is back in the minimum
    run = Run([SLOW, FAST], options={"maxDrift": "100s", "eventTimeColumn": "ts",
                                     "idleTimeout": "3s", "alignmentUpdateInterval": "1s"})
    run.available["slow"] = 10
    for _ in range(6):
        run.batch()  # the fast split waits; the alignment timer keeps batches coming
    assert "fast" in run.batches[-1].decisions[0][0].paused
    for _ in range(4):
        run.batch()
    assert "slow" in run.batches[-1].decisions[0][0].idle
    while "fast" in run.batches[-1].event_times and run.greatest["fast"] < 119 * FAST.step_ms:
        run.batch()
        assert len(run.batches) < 100
    assert run.status()["alignment"]["idle"] == ["slow"]
    run.available["slow"] = SLOW.rows
    run.h.coordinator.context.request_batch()  # new data: the source's trigger
    run.until_done()
    assert sorted(run.read()) == everything([SLOW, FAST])


def test_a_paused_split_that_goes_idle_is_resumed_and_nothing_hangs() -> None:
    # both splits are live; the fast one is paused with rows still to read, the slow one then
    # runs out of data and goes idle: the fast one is resumed (an idle split leaves the
    # minimum, not the check) and read until it runs out too; no batch is asked for when
    # nothing waits; new data in both is read; every row exactly once
    run = Run([SLOW, FAST], options={"maxDrift": "100s", "eventTimeColumn": "ts",
                                     "idleTimeout": "2s"})
    run.available["fast"] = 20
    run.available["slow"] = 60
    for _ in range(3):
        run.batch()
    assert "fast" in run.batches[-1].decisions[0][0].paused
    for _ in range(30):
        if not run.h.service.wants_batch():
            break
        run.batch()
    assert run.greatest["slow"] == 59 * SLOW.step_ms and run.greatest["fast"] == 19 * FAST.step_ms
    # both caught up, nothing waits, so no batch is asked for (the trigger runs the next one
    # when data arrives): the slow split went idle, the fast one was resumed
    assert not run.h.service.wants_batch()
    alignment = run.status()["alignment"]
    assert alignment["idle"] == ["slow"] and alignment["paused"] == []
    run.available.update(slow=SLOW.rows, fast=FAST.rows)
    run.h.coordinator.context.request_batch()
    run.until_done()
    assert sorted(run.read()) == everything([SLOW, FAST])


class SpyEnumerator(SplitEnumerator):
    """Records how each report arrived."""

    arrivals: list[tuple[str, WatermarkReport]] = []

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        if request.watermarks is not None:
            self.arrivals.append(("request", request.watermarks))
        return super().handle_request(subtask, attempt, request)

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        if isinstance(event, WatermarkReport):
            self.arrivals.append(("event", event))
        super().handle_event_from_operator(subtask, attempt, event)


def test_reports_travel_with_the_next_request_and_the_rest_as_an_event() -> None:
    SpyEnumerator.arrivals = []
    run = Run([TimedSplit("a", rows=2), TimedSplit("b", rows=6)], parallelism=1)
    run.h.service.close()
    enumerator = functools.partial(SpyEnumerator, discovery=Splits(run.splits),
                                   alignment=run.alignment, clock=lambda: run.h.clock.now())
    run.h = CoordinatorHarness(enumerator, 1, name="timed")
    run.h.start()
    run.until_done()
    assert SpyEnumerator.arrivals == [
        # a read to its end: said with the request that gets b
        ("request", WatermarkReport(finished=("a",))),
        # the row limit stops b: no further request, the report goes as an event
        ("event", WatermarkReport(read=(("b", 1000),))),
        ("event", WatermarkReport(read=(("b", 5000),))),
        # b's end (found by the next batch), with the request that finds nothing more
        ("request", WatermarkReport(finished=("b",))),
    ]
    assert pickle.loads(run.states[0] or b"") is None  # nothing left: no reader state


def test_the_enumerator_refuses_reports_when_it_has_no_alignment() -> None:
    h = CoordinatorHarness(functools.partial(SplitEnumerator, discovery=Splits([SLOW])), 1, name="timed")
    h.start()
    h.checkpoint()
    h.ask_from_subtask(0, NextSplit((), WatermarkReport(read=(("slow", 1),))))
    assert "has no alignment options" in (h.service.failure or "")


def test_file_source_alignment_options_are_parsed_checked_and_left_out_of_the_file_options(
) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    struct = StructType([StructField("id", StringType()), StructField("ts", LongType())])
    given = {"maxDrift": "30s", "eventTimeColumn": "ts", "idleTimeout": "1 minute",
             "maxFilesPerTrigger": "2"}
    aligned = alignment_options(given, struct, "files")
    assert aligned is not None and aligned.max_drift_ms == 30_000 and aligned.group == "files"
    assert parse_options("/x", "json", given).max_files_per_trigger == 2
    assert alignment_options({"maxFilesPerTrigger": "2"}, struct, "files") is None
    with pytest.raises(ValueError, match="'eventTimeColumn' is needed"):
        alignment_options({"maxDrift": "30s"}, struct, "files")
    with pytest.raises(ValueError, match="'nope' is not a column"):
        alignment_options({"maxDrift": "30s", "eventTimeColumn": "nope"}, struct, "files")
    with pytest.raises(ValueError, match="column 'id' is a string"):
        alignment_options({"maxDrift": "30s", "eventTimeColumn": "id"}, struct, "files")
    with pytest.raises(ValueError, match="need 'maxDrift'"):
        alignment_options({"idleTimeout": "1s"}, struct, "files")
    with pytest.raises(ValueError, match="'maxDrift'"):
        alignment_options({"maxDrift": "soon", "eventTimeColumn": "ts"}, struct, "files")
    with pytest.raises(ValueError, match="unknown file source option 'maxdrfit'"):
        parse_options("/x", "json", {"maxdrfit": "1s"})


def two_lanes(files: int) -> tuple[list[TimedSplit], list[TimedSplit]]:
    """Two directories of eight-row files: ``slow/`` at 1 s and ``fast/`` at 20 s per row."""
    slow = [TimedSplit(f"slow/{k}", rows=8, step_ms=1000, first=8 * k, lane="slow")
            for k in range(files)]
    fast = [TimedSplit(f"fast/{k}", rows=8, step_ms=20_000, first=8 * k, lane="fast")
            for k in range(files)]
    return slow, fast


def test_lanes_align_a_directory_of_many_files_across_its_files() -> None:
    # two directories of eight-row files, discovered interleaved by arrival: the fast lane's
    # watermark outlives each of its files, its pending files wait while it is paused, and a
    # lane with nothing left goes idle (a live directory waiting for files) and then holds
    # nobody back
    files = 12
    slow, fast = two_lanes(files)
    run = Run([split for pair in zip(slow, fast, strict=True) for split in pair],
              options={"maxDrift": "100s", "eventTimeColumn": "ts", "idleTimeout": "5s"})
    run.until_done()
    assert sorted(run.read()) == everything(slow + fast)
    for k in range(files):  # each file from where it stopped, whichever reader had it
        rows = [row for row in run.read() if row.startswith(f"fast/{k}:")]
        assert rows == [f"fast/{k}:{i}" for i in range(8)]
    assert run.most_held == 1  # no reader took a paused lane's next files to keep them
    drift, span = run.alignment.max_drift_ms, 2 * 20_000
    last_slow = (8 * files - 1) * 1000
    checked = paused = 0
    for batch in run.batches:
        times = batch.event_times
        if times.get("slow", 0) < last_slow and "fast" in times:
            assert times["fast"] - times["slow"] <= drift + span, batch
            checked += 1
        paused += "fast" in batch.decisions[0][0].paused
    assert checked >= 10 and paused >= 10
    idle_from = next(b.epoch for b in run.batches if "slow" in b.decisions[0][0].idle)
    assert idle_from - last_slow_batch(run) <= 7  # five seconds of batches, and no hang
    # unaligned, the fast directory's files run ahead of the slow one's
    unaligned = Run([split for pair in zip(slow, fast, strict=True) for split in pair],
                    options={})
    for _ in range(10):
        unaligned.batch()
    times = unaligned.batches[-1].event_times
    assert times["fast"] - times["slow"] > 3 * (drift + span)


def last_slow_batch(run: Run) -> int:
    return max(b.epoch for b in run.batches if any(r.startswith("slow/") for s in b.rows
                                                   for r in b.rows[s]))


def test_a_bounded_source_forgets_a_lane_read_to_its_end_at_once() -> None:
    # an availableNow backlog: once the slow directory's last file is read, the fast one
    # goes on at the next decision, without waiting for the idle timeout (one minute here)
    slow = [TimedSplit(f"slow/{k}", rows=8, first=8 * k, lane="slow") for k in range(4)]
    fast = [TimedSplit(f"fast/{k}", rows=8, step_ms=20_000, first=8 * k, lane="fast")
            for k in range(4)]
    run = Run([split for pair in zip(slow, fast, strict=True) for split in pair], bounded=True)
    run.until_done()
    assert sorted(run.read()) == everything(slow + fast)
    assert len(run.batches) - last_slow_batch(run) <= 12  # the fast lane's rest, no wait
    assert all(b.decisions[0][0].idle == () for b in run.batches)
    run.h.checkpoint()  # the next boundary: the fast lane, read to its end, is forgotten too
    assert run.status()["alignment"]["splits"] == 0


def test_a_file_split_s_lane_is_its_directory(tmp_path: Any) -> None:
    from sparkcoord.sources.files.discovery import plan_splits
    from sparkcoord.sources.files.listing import FileEntry, filesystem
    from sparkcoord.sources.files.options import FileSourceOptions

    (tmp_path / "fast").mkdir()
    path = tmp_path / "fast" / "part-0.json"
    path.write_text('{"ts": 1}\n' * 100)
    fs, _ = filesystem(str(tmp_path))
    entry = FileEntry(str(path), path.stat().st_size, path.stat().st_mtime)
    splits = plan_splits(fs, entry, FileSourceOptions(str(tmp_path), "json", max_split_bytes=300))
    assert len(splits) > 1
    assert {s.alignment_key for s in splits} == {str(tmp_path / "fast")}


def test_the_greatest_event_time_of_a_record_batch_in_every_column_type() -> None:
    import datetime as dt

    from sparkcoord.sources.reader import greatest_event_time_ms

    utc = dt.timezone.utc
    moment = dt.datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=utc)
    millis = 1_714_564_800_250
    batch = pa.RecordBatch.from_arrays([
        pa.array([moment, None], pa.timestamp("us", tz="UTC")),
        pa.array([moment, None], pa.timestamp("ns", tz="Europe/Berlin")),
        pa.array([moment.replace(tzinfo=None), None], pa.timestamp("s")),
        pa.array([dt.date(2024, 5, 1), None], pa.date32()),
        pa.array([millis, 5], pa.int64()),
        pa.array([None, None], pa.timestamp("ms")),
        pa.array(["x", "y"]),
    ], names=["us", "ns", "s", "day", "epoch_ms", "nulls", "text"])
    assert greatest_event_time_ms(batch, "us") == millis
    assert greatest_event_time_ms(batch, "ns") == millis  # an instant: the zone does not count
    assert greatest_event_time_ms(batch, "s") == millis - 250
    assert greatest_event_time_ms(batch, "day") == millis - 12 * 3_600_000 - 250
    assert greatest_event_time_ms(batch, "epoch_ms") == millis
    assert greatest_event_time_ms(batch, "nulls") is None  # nulls move no watermark
    with pytest.raises(TypeError, match="'text' is a string"):
        greatest_event_time_ms(batch, "text")
    with pytest.raises(ValueError, match="'ts' is not in the source's schema"):
        greatest_event_time_ms(batch, "ts")


def test_a_file_reader_pauses_a_directory_past_the_allowed_maximum_and_keeps_its_place(
        tmp_path: Any) -> None:
    import json as js

    from sparkcoord.sources import NoSplitNow
    from sparkcoord.sources.files.discovery import plan_splits
    from sparkcoord.sources.files.listing import FileEntry, filesystem
    from sparkcoord.sources.files.options import FileSourceOptions
    from sparkcoord.sources.files.reading import FileReader

    (tmp_path / "fast").mkdir()
    path = tmp_path / "fast" / "part-0.json"
    path.write_text("".join(f'{{"id": {i}, "ts": {i * 20_000}}}\n' for i in range(10)))
    options = FileSourceOptions(str(tmp_path), "json", batch_rows=2)
    entry = FileEntry(str(path), path.stat().st_size, path.stat().st_mtime)
    (split,) = plan_splits(filesystem(str(tmp_path))[0], entry, options)
    lane = str(tmp_path / "fast")
    schema = js.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "long", "nullable": True, "metadata": {}}]})
    aligned = AlignmentOptions(group="files", max_drift_ms=30_000, event_time_column="ts")
    asked: list[Any] = []
    sent: list[Any] = []
    answers = [split, NoSplitNow()]

    def ask(request: Any, timeout_s: float) -> Any:
        asked.append(request)
        return answers.pop(0)

    reader = FileReader(options, schema, aligned)
    reader.open(SubtaskContext("files", 0, 1, 3, 0, 0, sent.append, ask), None)
    reader.coalesce_rows = 1
    reader.handle_operator_event(AlignmentDecision("files", 2, 0, 30_000))
    ids = [i for b in reader.process() for i in b.column(0).to_pylist()]
    # rows 0-1 (watermark 20s), 2-3 (60s, past 30s: the next record batch waits)
    assert ids == [0, 1, 2, 3]
    state = reader.snapshot_state()
    assert state.unfinished == [(split, 4)] and state.event_times == {lane: 60_000}
    assert asked[-1] == NextSplit((), WatermarkReport(read=((lane, 60_000),)))
    assert sent == []  # the report went with the request
    # the next batch, allowed further: it goes on from row 4, and the lane keeps its watermark
    again = FileReader(options, schema, aligned)
    answers[:] = [NoSplitNow()]
    again.open(SubtaskContext("files", 0, 1, 4, 0, 0, sent.append, ask), pickle.loads(
        pickle.dumps(state)))
    again.coalesce_rows = 1
    again.handle_operator_event(AlignmentDecision("files", 3, 200_000, 230_000))
    assert [i for b in again.process() for i in b.column(0).to_pylist()] == list(range(4, 10))
    assert asked[-1] == NextSplit((split.split_id,), WatermarkReport(read=((lane, 180_000),)))


def test_requests_and_splits_logged_before_alignment_are_the_same_items_today() -> None:
    # A re-sent request and a replayed answer are compared with the log, which an older
    # sparkcoord may have written before an upgrade: found by the files-kill soak, where a
    # restarted job's NextSplit(watermarks=None) was 88 bytes against the logged 73 and
    # failed the job as a nondeterministic subtask. They are the same item when they decode
    # to the same value (core/encoding.py rule 6), a field added since taking its default.
    import pickle

    from sparkcoord.core.encoding import loads, same_value
    from sparkcoord.sources.files.split import FileSplit
    from sparkcoord.sources.splits import NextSplit

    before_alignment = bytes.fromhex(
        "80049543000000000000008c19737061726b636f6f72642e736f75726365732e73706c697473948c094e"
        "65787453706c69749493942981947d948c0866696e6973686564948c017894859473622e")
    assert loads(before_alignment) == NextSplit(("x",))
    assert same_value(before_alignment, pickle.dumps(NextSplit(("x",))))
    assert not same_value(before_alignment, pickle.dumps(NextSplit(("y",))))
    split = FileSplit("p#0", 10, "/d/p", 10, 1.0, start=0, end=10)
    assert pickle.loads(pickle.dumps(split)) == split and split.lane == FileSplit.lane
    laned = FileSplit("p#0", 10, "/d/p", 10, 1.0, start=0, end=10, lane="/d")
    assert pickle.loads(pickle.dumps(laned)).lane == "/d"


def test_a_backlog_listed_with_the_ahead_lanes_files_first_is_still_read_aligned() -> None:
    # A backlog of old files beside a fast directory, listed fast/ first (as a sorted listing
    # of "fast/" and "slow/" is): a lane that has not reported may be the slowest, so it is
    # handed out first and holds the group back from its first report on
    files = 12
    slow, fast = two_lanes(files)
    run = Run(fast + slow, options={"maxDrift": "100s", "eventTimeColumn": "ts",
                                    "idleTimeout": "5s"})
    first = run.batch()
    assert any(r.startswith("slow/") for rows in first.rows.values() for r in rows), first
    run.until_done()
    assert sorted(run.read()) == everything(slow + fast)
    drift, span = run.alignment.max_drift_ms, 2 * 20_000
    last_slow = (8 * files - 1) * 1000
    for batch in run.batches:
        times = batch.event_times
        if times.get("slow", 0) < last_slow and "fast" in times:
            assert times["fast"] - times["slow"] <= drift + span + 8 * 20_000, batch
