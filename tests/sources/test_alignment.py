"""Watermark alignment without Spark (sparkcoord/sources/alignment.py): options, the reader's
per-split watermarks, the enumerator's decisions, the four Flink failures as behaviours
(FLINK-32414, -32496, -36751, -40093), determinism for replay, and properties over random runs
(the spread stays within max drift plus one record batch; nothing stays paused forever).

Randomized tests print their seed; replay one with
``SPARKCOORD_SEED=<seed> pytest tests/sources/test_alignment.py -k <test>``.
"""

from __future__ import annotations

import ast
import math
import os
import pathlib
import pickle
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcoord.sources.alignment import (
    NO_DECISION,
    AlignmentDecision,
    AlignmentOptions,
    AlignmentState,
    SplitWatermarks,
    WatermarkAlignment,
    WatermarkReport,
)

MODULE = pathlib.Path(__file__).resolve().parents[2] / "sparkcoord" / "sources" / "alignment.py"
EXAMPLES = int(os.environ.get("SPARKCOORD_EXAMPLES", "200"))


def options(max_drift_ms: int = 100, idle_timeout_ms: int | None = 1000,
            update_interval_ms: int = 1000) -> AlignmentOptions:
    return AlignmentOptions("g", max_drift_ms, update_interval_ms=update_interval_ms,
                            idle_timeout_ms=idle_timeout_ms)


def read(*pairs: tuple[str, int | None]) -> WatermarkReport:
    return WatermarkReport(read=tuple(sorted(pairs)))


def empty(*split_ids: str) -> WatermarkReport:
    return WatermarkReport(empty=tuple(sorted(split_ids)))


# ------------------------------------------------------------------ options
def test_options_parse_from_pyspark_style_strings() -> None:
    parsed = AlignmentOptions.from_options(
        {"alignmentGroup": "clicks", "maxDrift": "30s", "idleTimeout": "1 minute",
         "outOfOrderness": "500ms", "alignmentUpdateInterval": "2s",
         "eventTimeColumn": "ts"}, default_group="files")
    assert parsed == AlignmentOptions("clicks", 30_000, update_interval_ms=2000,
                                      idle_timeout_ms=60_000, out_of_orderness_ms=500,
                                      event_time_column="ts")


def test_option_names_ignore_case_and_other_options_are_left_alone() -> None:
    parsed = AlignmentOptions.from_options(
        {"MAXDRIFT": "1.5s", "maxFilesPerTrigger": "10", "header": "true"}, default_group="files")
    assert parsed == AlignmentOptions("files", 1500)
    assert parsed.idle_timeout_ms == 60_000 and parsed.update_interval_ms == 1000


def test_alignment_is_off_without_any_alignment_option() -> None:
    assert AlignmentOptions.from_options({"maxFilesPerTrigger": "1"}, default_group="f") is None


def test_an_alignment_option_without_max_drift_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'idleTimeout'.*need 'maxDrift'"):
        AlignmentOptions.from_options({"idleTimeout": "10s"}, default_group="f")


def test_a_bad_duration_is_an_error_naming_the_option() -> None:
    with pytest.raises(ValueError, match="'maxDrift'.*expected a duration"):
        AlignmentOptions.from_options({"maxDrift": "soon"}, default_group="f")
    with pytest.raises(ValueError, match="'idleTimeout'.*more than 0"):
        AlignmentOptions.from_options({"maxDrift": "1s", "idleTimeout": "0s"}, default_group="f")
    with pytest.raises(ValueError, match="'alignmentGroup'"):
        AlignmentOptions.from_options({"maxDrift": "1s", "alignmentGroup": " "},
                                      default_group="f")


def test_idle_timeout_none_turns_idleness_off() -> None:
    parsed = AlignmentOptions.from_options({"maxDrift": "0", "idleTimeout": "None"},
                                           default_group="f")
    assert parsed is not None and parsed.idle_timeout_ms is None and parsed.max_drift_ms == 0


