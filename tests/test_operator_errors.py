"""A subtask operator's own exception is reported as Spark will show it: the user's exception,
type and frames, with a note naming operator, subtask, epoch and callback (issue 14 item 8);
sparkcoord's own errors raised inside user code pass through as they are. No Spark: the
formatting is PySpark's worker's own (``handle_worker_exception``, with the simplified
traceback Spark turns on by default), applied to what run_subtask lets out of a task."""

from __future__ import annotations

import io
import struct

import pytest

from sparkcoord.core.errors import RequestRefused
from sparkcoord.core.ids import SubtaskId
from sparkcoord.spark.subtask import user_code

SID = SubtaskId("orders", 1)


def users_open() -> None:
    raise ValueError("no such table: orders")


def users_rows():
    yield (1,)
    raise KeyError("customer")


def as_spark_shows_it(exc: BaseException, monkeypatch) -> str:
    """The text a Python worker sends the JVM for ``exc`` (call inside its except block)."""
    from pyspark.util import handle_worker_exception

    monkeypatch.setenv("SPARK_SIMPLIFIED_TRACEBACK", "1")
    # In Spark, PySpark's worker calls into the task, and the simplified traceback leaves its
    # frames out; here the test is the caller: leave out its frames the same way
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name.startswith(
            ("test_", "run_real", "task_failure")):
        tb = tb.tb_next
    exc.__traceback__ = tb
    out = io.BytesIO()
    handle_worker_exception(exc, out)
    data = out.getvalue()
    (length,) = struct.unpack(">i", data[4:8])  # after the "exception thrown" marker
    return data[8:8 + length].decode()


def test_an_exception_in_user_code_keeps_its_frames_and_names_where_it_was_raised(
        monkeypatch) -> None:
    try:
        with user_code(SID, 7, "open()"):
            users_open()
    except ValueError as exc:
        text = as_spark_shows_it(exc, monkeypatch)
    else:
        raise AssertionError("the user's exception did not leave")
    assert 'raise ValueError("no such table: orders")' in text, text  # the user's own line
    assert "ValueError: no such table: orders" in text
    assert text.rstrip().endswith("sparkcoord: orders[1] in epoch 7: raised by the operator's "
                                  "open()"), text
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    assert frames[-1].endswith("in users_open"), text


def test_rows_a_user_generator_yields_are_passed_on_until_it_raises(monkeypatch) -> None:
    got = []

    def run():  # what run_subtask does with the rows a callback returned
        with user_code(SID, 2, "process()"):
            yield from users_rows()
    try:
        for row in run():
            got.append(row)
    except KeyError as exc:
        text = as_spark_shows_it(exc, monkeypatch)
    else:
        raise AssertionError("the user's exception did not leave")
    assert got == [(1,)]
    assert "raise KeyError(\"customer\")" in text, text
    assert "sparkcoord: orders[1] in epoch 2: raised by the operator's process()" in text


def test_sparkcoords_own_errors_raised_inside_user_code_pass_through_unnoted() -> None:
    with pytest.raises(RequestRefused, match="refused") as caught:
        with user_code(SID, 0, "process()"):
            raise RequestRefused("coordinator 'orders' refused request 'x'")
    assert not getattr(caught.value, "__notes__", None)


# --------------------------------------------------------------- the real subtask runtime
class OpensBadly:
    """A subtask operator whose open() raises (the user's own line below)."""

    def open(self, context, state):
        raise ValueError("no such table: orders")

    def close(self):
        pass


class RefusedMidBatch(OpensBadly):
    """A subtask operator that the service refuses while it sends (what the client raises)."""

    def open(self, context, state):
        self.context = context

    def handle_operator_event(self, event):
        return None

    def process(self):
        from sparkcoord.channel.client import ChannelRejected

        yield (1,)
        raise ChannelRejected("orders[0]: the coordination service refused event 3: the job "
                              "failed: coordinator 'orders' called fail_job: gone")


def run_real_subtask(operator, tmp_path) -> list:
    """Rows of ``operator`` run by the real ``run_subtask`` (no Spark, no connection: a first
    attempt registers lazily, and these operators send nothing and fail before their end,
    where a task says it finished)."""
    from sparkcoord.spark.spec import CoordinatedPartition, OperatorSpec, SourceSpec
    from sparkcoord.spark.subtask import run_subtask

    spec = SourceSpec("orders", str(tmp_path / "coordination"),
                      [OperatorSpec("orders", object, operator, 1)], "v int")
    partition = CoordinatedPartition("orders", 0, 3, [], ("127.0.0.1", 9), b"s" * 32, "run")
    return list(run_subtask(spec, partition))


def task_failure_text(operator, tmp_path, monkeypatch) -> str:
    """Spark's text for the exception ``operator`` fails its task with (real runtime)."""
    try:
        run_real_subtask(operator, tmp_path)
    except Exception as exc:  # noqa: BLE001 - whatever leaves the task
        return as_spark_shows_it(exc, monkeypatch)
    raise AssertionError("nothing left the task")


def test_the_subtask_runtime_lets_a_users_exception_out_starting_at_the_users_frame(
        monkeypatch, tmp_path) -> None:
    text = task_failure_text(OpensBadly, tmp_path, monkeypatch)
    assert "ValueError: no such table: orders" in text, text
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    # no frame of the runtime (its outer generator included) before the user's
    assert frames and frames[0].endswith("in open") and __file__ in frames[0], text
    assert "sparkcoord/spark/subtask.py" not in text, text
    assert "sparkcoord: orders[0] in epoch 3: raised by the operator's open()" in text


def test_a_refusal_leaves_the_task_with_its_reason_and_the_entry_frame_only(monkeypatch, tmp_path) -> None:
    text = task_failure_text(RefusedMidBatch, tmp_path, monkeypatch)
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    # the task's entry point only: neither the runtime's frames nor the operator's (with no
    # frame outside PySpark, its simplified traceback would print all of PySpark's)
    assert len(frames) == 1 and frames[0].endswith("in run_subtask"), text
    assert "process" not in text, text
    assert text.strip().splitlines()[-1] == (
        "sparkcoord.channel.client.ChannelRejected: orders[0]: the coordination service "
        "refused event 3: the job failed: coordinator 'orders' called fail_job: gone"), text
