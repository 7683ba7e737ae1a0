"""Exactly-once scenarios on real Spark, shared by the tests and scripts/soak.py.

Scenario ``two-speeds`` (after Flink's CoordinatorEventsExactlyOnceITCase): two coordinators,
``fast`` (many numbers, quickly) and ``slow`` (few, slowly), each sending to its own subtask;
each completes its checkpoint futures one step late from its own thread (the next timer
tick, after that tick's send), each calls ``fail_job`` once at a seeded random number, each subtask's task fails once at
another seeded number (a Spark task retry: the coordinator stalls in
``execution_attempt_failed`` so that its sends race the failure, then rewinds that subtask to its
boundary in ``subtask_reset``). Every subtask's surviving state, the sink and the reports in the
coordinators' checkpointed state must hold exactly [0..N-1] in order.
"""

from __future__ import annotations

import functools
import os
import pickle
import random
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.ids import SubtaskId
from sparkcoord.examples.numbers import SCHEMA, Number, NumberCollector, NumbersCoordinator
from sparkcoord.runtime.restart import FixedDelay
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.spark import CoordinatedJob, OperatorSpec


class LateCompletingNumbers(NumbersCoordinator):
    """Completes each checkpoint future at its next tick, on its own thread (the mailbox), and
    rewinds a subtask to its checkpoint boundary when that subtask's task is retried."""

    resets_per_subtask = True

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.pending: tuple[int, Future[Any]] | None = None
        # what each subtask had been sent and had reported at each boundary, for subtask_reset
        self.boundaries: dict[int, tuple[list[int], list[int]]] = {}
        self._remember_boundary(checkpoint_id)

    def _remember_boundary(self, checkpoint_id: int) -> None:
        self.boundaries[checkpoint_id] = (list(self.next), [len(r) for r in self.reports])

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        self.pending = (checkpoint_id, result)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for old in [c for c in self.boundaries if c < checkpoint_id]:
            del self.boundaries[old]

    def tick(self) -> None:
        super().tick()
        if self.pending is not None:
            checkpoint_id, result = self.pending
            self.pending = None
            self._remember_boundary(checkpoint_id)
            result.set_result({"next": list(self.next), "reports": [list(r) for r in self.reports]})

    def execution_attempt_failed(self, subtask: int, attempt: int, reason: str) -> None:
        threading.Event().wait(0.02)  # stall: sends queued meanwhile race the failure
        super().execution_attempt_failed(subtask, attempt, reason)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        # The retried task holds exactly what was sealed up to this boundary; what was sent to
        # it afterwards failed, and it reports this epoch's numbers again: rewind both.
        sent, reported = self.boundaries[checkpoint_id]
        self.next[subtask] = sent[subtask]
        del self.reports[subtask][reported[subtask]:]


@dataclass
class Outcome:
    seed: int
    restarts: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    detail: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.detail)


def check_sink(rows: list[Any], totals: dict[str, int], outcome: Outcome) -> None:
    """Count lost, duplicated and out-of-order numbers per subtask from the sink's rows."""
    for op, total in totals.items():
        got = sorted((r for r in rows if r.operator == op), key=lambda r: (r.position, r.epoch))
        values = [r.value for r in got]
        outcome.lost += len(set(range(total)) - set(values))
        outcome.duplicated += len(values) - len(set(values))
        outcome.out_of_order += sum(1 for r in got if r.value != r.position)
        if values != list(range(total)):
            outcome.detail.append(f"{op}: {values}")