def test_options_refuse_values_out_of_range() -> None:
    for bad in ({"max_drift_ms": -1}, {"update_interval_ms": 0}, {"idle_timeout_ms": 0},
                {"out_of_orderness_ms": -5}, {"group": ""}):
        fields: dict[str, object] = {"group": "g", "max_drift_ms": 10, **bad}
        with pytest.raises(ValueError):
            AlignmentOptions(**fields)  # type: ignore[arg-type]


def test_the_module_imports_no_spark_threads_sockets_or_clock_at_its_top() -> None:
    tree = ast.parse(MODULE.read_text())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # of sparkcoord, only the sans-IO core (its own imports: tests/test_layering.py)
            core = node.module.startswith("sparkcoord.core.")
            top.add("sparkcoord.core" if core else node.module.split(".")[0])
    assert top <= {"__future__", "collections", "dataclasses", "typing", "sparkcoord.core"}, top


# ------------------------------------------------------------------ the reader side
def test_a_split_watermark_is_the_greatest_event_time_minus_the_out_of_orderness() -> None:
    marks = SplitWatermarks(out_of_orderness_ms=50)
    assert marks.watermark("a") is None
    marks.observe("a", 1000)
    marks.observe("a", 900)  # an older record batch: the watermark never goes back
    assert marks.watermark("a") == 950
    marks.observe("a", None)  # rows without an event time: data, no new watermark
    assert marks.watermark("a") == 950


def test_a_reader_pauses_a_split_past_the_allowed_maximum_and_reads_one_without_a_watermark(
        ) -> None:
    marks = SplitWatermarks()
    decision = AlignmentDecision("g", 1, minimum=100, allowed_maximum=200)
    assert marks.may_read("new", decision)  # nothing read yet: it reads, then knows
    marks.observe("a", 200)
    marks.observe("b", 201)
    assert marks.may_read("a", decision) and not marks.may_read("b", decision)
    assert marks.may_read("b", NO_DECISION)  # before the first decision nothing pauses


def test_a_report_is_sorted_carries_each_change_once_and_starts_a_new_one() -> None:
    marks = SplitWatermarks(out_of_orderness_ms=10)
    marks.observe("b", 500)
    marks.observe("a", 100)
    marks.observe_empty("a")  # it read rows in this report: not empty
    marks.observe_empty("c")
    marks.observe("d", 7)
    marks.finished("d")
    assert marks.take_report() == WatermarkReport(read=(("a", 90), ("b", 490)), empty=("c",),
                                                  finished=("d",))
    assert not marks.take_report()
    assert marks.snapshot() == {"a": 100, "b": 500}


def test_a_restored_reader_keeps_its_watermarks_so_a_paused_split_stays_paused() -> None:
    marks = SplitWatermarks(out_of_orderness_ms=5)
    marks.observe("fast", 10_000)
    restored = SplitWatermarks(5, pickle.loads(pickle.dumps(marks.snapshot())))
    decision = AlignmentDecision("g", 3, minimum=0, allowed_maximum=1000)
    assert restored.watermark("fast") == 9995 and not restored.may_read("fast", decision)


# ------------------------------------------------------------------ the enumerator side
def test_before_any_report_nothing_pauses() -> None:
    alignment = WatermarkAlignment(options())
    assert alignment.decision == NO_DECISION
    decision = alignment.decide(0)
    assert (decision.minimum, decision.allowed_maximum, decision.paused) == (None, None, ())
    assert decision.allows(10**15) and decision.number == 1


def test_the_allowed_maximum_is_the_minimum_over_splits_plus_max_drift() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100))
    alignment.observe(read(("slow", 1000), ("fast", 1500)))
    alignment.observe(read(("middle", 1100)))
    decision = alignment.decide(0)
    assert (decision.minimum, decision.allowed_maximum) == (1000, 1100)
    assert decision.paused == ("fast",)
    assert alignment.status()["spread_ms"] == 500


def test_a_split_that_catches_up_resumes_the_paused_ones() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100))
    alignment.observe(read(("slow", 0), ("fast", 1000)))
    assert alignment.decide(0).paused == ("fast",)
    alignment.observe(read(("slow", 950)))
    assert alignment.decide(1).paused == ()


