"""A subtask operator's own exception is reported with the user's frames first and a last line
naming operator, subtask, epoch and callback (issue 14 item 8); sparkcoord's own errors raised
inside user code pass through as they are. No Spark: the wrapper is what run_subtask and the
downstream operator put around every call into user code."""

from __future__ import annotations

import traceback

import pytest

from sparkcoord.core.errors import OperatorCodeFailed, RequestRefused
from sparkcoord.core.ids import SubtaskId
from sparkcoord.spark.subtask import user_code, user_rows

SID = SubtaskId("orders", 1)


def users_open() -> None:
    raise ValueError("no such table: orders")


def users_rows():
    yield (1,)
    raise KeyError("customer")


def test_an_exception_in_user_code_names_the_callback_and_shows_the_users_frame_first() -> None:
    with pytest.raises(OperatorCodeFailed) as caught:
        with user_code(SID, 7, "open()"):
            users_open()
    assert str(caught.value) == ("orders[1] in epoch 7: the operator's open() raised "
                                 "ValueError: no such table: orders")
    assert isinstance(caught.value.__cause__, ValueError)
    text = "".join(traceback.format_exception(caught.value))
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    assert frames[0].endswith("in users_open"), text  # not the runtime's calling frame
    assert text.index('raise ValueError("no such table: orders")') < text.index(
        "OperatorCodeFailed")


def test_rows_a_user_generator_yields_are_passed_on_until_it_raises() -> None:
    got = []
    with pytest.raises(OperatorCodeFailed, match=r"orders\[1\] in epoch 2: the operator's "
                       r"process\(\) raised KeyError: 'customer'") as caught:
        for row in user_rows(users_rows(), SID, 2, "process()"):
            got.append(row)
    assert got == [(1,)]
    text = "".join(traceback.format_exception(caught.value))
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    assert frames[0].endswith("in users_rows"), text


def test_sparkcoords_own_errors_raised_inside_user_code_pass_through_unwrapped() -> None:
    with pytest.raises(RequestRefused, match="refused"):
        with user_code(SID, 0, "process()"):
            raise RequestRefused("coordinator 'orders' refused request 'x'")
    assert list(user_rows(None, SID, 0, "process()")) == []
