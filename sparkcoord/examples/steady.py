"""A steady load, for benchmarks: a coordinator that puts exactly ``events_per_epoch`` events
into every checkpoint, spread round-robin over the subtasks, and an operator that emits one
row per event (and optionally reports every event back to the coordinator).

Its rows have the schema of :mod:`sparkcoord.examples.plain`, whose plain source reads the
same values with the same partitions: the pair measures what coordination costs.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator
from sparkcoord.operator import SubtaskOperator

SCHEMA = "operator string, subtask int, value int, position int, epoch int"


class SteadyCoordinator(OperatorCoordinator):
    """Sends ``events_per_epoch`` small events right before each checkpoint boundary."""

    def __init__(self, context: CoordinatorContext, events_per_epoch: int = 1000) -> None:
        super().__init__(context)
        self.events_per_epoch = events_per_epoch
        self.sent = 0
        self.reports = 0

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.sent, self.reports = state or (0, 0)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        gateways = [g for _, g in self.ready_gateways()]
        p = len(gateways)
        for s, gateway in enumerate(gateways):  # event k goes to subtask k % p, value k // p
            gateway.send_events(range((self.events_per_epoch - s + p - 1) // p))
        self.sent += self.events_per_epoch
        result.set_result((self.sent, self.reports))

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.reports += 1


class SteadyOperator(SubtaskOperator):
    """One row per event; with ``report`` it also sends every event back."""

    def __init__(self, report: bool = False) -> None:
        self.report = report

    def handle_operator_event(self, event: int) -> Any:
        ctx = self.context
        if self.report:
            ctx.send_event(event)
        return ((ctx.operator_id, ctx.subtask, event, event, ctx.epoch),)