def test_a_reader_or_split_without_a_watermark_holds_nobody_back() -> None:
    # FLINK-32414: a subtask without a split reported an "uninitialized" watermark and the
    # group's minimum sat at the bottom forever
    alignment = WatermarkAlignment(options(max_drift_ms=100))
    alignment.observe(WatermarkReport())  # a reader that has no split
    alignment.observe(read(("no-event-time", None)))  # rows but no event time yet
    alignment.observe(read(("a", 5000), ("b", 5050)))
    decision = alignment.decide(0)
    assert (decision.minimum, decision.allowed_maximum, decision.paused) == (5000, 5100, ())


def test_an_idle_split_leaves_the_minimum_and_resumes_with_its_data() -> None:
    # FLINK-32496: with alignment and idleness, a split that had been idle never resumed
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("active", 0), ("quiet", 0)))
    alignment.decide(0)
    for now in (500, 1000):
        alignment.observe(read(("active", now)))
        alignment.observe(empty("quiet"))
        decision = alignment.decide(now)
    assert decision.idle == ("quiet",) and decision.minimum == 1000
    assert decision.allows(0)  # the idle split itself is behind: its reader may read it
    alignment.observe(read(("quiet", 800), ("active", 1050)))
    decision = alignment.decide(1500)
    assert decision.idle == () and decision.minimum == 800  # back in the minimum
    assert decision.paused == ("active",)  # ... so the one ahead waits for it


def test_when_every_split_is_idle_nothing_pauses() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=10, idle_timeout_ms=100))
    alignment.observe(read(("a", 0), ("b", 10_000)))
    alignment.decide(0)
    alignment.observe(empty("a", "b"))
    decision = alignment.decide(100)
    assert decision.idle == ("a", "b")
    assert (decision.minimum, decision.allowed_maximum, decision.paused) == (None, None, ())


def test_a_single_split_is_never_paused_however_far_it_runs() -> None:
    # FLINK-36751: with one split, the clock did not pause and the source stalled
    alignment = WatermarkAlignment(options(max_drift_ms=0))
    marks = SplitWatermarks()
    for step, event_time in enumerate((0, 10**6, 10**9, 10**12)):
        decision = alignment.decide(step * 1000)
        assert marks.may_read("only", decision)
        marks.observe("only", event_time)
        alignment.observe(marks.take_report())
    assert alignment.decide(10_000).paused == ()


def test_waiting_for_alignment_does_not_count_as_idleness() -> None:
    # FLINK-35886 / -36751: a split blocked by alignment must not time out into idleness
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("slow", 0), ("fast", 5000)))
    for now in range(0, 20_000, 1000):  # twenty idle timeouts; fast is paused, not tried
        alignment.observe(read(("slow", now // 5)))
        decision = alignment.decide(now)
        assert decision.paused == ("fast",) and decision.idle == ()
    assert alignment.next_check_ms() == 19_000 + 1000  # it waits, so it asks to be decided


def test_a_paused_split_that_went_idle_is_resumed_once_the_others_catch_up() -> None:
    # FLINK-40093: a paused split marked idle was left out of the alignment check and never
    # resumed. Here "b" times out in the same decision in which a late split lowers the minimum.
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("a", 1000), ("b", 1050)))
    alignment.decide(0)
    alignment.observe(read(("a", 1060), ("late", 200)))
    alignment.observe(empty("b"))
    decision = alignment.decide(1000)
    assert decision.idle == ("b",) and "b" in decision.paused
    assert decision.minimum == 200  # the idle split holds nobody back
    marks = SplitWatermarks()
    marks.observe("b", 1050)
    assert not marks.may_read("b", decision)
    alignment.observe(read(("late", 960), ("a", 1060)))  # the late one catches up
    decision = alignment.decide(2000)
    assert "b" not in decision.paused and marks.may_read("b", decision)


def test_a_paused_idle_split_is_resumed_when_the_others_go_idle_too() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("b", 1050)))
    alignment.decide(0)
    alignment.observe(read(("late", 200)))
    alignment.observe(empty("b"))
    decision = alignment.decide(1000)
    assert decision.idle == ("b",) and decision.paused == ("b",)
    alignment.observe(empty("late"))
    decision = alignment.decide(2000)
    assert decision.idle == ("b", "late") and decision.allowed_maximum is None
    assert decision.allows(1050)


