"""What a restore and a rerun batch say at INFO (issue 25 item 6): one line per restore that
names the numbers it gives and why, and a rerun batch's task that takes over what the earlier
run's task sent is not called a retry; a retry within a run still is.

Deterministic: the coordinator harness (a real service on manual mailboxes and clock, storage
in memory), the coordinator of tests/runtime/test_requests.py.
"""

from __future__ import annotations

import logging

import pytest

from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.restore import RestorePoint
from sparkcoord.testing import CoordinatorHarness
from tests.runtime.test_requests import IdIssuer

#: the coordination service and its inbox (registrations, retries and reruns are its)
RUNTIME = "sparkcoord.runtime"
SERVICE_LOGGERS = ("sparkcoord.runtime.service", "sparkcoord.runtime.inbox")
#: words of a fault: none may be in what a healthy restart says
FAULT_WORDS = ("retried", "retry", "fail", "error", "abrupt", "killed", "lost")


def running(url: str | None = None) -> CoordinatorHarness:
    """Coordinator ``ids`` (2 subtasks) with the batch of epoch 0 running."""
    h = CoordinatorHarness(IdIssuer, 2, name="ids", storage_url=url)
    h.start()
    h.checkpoint()
    return h


def restarted(url: str) -> CoordinatorHarness:
    """The job's next run on the same checkpoint (not started)."""
    return CoordinatorHarness(IdIssuer, 2, name="ids", storage_url=url)


def info_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in SERVICE_LOGGERS]


def crashed_mid_batch() -> tuple[str, int]:
    """A run whose batch of epoch 0 got an event and three requests (one not answered yet)
    when its driver died: the storage's URL and the epoch (logged, not committed)."""
    h = running()
    h.send_from_subtask(0, "ev")
    assert h.request_from_subtask(0, "a") == 0
    assert h.request_from_subtask(1, "b") == 1
    assert not h.ask_from_subtask(1, "later").done()
    epoch = h.epoch
    h.service.close()
    return h.storage_url, epoch


def test_a_restore_to_an_uncommitted_epoch_says_in_one_line_what_it_keeps_and_why(caplog) -> None:
    url, epoch = crashed_mid_batch()
    rerun = restarted(url)
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        rerun.start(RestorePoint(epoch, committed=False))
    lines = info_lines(caplog)
    # one line (before: "epoch 0 runs again with 9 logged entries of ids kept" and
    # "run ... restored RestorePoint(...): ..., 4 inbound entries handed to the coordinators
    # again", two counts of one epoch, neither saying what they were)
    restored = [line for line in lines if "restored" in line]
    assert len(restored) == 1, lines
    assert f"restored epoch {epoch}, logged but not committed: its batch runs again" in restored[0]
    assert restored[0].endswith(
        "Answers were given out in it, so what was sent to coordinator ids before the "
        "restart is kept (4 items: 3 requests, 1 event): handed to it again, and the batch's "
        "tasks continue from it, answered from the log"), restored[0]
    assert not any("entries" in line for line in lines), lines
    assert not any(word in line.lower() for line in lines for word in FAULT_WORDS), lines
    # what the line counts is what the coordinator was handed again
    assert len(rerun.coordinator.asked) == 3 and rerun.coordinator.events == [(0, "ev")]


def test_a_rerun_batchs_task_continuing_the_earlier_runs_history_is_not_called_a_retry(
        caplog) -> None:
    url, epoch = crashed_mid_batch()
    rerun = restarted(url)
    rerun.start(RestorePoint(epoch, committed=False))
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        # the rerun's first task of subtask 0 (Spark attempt 0 of the new run) re-sends the
        # earlier run's history: it replaces that run's attempt, as a retry would
        assert rerun.send_from_subtask(0, "ev").verdict.name == "DUPLICATE"
        assert rerun.request_from_subtask(0, "a") == 0
    lines = info_lines(caplog)
    assert lines == [f"epoch {epoch} runs again after a restart: task of ids[0] (Spark "
                     f"attempt 0) continues the 2 items its task of the earlier run sent, "
                     f"answered from the log"], lines


def test_a_rerun_batchs_task_that_is_itself_a_retry_is_reported_as_a_retry(caplog) -> None:
    url, epoch = crashed_mid_batch()
    rerun = restarted(url)
    rerun.start(RestorePoint(epoch, committed=False))
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        # Spark attempt 1 of the new run registers first: its attempt 0 failed before it
        # registered (a first attempt registers with its first item)
        retry = TaskAttempt(rerun.service.run_id, SubtaskId("ids", 0), epoch, 1)
        assert rerun.service.inbox.attempt_registered(retry).adopted
    lines = info_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(
        f"task of ids[0] in epoch {epoch} was retried (Spark attempt 1)"), lines


def test_a_task_retry_within_a_run_is_still_reported_as_a_retry(caplog) -> None:
    h = running()
    assert h.request_from_subtask(0, "a") == 0
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        assert h.retry_task(0).adopted
    lines = info_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(
        f"task of ids[0] in epoch {h.epoch} was retried (Spark attempt 1)"), lines


def test_a_restore_of_a_committed_epoch_says_what_it_hands_again(caplog) -> None:
    h = running()
    h.send_from_subtask(0, "ev")
    assert h.request_from_subtask(1, "b") == 0
    epoch = h.epoch
    h.commit()
    h.service.close()
    again = restarted(h.storage_url)
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        again.start(RestorePoint(epoch, committed=True))
    restored = [line for line in info_lines(caplog) if "restored" in line]
    assert len(restored) == 1, restored
    assert restored[0].endswith(
        f"restored epoch {epoch}, whose batch committed: coordinators reset to its snapshot, "
        f"what was sent to coordinator ids in it handed again (2 items: 1 request, 1 "
        f"event), then told it committed"), restored[0]


def test_a_fresh_start_says_so_without_a_restore_point_s_repr(caplog) -> None:
    h = CoordinatorHarness(IdIssuer, 1, name="ids")
    with caplog.at_level(logging.INFO, logger=RUNTIME):
        h.start()
    lines = info_lines(caplog)
    assert len(lines) == 1 and "starts fresh: Spark's log holds no epoch of this source yet" \
        in lines[0], lines
    assert "RestorePoint(" not in lines[0]
