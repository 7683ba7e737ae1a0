"""The coordinated source on real Spark (local[2,4]): both directions, retries, restarts,
channel attacks and bad events."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from sparkcoord.examples.numbers import SCHEMA
from sparkcoord.runtime.restart import NoRestart
from sparkcoord.spark import JobGaveUp, SubtaskOperator
from tests.spark.helpers import (
    checkpointed_reports,
    latest_state,
    numbers_job,
    run_until_rows,
    sink_rows,
    values_by_subtask,
)

pytestmark = pytest.mark.spark
N = 12


def test_every_subtask_gets_exactly_its_numbers_in_order_and_reports_reach_the_coordinator(
        spark, tmp_path) -> None:
    # a checkpoint interval makes the service seal epochs with no events to carry, so a
    # checkpoint after the last reports holds the coordinator's state with all of them
    job, df = numbers_job(spark, str(tmp_path), total=N, checkpoint_interval_s=0.3)
    out = str(tmp_path / "out")

    def reports() -> list[list[int]]:
        return checkpointed_reports(job)

    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    report = job.run(writer, until=lambda: len(sink_rows(spark, out)) >= 2 * N
                     and all(len(r) >= N for r in reports()), timeout_s=240)
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    assert report.failures == []
    for s in (0, 1):
        assert latest_state(job, "numbers", "numbers", s) == list(range(N))
    # subtask -> coordinator: every report taken effect of exactly once, in order
    assert reports() == [list(range(N)), list(range(N))]


def test_a_task_retry_restores_the_subtask_state_and_loses_nothing(spark, tmp_path) -> None:
    job, df = numbers_job(spark, str(tmp_path), total=N, fail_task_at=N // 3)
    out = str(tmp_path / "out")
    report = run_until_rows(spark, job, df, out, 2 * N)
    assert os.path.exists(tmp_path / "markers" / "fail_task-numbers-0"), "no task failed"
    assert report.restarts == 0  # a Spark task retry, not a query restart
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    assert latest_state(job, "numbers", "numbers", 0) == list(range(N))


def test_a_fail_job_restarts_the_query_from_its_checkpoint_exactly_once(spark, tmp_path) -> None:
    job, df = numbers_job(spark, str(tmp_path), total=N, fail_job_at=N // 2)
    out = str(tmp_path / "out")
    failures: list[str] = []
    report = run_until_rows(spark, job, df, out, 2 * N, on_failure=failures.append)
    assert report.restarts == 1 and len(failures) == 1
    assert "coordinator 'numbers' called fail_job" in failures[0]
    assert "injected failure" in failures[0]
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}


def test_a_query_that_fails_inside_a_batch_restarts_into_that_batch_exactly_once(
        spark, tmp_path) -> None:
    # 4 failures of one task exhaust local[2,4]: the query fails inside the batch, whose
    # offsets are logged but not committed; the restart's first call is partitions() of that
    # very batch (docs/protocol.md [restore-point-from-first-driver-call]: restore to it,
    # truncate its inbound log, run it again)
    job, df = numbers_job(spark, str(tmp_path), total=N, fail_task_at=N // 3, fail_times=4)
    out = str(tmp_path / "out")
    failures: list[str] = []
    report = run_until_rows(spark, job, df, out, 2 * N, on_failure=failures.append)
    assert report.restarts == 1 and "injected task failure" in failures[0]
    assert len(os.listdir(tmp_path / "markers")) == 8  # 4 tries of each subtask's task
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    assert latest_state(job, "numbers", "numbers", 0) == list(range(N))


def test_a_stopped_query_resumes_on_the_same_checkpoint_location(spark, tmp_path) -> None:
    job, df = numbers_job(spark, str(tmp_path), total=N // 2)
    out = str(tmp_path / "out")
    run_until_rows(spark, job, df, out, N)
    job2, df2 = numbers_job(spark, str(tmp_path), total=N)   # a new run: more numbers
    run_until_rows(spark, job2, df2, out, 2 * N)
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    assert latest_state(job2, "numbers", "numbers", 1) == list(range(N))


def test_forged_frames_and_a_wrong_secret_are_dropped_while_the_query_keeps_running(
        spark, tmp_path) -> None:
    from sparkcoord.channel.frames import Register, encode
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    job, df = numbers_job(spark, str(tmp_path), total=N)
    out = str(tmp_path / "out")
    info_path = os.path.join(job.coordination_url("numbers"), "channel.json")
    attacks: list[bytes] = []

    def attack() -> None:
        while not os.path.exists(info_path):
            threading.Event().wait(0.2)
        info = json.loads(open(info_path).read())
        forged = encode(Register(TaskAttempt(info["run"], SubtaskId("numbers", 0), 0, 9)), b"x" * 32)
        for junk in (forged, b"\x00" * 100, b"SC\x01\x02\xff\xff\xff\xff" + b"\x00" * 32):
            with socket.create_connection((info["host"], info["port"]), timeout=10) as s:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                attacks.append(s.recv(100))

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    run_until_rows(spark, job, df, out, 2 * N)
    attacker.join(30)
    assert attacks == [b"", b"", b""]  # each connection dropped without an answer
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}


class SendsALock(SubtaskOperator):
    def handle_operator_event(self, event):
        self.context.send_event(threading.Lock())
        return None


def test_an_unpicklable_event_fails_at_send_with_a_clear_error(spark, tmp_path) -> None:
    from sparkcoord.examples.numbers import NumbersCoordinator
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = job.source(SendsALock, NumbersCoordinator, 1, SCHEMA, name="bad")
    writer = df.writeStream.format("noop").trigger(processingTime="0 seconds")
    with pytest.raises(JobGaveUp, match="cannot be pickled"):
        job.run(writer, restart=NoRestart(), until=lambda: False, timeout_s=240)


class OpensBadly(SubtaskOperator):
    def open(self, context, state):
        super().open(context, state)
        raise ValueError("no such table: orders")  # the user's own line


def test_an_exception_in_the_users_open_is_reported_with_the_users_frames_and_where_it_was_raised(
        spark, tmp_path) -> None:
    from sparkcoord.examples.numbers import NumbersCoordinator
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = job.source(OpensBadly, NumbersCoordinator, 1, SCHEMA, name="orders")
    writer = df.writeStream.format("noop").trigger(processingTime="0 seconds")
    with pytest.raises(JobGaveUp) as caught:
        job.run(writer, restart=NoRestart(), until=lambda: False, timeout_s=240)
    text = str(caught.value)
    # Spark's text of the task failure: the user's exception with its own frames (Spark's
    # simplified traceback drops PySpark's frames and any __cause__), and where it came from
    user_line = text.index('raise ValueError("no such table: orders")')
    assert user_line < text.index("ValueError: no such table: orders") < text.index(
        "sparkcoord: orders[0] in epoch 0: raised by the operator's open()"), text
    assert "client.close()" not in text
    # the first frame is the user's: none of the runtime's before it (its task entry included)
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    assert frames and "test_coordinated_source.py" in frames[0], text