def test_a_split_paused_behind_an_empty_one_resumes_when_that_one_goes_idle() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("a", 0), ("b", 5000)))
    assert alignment.decide(0).paused == ("b",)
    alignment.observe(empty("a"))
    decision = alignment.decide(1000)
    assert decision.idle == ("a",) and decision.paused == () and decision.allows(5000)


def test_a_finished_split_holds_nobody_back() -> None:
    # FLINK-35157: finished subtasks kept the group's minimum where they had stopped
    alignment = WatermarkAlignment(options(max_drift_ms=100))
    alignment.observe(read(("done", 0), ("live", 5000)))
    assert alignment.decide(0).paused == ("live",)
    alignment.observe(WatermarkReport(finished=("done",)))
    decision = alignment.decide(1)
    assert decision.paused == () and decision.minimum == 5000
    alignment.observe(read(("other", 10)))
    alignment.forget(["other"])  # finished, as the enumerator learned from NextSplit
    assert alignment.decide(2).minimum == 5000 and alignment.status()["splits"] == 1


def test_without_an_idle_timeout_an_empty_split_holds_the_group() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=None))
    alignment.observe(read(("empty", 0), ("busy", 500)))
    for now in range(0, 100_000, 10_000):
        alignment.observe(empty("empty"))
        decision = alignment.decide(now)
    assert decision.idle == () and decision.paused == ("busy",)


def test_idle_time_counts_only_between_decisions_in_which_the_split_was_found_empty() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("a", 0)))
    alignment.decide(0)
    alignment.observe(empty("a"))
    assert alignment.decide(600).idle == ()
    alignment.decide(5000)  # not tried in this interval (no batch ran): not counted
    alignment.observe(empty("a"))
    assert alignment.decide(5300).idle == ()  # 600 + 300
    alignment.observe(empty("a"))
    assert alignment.decide(5400).idle == ("a",)  # 600 + 300 + 100


def test_a_clock_that_goes_back_counts_no_time() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, idle_timeout_ms=1000))
    alignment.observe(read(("a", 0)))
    alignment.decide(50_000)
    alignment.observe(empty("a"))
    assert alignment.decide(10).idle == ()
    assert alignment.state.splits["a"].quiet_ms == 0


def test_a_batch_is_asked_for_only_while_a_split_waits() -> None:
    alignment = WatermarkAlignment(options(max_drift_ms=100, update_interval_ms=250))
    assert alignment.next_check_ms() is None
    alignment.observe(read(("a", 0), ("b", 50)))
    alignment.decide(1000)
    assert alignment.next_check_ms() is None  # aligned
    alignment.observe(empty("a"))
    alignment.decide(1200)
    assert alignment.next_check_ms() is None  # "a" is empty, but nobody waits for it
    alignment.observe(read(("b", 500)))  # a reader paused "b" inside the batch
    assert alignment.next_check_ms() == 1450
    alignment.decide(1300)
    assert alignment.decision.paused == ("b",) and alignment.next_check_ms() == 1550
    alignment.observe(read(("a", 450)))
    alignment.decide(1400)
    assert alignment.next_check_ms() is None


def test_a_restored_state_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match="not an AlignmentState"):
        WatermarkAlignment(options(), state={"splits": {}})  # type: ignore[arg-type]


# ------------------------------------------------------------------ determinism
def test_the_decision_does_not_depend_on_the_order_splits_were_first_seen() -> None:
    one, other = WatermarkAlignment(options()), WatermarkAlignment(options())
    one.observe(read(("c", 300), ("a", 100), ("b", 900)))
    for split_id, watermark in (("b", 900), ("c", 300), ("a", 100)):
        other.observe(read((split_id, watermark)))
    assert pickle.dumps(one.decide(7)) == pickle.dumps(other.decide(7))