def run_two_speeds(spark: Any, workdir: str, seed: int, fast: int = 120, slow: int = 8,
                   master_url: str | None = None) -> Outcome:
    """Run scenario two-speeds once with ``seed``; count what was lost, duplicated, reordered."""
    rng = random.Random(seed)
    markers = os.path.join(workdir, "markers")
    totals = {"fast": fast, "slow": slow}
    # checkpoints keep being sealed after the last number, so the final reports get checkpointed
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"), checkpoint_interval_s=0.5)
    operators = []
    for name, total, per_tick, interval_s in (("fast", fast, 4, 0.03), ("slow", slow, 1, 0.3)):
        coordinator = functools.partial(
            LateCompletingNumbers, total=total, per_tick=per_tick, interval_s=interval_s,
            fail_job_at=rng.randrange(total // 4, total - 1), marker_dir=markers)
        collector = functools.partial(
            NumberCollector, fail_task_at=rng.randrange(1, total - 1), marker_dir=markers)
        operators.append(OperatorSpec(name, coordinator, collector, 1))
    df = job.sources(operators, SCHEMA, name="two-speeds")
    out = os.path.join(workdir, "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    storage = CheckpointStorage(job.coordination_url("two-speeds"))

    def rows() -> list[Any]:
        if not os.path.exists(os.path.join(out, "_spark_metadata")):
            return []
        try:
            return list(spark.read.parquet(out).collect())
        except Exception:  # noqa: BLE001 - nothing committed yet
            return []

    def reports() -> dict[str, list[int]]:
        epochs = storage.record_epochs()
        if not epochs:
            return {}
        snapshots = storage.read_record(epochs[-1]).snapshots
        return {op: [v for _, v in pickle.loads(snapshots[op])["reports"][0]] for op in totals}

    def done() -> bool:
        got = reports()
        return len(rows()) >= fast + slow and all(len(got.get(op, ())) >= n for op, n in totals.items())

    outcome = Outcome(seed)
    report = job.run(writer, restart=FixedDelay(attempts=4, delay_s=0.5), until=done, poll_s=0.5,
                     timeout_s=400)
    outcome.restarts = report.restarts
    check_sink(rows(), totals, outcome)
    final_reports = reports()
    for op, total in totals.items():
        found = storage.read_subtask_state(SubtaskId(op, 0), 1 << 62)
        state = pickle.loads(found[1]) if found else None
        if state != list(range(total)):
            outcome.detail.append(f"state of {op}[0]: {state}")
        if final_reports.get(op) != list(range(total)):
            outcome.detail.append(f"reports checkpointed by {op}: {final_reports.get(op)}")
    failed = sorted(m for m in os.listdir(markers)) if os.path.isdir(markers) else []
    expected = ["fail_job-fast", "fail_job-slow", "fail_task-fast-0", "fail_task-slow-0"]
    if failed != expected:
        outcome.detail.append(f"injected failures were {failed}, expected {expected}")
    return outcome


class DecliningNumbers(NumbersCoordinator):
    """Declines the checkpoints in ``decline`` and leaves ``time_out`` to time out, each once
    per job (marker files), then behaves."""

    def __init__(self, context: Any, decline: tuple[int, ...] = (), time_out: int | None = None,
                 **kw: Any) -> None:
        super().__init__(context, **kw)
        self.decline = decline
        self.time_out = time_out
        self.abandoned: list[Future[Any]] = []

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        from sparkcoord.examples.numbers import _once

        if checkpoint_id in self.decline and _once(self.marker_dir, f"decline-{checkpoint_id}"):
            result.set_exception(RuntimeError(f"declining checkpoint {checkpoint_id} on purpose"))
            return
        if checkpoint_id == self.time_out and _once(self.marker_dir, f"timeout-{checkpoint_id}"):
            self.abandoned.append(result)  # never completed: the service times it out
            return
        super().checkpoint_coordinator(checkpoint_id, result)


class ResumingNumbers(NumbersCoordinator):
    """Flink's subtask-failure pattern: after a subtask's attempt failed, stop sending to it
    until the new attempt reports the last number it holds, then resume right after it."""

    resets_per_subtask = True

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.paused: set[int] = set()
        self.resumed_at: list[tuple[int, int]] = []

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        self.paused.add(subtask)  # what it was sent after the boundary failed: wait for its report

    def tick(self) -> None:
        for subtask, gateway in self.ready_gateways():
            if subtask in self.paused:
                continue
            for _ in range(self.per_tick):
                k = self.next[subtask]
                if k >= self.total:
                    break
                gateway.send_event(Number(subtask, k))
                self.next[subtask] = k + 1

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        if event[0] == "resume":
            self.next[subtask] = event[1] + 1
            self.paused.discard(subtask)
            self.resumed_at.append((subtask, event[1]))
            return
        super().handle_event_from_operator(subtask, attempt, event)


class ResumingCollector(NumberCollector):
    """A retried task reports the last number it holds (after its epoch's events)."""

    def process(self) -> Any:
        if self.context.spark_attempt > 0:
            self.context.send_event(("resume", self.seen[-1] if self.seen else -1))
        return None
