"""Exactly-once scenarios on real Spark, shared by the tests and scripts/soak.py.

Scenario ``two-speeds`` (after Flink's CoordinatorEventsExactlyOnceITCase): two coordinators,
``fast`` (many numbers, quickly) and ``slow`` (few, slowly), each sending to its own subtask;
each completes its checkpoint futures one step late from its own thread (the next timer
tick, after that tick's send), each calls ``fail_job`` once at a seeded random number, and each
stalls briefly when an execution attempt fails so that sends race the failure. Every subtask's
surviving state and the sink must hold exactly [0..N-1] in order.
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
    """Completes each checkpoint future at its next tick, on its own thread (the mailbox)."""

    resets_per_subtask = True

    def __init__(self, context: Any, **kw: Any) -> None:
        super().__init__(context, **kw)
        self.pending: tuple[int, Future[Any]] | None = None

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        self.pending = (checkpoint_id, result)

    def tick(self) -> None:
        super().tick()
        if self.pending is not None:
            _, result = self.pending
            self.pending = None
            result.set_result({"next": list(self.next), "reports": [list(r) for r in self.reports]})

    def execution_attempt_failed(self, subtask: int, attempt: int, reason: str) -> None:
        threading.Event().wait(0.02)  # stall: sends queued meanwhile race the failure
        super().execution_attempt_failed(subtask, attempt, reason)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        # per-subtask coordinator: nothing unsealed survives; the counter is the sent record
        pass


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


def run_two_speeds(spark: Any, workdir: str, seed: int, fast: int = 120, slow: int = 8) -> Outcome:
    rng = random.Random(seed)
    markers = os.path.join(workdir, "markers")
    totals = {"fast": fast, "slow": slow}
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
    operators = [
        OperatorSpec("fast", functools.partial(
            LateCompletingNumbers, total=fast, per_tick=4, interval_s=0.03,
            fail_job_at=rng.randrange(fast // 4, fast - 1), marker_dir=markers), NumberCollector, 1),
        OperatorSpec("slow", functools.partial(
            LateCompletingNumbers, total=slow, per_tick=1, interval_s=0.3,
            fail_job_at=rng.randrange(1, slow - 1), marker_dir=markers), NumberCollector, 1),
    ]
    df = job.sources(operators, SCHEMA, name="two-speeds")
    out = os.path.join(workdir, "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")

    def rows() -> list[Any]:
        if not os.path.exists(os.path.join(out, "_spark_metadata")):
            return []
        try:
            return list(spark.read.parquet(out).collect())
        except Exception:  # noqa: BLE001 - nothing committed yet
            return []

    outcome = Outcome(seed)
    report = job.run(writer, restart=FixedDelay(attempts=4, delay_s=0.5),
                     until=lambda: len(rows()) >= fast + slow, poll_s=0.5, timeout_s=400)
    outcome.restarts = report.restarts
    check_sink(rows(), totals, outcome)
    storage = CheckpointStorage(job.coordination_url("two-speeds"))
    for op, total in totals.items():
        found = storage.read_subtask_state(SubtaskId(op, 0), 1 << 62)
        state = pickle.loads(found[1]) if found else None
        if state != list(range(total)):
            outcome.detail.append(f"state of {op}[0]: {state}")
    failed = sorted(m for m in os.listdir(markers)) if os.path.isdir(markers) else []
    if failed != ["fail_job-fast", "fail_job-slow"]:
        outcome.detail.append(f"injected failures were {failed}, expected one fail_job each")
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