def test_a_decision_pickles_to_the_same_bytes_in_processes_with_other_string_hashes() -> None:
    script = (
        "import importlib.util, pickle, sys\n"
        f"spec = importlib.util.spec_from_file_location('alignment', {str(MODULE)!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules['alignment'] = module\n"
        "spec.loader.exec_module(module)\n"
        "a = module.WatermarkAlignment(module.AlignmentOptions('g', 10, idle_timeout_ms=5))\n"
        "a.observe(module.WatermarkReport(read=tuple((f's{i}', i * 7 % 50) for i in range(40))))\n"
        "a.observe(module.WatermarkReport(empty=tuple(f's{i}' for i in range(0, 40, 3))))\n"
        "a.decide(0); a.decide(10)\n"
        "sys.stdout.write(pickle.dumps((a.decision, a.state)).hex())\n")
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2", "3")}
    assert len(outputs) == 1


# ------------------------------------------------------------------ randomized runs
@dataclass
class Lane:
    """A simulated split: its record batches as (step it becomes readable, greatest event time),
    in order, and the reader that holds it."""

    split_id: str
    batches: list[tuple[int, int]]
    reader: int
    next: int = 0
    finished: bool = False
    #: the test's own account of idleness: time found empty since the split last read rows
    quiet_ms: int = 0

    def available(self, step: int) -> bool:
        return self.next < len(self.batches) and self.batches[self.next][0] <= step

    def done(self) -> bool:
        return self.next >= len(self.batches)


