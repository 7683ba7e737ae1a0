"""Numbered events from a coordinator to each subtask, with optional injected failures.

``NumbersCoordinator`` sends ``Number(subtask, k)`` for k = 0..total-1 to every subtask, a few
per tick, from a timer on its mailbox, and records the reports the subtasks send back.
``NumberCollector`` keeps every number it received in its state, emits ``(operator, subtask,
value, position, epoch)`` rows (see ``SCHEMA``), and reports each number back to the
coordinator.

Failures are injected once per job, remembered by marker files in ``marker_dir`` (an external
side effect, so that a restarted query does not inject them again).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator
from sparkcoord.operator import RecipientOperator, SubtaskContext, SubtaskOperator

SCHEMA = "operator string, subtask int, value int, position int, epoch int"


@dataclass(frozen=True)
class Number:
    subtask: int
    value: int


def _once(marker_dir: str | None, name: str, times: int = 1) -> bool:
    """True the first ``times`` times ``name`` is claimed in ``marker_dir`` (atomic creates)."""
    if marker_dir is None:
        return False
    os.makedirs(marker_dir, exist_ok=True)
    for i in range(times):
        try:
            fd = os.open(os.path.join(marker_dir, name if i == 0 else f"{name}.{i}"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False


class NumbersCoordinator(OperatorCoordinator):
    def __init__(self, context: CoordinatorContext, total: int = 20, per_tick: int = 2,
                 interval_s: float = 0.05, fail_job_at: int | None = None,
                 marker_dir: str | None = None) -> None:
        super().__init__(context)
        self.total = total
        self.per_tick = per_tick
        self.interval_s = interval_s
        self.fail_job_at = fail_job_at
        self.marker_dir = marker_dir

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        p = self.context.parallelism
        state = state or {"next": [0] * p, "reports": [[] for _ in range(p)]}
        self.next = list(state["next"])
        self.reports = [list(r) for r in state["reports"]]

    def start(self) -> None:
        self.timer = self.context.call_periodically(self.interval_s, self.tick)

    def tick(self) -> None:
        for subtask, gateway in self.ready_gateways():
            for _ in range(self.per_tick):
                k = self.next[subtask]
                if k >= self.total:
                    break
                if (self.fail_job_at is not None and k == self.fail_job_at
                        and _once(self.marker_dir, f"fail_job-{self.context.operator_id}")):
                    self.context.fail_job(f"injected failure at number {k} of subtask {subtask}")
                    return
                gateway.send_event(Number(subtask, k))
                self.next[subtask] = k + 1

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.reports[subtask].append(event)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result({"next": self.next, "reports": self.reports})


class NumberCollector(SubtaskOperator):
    """Emits every number it gets; optionally fails its task at ``fail_task_at``, ``fail_times``
    times in all (4 exhausts local[2,4]'s retries and fails the query inside the batch)."""

    def __init__(self, fail_task_at: int | None = None, marker_dir: str | None = None,
                 report: bool = True, fail_times: int = 1) -> None:
        self.fail_task_at = fail_task_at
        self.fail_times = fail_times
        self.marker_dir = marker_dir
        self.report = report

    def open(self, context: SubtaskContext, state: Any) -> None:
        super().open(context, state)
        self.seen: list[int] = list(state or [])

    def handle_operator_event(self, event: Number) -> Any:
        ctx = self.context
        if (self.fail_task_at is not None and event.value == self.fail_task_at
                and _once(self.marker_dir, f"fail_task-{ctx.operator_id}-{ctx.subtask}",
                          self.fail_times)):
            raise RuntimeError(f"injected task failure at number {event.value}")
        self.seen.append(event.value)
        if self.report:
            ctx.send_event(("got", event.value))
        # position = how many numbers this subtask held before: equal to the value when every
        # number arrived exactly once and in order
        yield (ctx.operator_id, ctx.subtask, event.value, len(self.seen) - 1, ctx.epoch)

    def snapshot_state(self) -> Any:
        return self.seen


class DownstreamNumberCollector(NumberCollector, RecipientOperator):
    """The downstream twin of :class:`NumberCollector` (a ``mapInArrow`` recipient): same rows
    for its events, plus one ``("input", subtask, rows, -1, epoch)`` row per input chunk."""

    def process_input(self, rows: list[dict[str, Any]]) -> Any:
        if rows:
            yield ("input", self.context.subtask, len(rows), -1, self.context.epoch)
