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
