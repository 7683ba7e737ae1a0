"""User code written against sparkcoord's public API, checked with ``mypy --strict`` in CI
(pyproject's ``[tool.mypy] files``): a type error here means the API's types regressed for
users (issue 14, item 6). It is type-checked, not run (the tests run the same shapes)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, assert_type

from pyspark.sql import DataFrame, SparkSession

from sparkcoord import (
    CoordinatorContext,
    FixedDelay,
    OperatorCoordinator,
    RequestFailed,
    RequestRefused,
    SubtaskGateway,
)
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources import FileStream
from sparkcoord.spark import CoordinatedJob, JobHandle, RunReport, SubtaskOperator
from sparkcoord.testing import CoordinatorHarness


class Queue(OperatorCoordinator):
    def __init__(self, context: CoordinatorContext, items: list[int]) -> None:
        super().__init__(context)
        self.items = list(items)

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        if state is not None:
            self.items = list(state)

    def execution_attempt_ready(self, subtask: int, attempt: int, gateway: SubtaskGateway) -> None:
        super().execution_attempt_ready(subtask, attempt, gateway)
        sent: Future[None] = gateway.send_event(("hello", subtask))
        assert_type(sent, Future[None])

    def handle_request(self, subtask: int, attempt: int, request: Any) -> int | None:
        assert_type(self.context.parallelism, int)
        return self.items.pop(0) if self.items else None

    def handle_client_request(self, request: Any) -> dict[str, int]:
        self.context.request_batch()
        return {"left": len(self.items)}

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(list(self.items))


class Worker(SubtaskOperator):
    def open(self, context: SubtaskContext, state: Any) -> None:
        super().open(context, state)
        assert_type(context.subtask, int)
        assert_type(context.epoch, int)

    def process(self) -> Iterator[tuple[int, int]]:
        while True:
            try:
                item = self.context.request("next", timeout_s=10.0)
            except (RequestRefused, RequestFailed):
                raise
            if item is None:
                return
            self.context.send_event(("done", item))
            yield (int(item), self.context.subtask)


def run(spark: SparkSession) -> None:
    job = CoordinatedJob(spark, "ckpt/")
    rows = job.source(Worker, functools.partial(Queue, items=[1, 2, 3]), 2,
                      "item int, subtask int", name="queue")
    assert_type(rows, DataFrame)
    files = (FileStream(job).format("json").schema("id long").option("maxFilesPerTrigger", 10)
             .storage_options(anon=True).load("s3://bucket/events/"))
    assert_type(files, DataFrame)
    handle = job.start(rows.writeStream.format("noop"), restart=FixedDelay(attempts=3, delay_s=1.0))
    assert_type(handle, JobHandle)
    assert_type(handle.restarts, int)
    status = handle.request("queue", "status", timeout_s=5.0)
    print(status)
    assert_type(handle.await_termination(10.0), bool)
    report = job.run(rows.writeStream.format("noop"), until=lambda: True)
    assert_type(report, RunReport)


def harness() -> None:
    h = CoordinatorHarness(functools.partial(Queue, items=[1]), parallelism=1)
    h.start()
    h.checkpoint()
    answer = h.ask_from_subtask(0, "next")
    assert_type(answer, Future[Any])
    print(h.request_from_subtask(0, "next"))
