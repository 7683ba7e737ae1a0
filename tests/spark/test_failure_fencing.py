"""A coordinator that raised gets no further callback, on real Spark (issue 11).

The coordinator commits a side effect where the docs say to: ``notify_checkpoint_complete(N)``
writes its state to ``side/<N>.json``. Subtask 0 answers the coordinator's "go" with three
events, ``a``, ``boom``, ``c``, in the batch of epoch 0. Once ``armed`` exists, the coordinator
raises on ``boom``. A failed instance must never write a side file (its state matches no
checkpoint), and the job runner's error must start with sparkcoord's cause and carry the
user's traceback.
"""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator, SubtaskGateway
from sparkcoord.runtime.restart import NoRestart
from sparkcoord.spark import CoordinatedJob, JobGaveUp, SubtaskOperator

pytestmark = pytest.mark.spark
SCHEMA = "subtask int, value string"


class SideEffects(OperatorCoordinator):
    """Keeps the events it received; writes them as a side effect at every completion."""

    def __init__(self, context: Any, root: str) -> None:
        super().__init__(context)
        self.root = root
        self.seen: list[str] = []
        self.kicked = False

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.seen, self.kicked = (list(state[0]), state[1]) if state else ([], False)

    def execution_attempt_ready(self, subtask: int, attempt: int, gateway: SubtaskGateway) -> None:
        super().execution_attempt_ready(subtask, attempt, gateway)
        if subtask == 0 and not self.kicked:
            gateway.send_event("go")
            self.kicked = True

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        if event == "boom" and os.path.exists(os.path.join(self.root, "armed")):
            raise ValueError("cannot handle 'boom' (armed)")
        self.seen.append(event)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result((list(self.seen), self.kicked))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        side = os.path.join(self.root, "side")
        os.makedirs(side, exist_ok=True)
        with open(os.path.join(side, f"{checkpoint_id}.json.tmp"), "w") as f:
            json.dump(self.seen, f)
        os.replace(os.path.join(side, f"{checkpoint_id}.json.tmp"),
                   os.path.join(side, f"{checkpoint_id}.json"))


class Answers(SubtaskOperator):
    def handle_operator_event(self, event: Any) -> Any:
        for reply in ("a", "boom", "c"):
            self.context.send_event(reply)
        return [(self.context.subtask, event)]


def side_files(root: Path) -> dict[str, list[str]]:
    side = root / "side"
    if not side.exists():
        return {}
    return {p.name: json.loads(p.read_text()) for p in sorted(side.glob("*.json"))}


def job_of(spark: Any, root: Path) -> tuple[CoordinatedJob, Any]:
    job = CoordinatedJob(spark, str(root / "ckpt"))
    df = job.source(Answers, functools.partial(SideEffects, root=str(root)), 2, SCHEMA,
                    name="side")
    return job, df.writeStream.format("noop").trigger(processingTime="0 seconds")


def assert_readable(gave_up: JobGaveUp) -> None:
    text = str(gave_up)
    first = text.splitlines()[0]
    assert first.startswith("coordinator 'side' raised in handle_event_from_operator(): "
                            "ValueError(\"cannot handle 'boom' (armed)\")"), first
    assert "Traceback (most recent call last)" in text
    assert 'raise ValueError("cannot handle \'boom\' (armed)")' in text  # the user's own line
    assert "restart strategy gave up" in text


def test_a_coordinator_that_raises_while_its_log_is_replayed_commits_no_side_effect(
        spark, tmp_path: Path) -> None:
    job, writer = job_of(spark, tmp_path)
    job.run(writer, until=lambda: "0.json" in side_files(tmp_path), timeout_s=240)
    assert side_files(tmp_path) == {"0.json": ["a", "boom", "c"]}

    (tmp_path / "armed").touch()
    job2, writer2 = job_of(spark, tmp_path)
    with pytest.raises(JobGaveUp) as caught:
        job2.run(writer2, restart=NoRestart(), until=lambda: False, timeout_s=240)
    assert_readable(caught.value)
    # the restore replayed a and boom; the failed instance got neither c nor complete(0)
    assert side_files(tmp_path) == {"0.json": ["a", "boom", "c"]}


def test_a_coordinator_that_raises_on_a_live_event_commits_no_side_effect(
        spark, tmp_path: Path) -> None:
    (tmp_path / "armed").touch()
    job, writer = job_of(spark, tmp_path)
    with pytest.raises(JobGaveUp) as caught:
        job.run(writer, restart=NoRestart(), until=lambda: False, timeout_s=240)
    assert_readable(caught.value)
    assert side_files(tmp_path) == {}
