"""A work queue: subtasks pull items of uneven cost from the coordinator inside the batch.

``WorkQueue`` holds the items; a ``QueueWorker`` asks ``"next"`` with
``SubtaskContext.request`` inside ``process()``, works on the item it gets, and asks again until
the answer is ``None`` ("nothing more this batch"): a fast worker takes more items, so the batch
ends near total work / P instead of waiting for the unluckiest static share. ``StaticShares``
and ``ShareWorker`` are the same work split at batch start (every item sent as an event to
subtask ``index % P``: what a coordinator could do before requests). Rows: ``SCHEMA``.

Work is simulated by sleeping ``cost`` seconds (an I/O-bound item, like reading a file), so the
comparison does not depend on the number of cores. Failures are injected once per job (marker
files, as in :mod:`sparkcoord.examples.numbers`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator
from sparkcoord.examples.numbers import _once
from sparkcoord.operator import SubtaskContext, SubtaskOperator

SCHEMA = "item int, subtask int, epoch int"


def skewed_costs(count: int, total_s: float, seed: int = 7) -> list[float]:
    """``count`` item costs summing to ``total_s``: a few large items and many small ones
    (a Pareto-like spread, deterministic for ``seed``)."""
    import random

    rng = random.Random(seed)
    weights = [rng.paretovariate(1.2) for _ in range(count)]
    scale = total_s / sum(weights)
    return [w * scale for w in weights]


class WorkQueue(OperatorCoordinator):
    """Hands out items one at a time; ``None`` when none is left. State: the items not yet
    handed out, and who got which (a checkpointed assignment: exactly once). Items a task
    retry did not pull again come back (``handle_items_withdrawn``) and go out first."""

    def __init__(self, context: CoordinatorContext, costs: list[float] | None = None,
                 fail_job_after: int | None = None, marker_dir: str | None = None) -> None:
        super().__init__(context)
        self.initial_costs = list(costs or [])
        self.costs = list(self.initial_costs)
        self.fail_job_after = fail_job_after
        self.marker_dir = marker_dir

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        if state is None:
            state = {"next": 0, "assigned": {}, "added": []}
        self.next: int = state["next"]
        self.assigned: dict[int, int] = dict(state["assigned"])
        # items handed to a failed attempt that its retry did not pull again: out first
        self.returned: list[int] = list(state.get("returned", []))
        # items added by client requests (part of the state: they survive restores)
        self.added: list[float] = list(state["added"])
        self.costs = self.initial_costs + self.added

    def handle_client_request(self, request: Any) -> Any:
        """``"status"``: how many items were handed out and are left; ``("add", costs)``: more
        items (a batch is asked for, so they are pulled without waiting for a timer)."""
        if request == "status":
            return {"handed_out": self.next - len(self.returned),
                    "left": len(self.costs) - self.next + len(self.returned), "done": self.done()}
        if isinstance(request, tuple) and request[0] == "add":
            first = len(self.costs)
            self.added.extend(request[1])
            self.costs.extend(request[1])
            self.context.request_batch()
            return list(range(first, len(self.costs)))
        raise ValueError(f"unknown client request {request!r}")

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        if request != "next":
            raise ValueError(f"unknown request {request!r}")
        if self.returned:
            item = self.returned.pop(0)
            self.assigned[item] = subtask
            return (item, self.costs[item])
        if self.next >= len(self.costs):
            return None
        if (self.fail_job_after is not None and self.next == self.fail_job_after
                and _once(self.marker_dir, "fail_job-workqueue")):
            self.context.fail_job(f"injected failure before item {self.next}")
            return None
        item = self.next
        self.next += 1
        self.assigned[item] = subtask
        return (item, self.costs[item])

    def handle_items_withdrawn(self, subtask: int, attempt: int, withdrawn: list[Any]) -> None:
        """A task retry of ``subtask`` finished without pulling these again (its budget ran
        out sooner): their items go back to the queue, first in line, and a batch is asked for
        so that they are pulled even if every other worker already stopped."""
        for w in withdrawn:
            if w.is_request and w.answered and w.answer is not None:
                item = w.answer[0]
                self.assigned.pop(item, None)
                self.returned.append(item)
        self.context.request_batch()

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result({"next": self.next, "assigned": self.assigned, "added": self.added,
                           "returned": self.returned})

    def done(self) -> bool:
        """Every item was handed out (mailbox thread)."""
        return self.next >= len(self.costs) and not self.returned


class QueueWorker(SubtaskOperator):
    """Pulls items until the queue says ``None``; optionally fails its task once after taking
    item ``fail_task_at`` (a retry in the middle of the queue). ``retry_budget``: a retried
    task pulls at most that many items (a retry left with less of a per-batch time budget;
    the items its failed attempt pulled beyond them go back to the queue)."""

    def __init__(self, fail_task_at: int | None = None, marker_dir: str | None = None,
                 retry_budget: int | None = None) -> None:
        self.fail_task_at = fail_task_at
        self.marker_dir = marker_dir
        self.retry_budget = retry_budget

    def process(self) -> Any:
        ctx: SubtaskContext = self.context
        pulled = 0
        while True:
            if ctx.spark_attempt > 0 and self.retry_budget is not None \
                    and pulled >= self.retry_budget:
                return
            pulled += 1
            answer = ctx.request("next")
            if answer is None:
                return
            item, cost = answer
            if (self.fail_task_at is not None and item == self.fail_task_at
                    and _once(self.marker_dir, f"fail_task-{item}")):
                raise RuntimeError(f"injected task failure after taking item {item}")
            time.sleep(cost)
            yield (item, ctx.subtask, ctx.epoch)


class StaticShares(OperatorCoordinator):
    """The baseline: every item sent at once as an event to subtask ``item % P``."""

    def __init__(self, context: CoordinatorContext, costs: list[float] | None = None) -> None:
        super().__init__(context)
        self.costs = list(costs or [])

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.sent = bool(state)

    def execution_attempt_ready(self, subtask: int, attempt: int, gateway: Any) -> None:
        super().execution_attempt_ready(subtask, attempt, gateway)
        if not self.sent and len(self._gateways) == self.context.parallelism:
            self.sent = True
            p = self.context.parallelism
            for s, g in self.ready_gateways():
                g.send_events([(i, c) for i, c in enumerate(self.costs) if i % p == s])

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(self.sent)


class ShareWorker(SubtaskOperator):
    """Works on the items its static share holds."""

    def handle_operator_event(self, event: Any) -> Any:
        item, cost = event
        time.sleep(cost)
        yield (item, self.context.subtask, self.context.epoch)