@dataclass
class Run:
    """Readers and an enumerator in lock step: each step is one batch, decided at its start."""

    options: AlignmentOptions
    lanes: list[Lane]
    parallelism: int
    record_batches_per_step: int
    alignment: WatermarkAlignment = field(init=False)
    readers: list[SplitWatermarks] = field(init=False)
    now_ms: int = 0
    step: int = 0
    #: (split id, watermark before, watermark after, decision) for every record batch read
    reads: list[tuple[str, int | None, int | None, AlignmentDecision]] = field(
        default_factory=list)
    #: (now_ms, reports of the step) for a replay
    history: list[tuple[int, list[WatermarkReport]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.alignment = WatermarkAlignment(self.options)
        self.readers = [SplitWatermarks(self.options.out_of_orderness_ms)
                        for _ in range(self.parallelism)]

    def watermark(self, lane: Lane) -> int | None:
        return self.readers[lane.reader].watermark(lane.split_id)

    def run_step(self, step_ms: int) -> AlignmentDecision:
        decision = self.decide()
        self.read_batch(decision, step_ms)
        return decision

    def decide(self) -> AlignmentDecision:
        """The boundary of the next batch."""
        return self.alignment.decide(self.now_ms)

    def read_batch(self, decision: AlignmentDecision, step_ms: int) -> None:
        """The batch: every reader reads its splits under ``decision`` and reports."""
        self.reads.clear()
        reports = []
        for reader, marks in enumerate(self.readers):
            for lane in (lane for lane in self.lanes if lane.reader == reader
                         and not lane.finished):
                self._read(lane, marks, decision, step_ms)
            reports.append(marks.take_report())
        for report in reports:
            self.alignment.observe(report)
        self.history.append((self.now_ms, reports))
        self.now_ms += step_ms
        self.step += 1

    def _read(self, lane: Lane, marks: SplitWatermarks, decision: AlignmentDecision,
              step_ms: int) -> None:
        read_rows = False
        for _ in range(self.record_batches_per_step):
            if lane.done():
                marks.finished(lane.split_id)
                lane.finished = True
                return
            if not marks.may_read(lane.split_id, decision):
                return  # paused: not tried, so not empty either
            if not lane.available(self.step):
                if not read_rows:
                    marks.observe_empty(lane.split_id)
                    lane.quiet_ms += step_ms
                return
            before = marks.watermark(lane.split_id)
            marks.observe(lane.split_id, lane.batches[lane.next][1])
            lane.next += 1
            read_rows, lane.quiet_ms = True, 0
            self.reads.append((lane.split_id, before, marks.watermark(lane.split_id),
                               decision))

    def active_watermarks(self, decision: AlignmentDecision) -> dict[str, int]:
        return {lane.split_id: wm for lane in self.lanes
                if not lane.finished and lane.split_id not in decision.idle
                and (wm := self.watermark(lane)) is not None}


def random_run(rng: random.Random, *, busy: bool) -> tuple[Run, int]:
    """A run and its largest record-batch span. ``busy``: every split starts at event time 0
    with its whole backlog readable (rates differ, up to 20x); otherwise record batches arrive
    over time, with gaps (idleness) and splits that start late and behind."""
    max_span = rng.choice([10, 50, 200])
    drift = rng.choice([0, 1, 25, 100, 1000])
    lanes = []
    for index in range(rng.randint(1, 6)):
        rate = rng.choice([1, 2, 20]) if busy else rng.randint(1, 20)
        event_time = 0 if busy else rng.randint(0, 3000)
        arrival = 0 if busy else rng.choice([0, 0, rng.randint(0, 60)])
        batches = []
        for _ in range(rng.randint(1, 40)):
            event_time += rng.randint(0, max_span * rate // 20)
            if not busy and rng.random() < 0.1:
                arrival += rng.randint(1, 30)  # a gap: nothing to read for a while
            batches.append((arrival, event_time))
        lanes.append(Lane(f"s{index}", batches, reader=index % 3))
    idle_timeout = rng.choice([None, 300, 1000, 5000]) if not busy else rng.choice([None, 1000])
    opts = AlignmentOptions("g", drift, update_interval_ms=100, idle_timeout_ms=idle_timeout,
                            out_of_orderness_ms=rng.choice([0, 5, 30]))
    return Run(opts, lanes, parallelism=3, record_batches_per_step=rng.randint(1, 4)), max_span


def seed_of(seed: int) -> int:
    seed = int(os.environ.get("SPARKCOORD_SEED", seed))
    print(f"seed={seed}")
    return seed


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_spread_above_the_group_minimum_stays_within_max_drift_plus_one_record_batch(
        seed: int) -> None:
    rng = random.Random(seed_of(seed))
    run, max_span = random_run(rng, busy=True)
    bound = run.options.max_drift_ms + max_span
    first_excess: dict[str, int] = {}
    within: set[str] = set()
    minimum_before: int | None = None
    while not all(lane.finished for lane in run.lanes):
        decision = run.run_step(step_ms=100)
        # every record batch read under this decision started at most at the split's allowed
        # maximum, so it ended at most its own span past it: max drift above the decision's
        # minimum, or, for the split alone at the minimum, max drift above the next-lowest
        for split_id, before, after, read_under in run.reads:
            allowed = read_under.allowed_maximum_of(split_id)
            if before is not None and allowed is not None:
                assert before <= allowed, split_id
                assert after is not None and after - allowed <= max_span, split_id
                if split_id != read_under.lowest:
                    assert read_under.minimum is not None
                    assert after - read_under.minimum <= bound, split_id
        # the splits are all busy, so the minimum never goes back ...
        if minimum_before is not None and decision.minimum is not None:
            assert decision.minimum >= minimum_before
        minimum_before = decision.minimum if decision.minimum is not None else minimum_before
        # ... and once a split is within max drift plus one batch of it, it stays there; the
        # only excess beyond that comes from the first batch, read before any report
        if decision.minimum is None or decision.number < 2:
            continue
        active = run.active_watermarks(decision)
        for split_id, watermark in active.items():
            # the split alone at the minimum moved the minimum itself: it is held by the
            # others, so its excess is over the least watermark now
            floor = min(active.values()) if split_id == decision.lowest else decision.minimum
            excess = watermark - floor
            first_excess.setdefault(split_id, excess)
            assert excess <= max(bound, first_excess[split_id]), (split_id, excess)
            if excess <= bound:
                within.add(split_id)
            assert split_id not in within or excess <= bound, (split_id, excess)
        assert run.step < 10_000, "the run does not end"


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_no_split_stays_paused_forever_once_the_others_catch_up_or_go_idle(seed: int) -> None:
    rng = random.Random(seed_of(seed))
    run, _ = random_run(rng, busy=False)
    timeout = run.options.idle_timeout_ms
    idle_steps = 0 if timeout is None else math.ceil(timeout / 100) + 1
    total = sum(len(lane.batches) for lane in run.lanes)
    last_arrival = max(lane.batches[-1][0] for lane in run.lanes)
    limit = last_arrival + (total + 1) * (len(run.lanes) + 1) * (idle_steps + 2)
    while not all(lane.finished for lane in run.lanes):
        decision, step = run.decide(), run.step
        # idleness as the test counts it: found empty for the timeout since it last read
        assert set(decision.idle) == {
            lane.split_id for lane in run.lanes if not lane.finished
            and timeout is not None and lane.quiet_ms >= timeout}
        # progress, or the minimum is held by a split that has nothing to read right now (it
        # goes idle within the timeout, or its data arrives)
        waiting = [lane for lane in run.lanes if not lane.finished and lane.available(step)]
        if waiting and not any(decision.allows(run.watermark(lane), lane.split_id)
                               for lane in waiting):
            holders = [lane for lane in run.lanes if not lane.finished
                       and lane.split_id not in decision.idle
                       and run.watermark(lane) == decision.minimum]
            assert holders and all(not lane.available(step) for lane in holders), decision
            # ... and the enumerator asks for the batches that let it go idle or catch up
            assert run.alignment.next_check_ms() == run.now_ms + 100
        run.read_batch(decision, step_ms=100)
        assert run.step <= limit, f"still paused after {run.step} steps: {decision}"


@settings(max_examples=max(EXAMPLES // 4, 10), deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_restore_that_replays_the_reports_makes_the_same_decisions(seed: int) -> None:
    rng = random.Random(seed_of(seed))
    run, _ = random_run(rng, busy=rng.random() < 0.5)
    decisions = []
    while not all(lane.finished for lane in run.lanes) and run.step < 2000:
        decisions.append(run.run_step(step_ms=rng.choice([50, 100, 700])))
    # the snapshot of batch k holds its decision; a restore to it replays the batch's reports
    k = rng.randint(0, len(decisions) - 1)
    replayed = WatermarkAlignment(run.options)
    for now_ms, reports in run.history[:k]:
        replayed.decide(now_ms)
        for report in reports:
            replayed.observe(report)
    replayed.decide(run.history[k][0])
    restored = WatermarkAlignment(run.options, pickle.loads(pickle.dumps(replayed.state)))
    assert isinstance(restored.state, AlignmentState)
    assert pickle.dumps(restored.decision) == pickle.dumps(decisions[k])
    for index, (now_ms, reports) in enumerate(run.history[k:], start=k):
        if index > k:
            assert pickle.dumps(restored.decide(now_ms)) == pickle.dumps(decisions[index])
        for report in reports:
            restored.observe(report)
    assert pickle.dumps(restored.state) == pickle.dumps(run.alignment.state)


def test_the_random_runs_really_pause_idle_and_lower_the_minimum() -> None:
    # the properties above would hold vacuously if the runs never paused anything
    seen: dict[str, int] = dict.fromkeys(
        ("paused", "idle", "paused and idle", "minimum lowered by a late split"), 0)
    for seed in range(100):
        run, _ = random_run(random.Random(seed), busy=seed % 2 == 0)
        minimum_before: int | None = None
        while not all(lane.finished for lane in run.lanes):
            decision = run.decide()
            seen["paused"] += bool(decision.paused)
            seen["idle"] += bool(decision.idle)
            seen["paused and idle"] += bool(set(decision.paused) & set(decision.idle))
            seen["minimum lowered by a late split"] += (
                minimum_before is not None and decision.minimum is not None
                and decision.minimum < minimum_before)
            minimum_before = decision.minimum
            run.read_batch(decision, step_ms=100)
    assert all(count >= 10 for count in seen.values()), seen
