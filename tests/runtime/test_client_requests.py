"""Client requests (the user's driver program asks a coordinator of the running job): logged
in the current epoch's log, answered once, their effect kept across a reset and restores.

Deterministic: the coordinator harness (a real service, manual mailboxes and clock, storage in
memory). docs/protocol.md [client-requests-take-effect-once].
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator, RequestFailed, RequestRefused
from sparkcoord.core.entries import ClientRequestEntry, ClientResponseEntry, DriverClient
from sparkcoord.core.errors import RunUnavailable
from sparkcoord.core.restore import RestorePoint
from sparkcoord.testing import CoordinatorHarness


class Tally(OperatorCoordinator):
    """A client adds amounts; subtasks report amounts; the total is the state."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.total = state or 0
        self.added: list[Any] = []

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.total += event

    def handle_client_request(self, request: Any) -> Any:
        if request == "total":
            return self.total
        if request == "later":
            fut: Future[Any] = Future()
            self.parked = fut
            return fut
        self.added.append(request)
        self.total += request
        return self.total

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(self.total)


def running(url: str | None = None) -> CoordinatorHarness:
    h = CoordinatorHarness(Tally, 2, storage_url=url)
    h.start()
    h.checkpoint()
    return h


def test_a_client_request_is_logged_then_answered_and_a_resend_is_answered_from_the_log() -> None:
    h = running()
    assert h.ask_as_client(5).result() == 5
    assert h.ask_as_client(5, seq=0).result() == 5  # the same (client, seq): not applied again
    assert h.coordinator.total == 5
    log = h.storage.read_uncommitted_inbound_log(h.epoch)
    assert [type(e) for e in log] == [ClientRequestEntry, ClientResponseEntry]


def test_a_client_request_before_anything_was_sealed_is_refused_with_a_reason_to_retry() -> None:
    # RunUnavailable: the server sends it as the status UNAVAILABLE, which the client re-sends
    # by (spark/job.py: no message text is matched)
    h = CoordinatorHarness(Tally, 1)
    h.start()
    with pytest.raises(RunUnavailable, match="ask again"):
        h.ask_as_client(1).result()


def test_a_client_request_before_the_service_was_restored_is_to_be_asked_again() -> None:
    h = CoordinatorHarness(Tally, 1)
    with pytest.raises(RunUnavailable, match="not been restored"):
        h.ask_as_client(1).result()


def test_a_client_request_to_an_unknown_operator_is_refused_for_good() -> None:
    h = running()
    seq = 99
    answer = h.service.inbox.request_received(DriverClient("nobody", "client"), seq,
                                              h.service.codec.encode(1))
    with pytest.raises(RequestFailed, match="unknown operator 'nobody'") as refused:
        answer.result()
    assert not isinstance(refused.value, RunUnavailable)


def test_a_client_request_after_the_run_closed_is_to_be_asked_of_the_next_run() -> None:
    h = running()
    h.service.close()
    h.run()
    with pytest.raises(RunUnavailable, match="is closed"):
        h.ask_as_client(1).result()


def test_the_default_coordinator_refuses_client_requests() -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1)
    h.start()
    h.checkpoint()
    with pytest.raises(RequestRefused, match="implement handle_client_request"):
        h.ask_as_client("status").result()


def test_a_client_request_survives_the_reset_of_a_task_retry() -> None:
    h = running()
    h.send_from_subtask(0, 1)
    assert h.ask_as_client(10).result() == 11
    h.send_from_subtask(1, 100)
    old = h.coordinator
    assert not h.retry_task(0).adopted  # events only: the coordinator is reset
    assert h.coordinator is not old
    assert h.coordinator.total == 110  # subtask 1's event and the client's amount, replayed


def test_a_client_request_after_the_batch_committed_survives_a_restore() -> None:
    h = running()
    h.send_from_subtask(0, 1)
    epoch = h.epoch
    h.commit()
    assert h.ask_as_client(10).result() == 11  # between batches: appended after the seal
    h.service.close()
    again = CoordinatorHarness(Tally, 2, storage_url=h.storage_url)
    again.start(RestorePoint(epoch, committed=True))
    assert again.coordinator.total == 11
    assert again.coordinator.added == [10]
    # and the log with its seal still verifies (the client's frames follow the sealed prefix)
    assert isinstance(again.storage.read_inbound_log(epoch)[-1], ClientResponseEntry)


@pytest.mark.parametrize("where", ["local", "object store"])
def test_a_torn_client_frame_after_the_seal_is_cut_off_at_the_restore(tmp_path, where) -> None:
    import fsspec

    url = str(tmp_path / "ckpt") if where == "local" else None
    h = running(url)
    epoch = h.epoch
    h.commit()
    h.ask_as_client(3).result()
    h.service.close()
    if where == "local":
        path = tmp_path / "ckpt" / "inbound" / f"{epoch}.log"
        path.write_bytes(path.read_bytes()[:-3])  # the answer's frame cut short by a crash
    else:
        fs = fsspec.filesystem("memory")
        seg_dir = h.storage_url[len("memory://"):] + f"/inbound/{epoch}"
        last = sorted(p for p in fs.ls(seg_dir, detail=False) if p.endswith(".seg"))[-1]
        fs.pipe_file(last, fs.cat_file(last)[:-3])
    again = CoordinatorHarness(Tally, 2, storage_url=h.storage_url)
    again.start(RestorePoint(epoch, committed=True))
    assert again.coordinator.total == 3  # the request survived; its torn answer is made again
    again.ask_as_client(4, client="other").result()  # appended after whole frames only
    again.service.close()
    third = CoordinatorHarness(Tally, 2, storage_url=h.storage_url)
    third.start(RestorePoint(epoch, committed=True))
    assert third.coordinator.total == 7


def test_a_client_request_survives_a_rerun_of_its_uncommitted_batch() -> None:
    h = running()
    h.send_from_subtask(0, 1)
    assert h.ask_as_client(10).result() == 11
    epoch = h.epoch
    h.service.close()  # the driver died mid-batch
    again = CoordinatorHarness(Tally, 2, storage_url=h.storage_url)
    again.start(RestorePoint(epoch, committed=False))
    # the subtask's event is truncated (its task runs again); the client's amount stays
    assert again.coordinator.total == 10
    again.send_from_subtask(0, 1)
    assert again.coordinator.total == 11


def test_a_job_failure_answers_a_waiting_client_with_the_cause() -> None:
    h = running()
    waiting = h.ask_as_client("later")
    h.service.fail_job("the runner broke")
    h.run()
    # the next run takes it (the same number: it takes effect once)
    with pytest.raises(RunUnavailable, match="the runner broke"):
        waiting.result(timeout=1)


def test_a_client_request_re_sent_to_the_next_run_is_answered_from_the_log_not_applied_again() -> None:
    """The driver died after it logged (and answered) the request, but the answer never reached
    the client: ``CoordinatedJob.request`` re-sends it, with the same client id and number, to
    the next run, maybe after that run already started a new epoch."""
    h = running()
    h.send_from_subtask(0, 1)
    epoch = h.epoch
    h.commit()
    assert h.ask_as_client(10, client="driver-program").result() == 11
    h.service.close()
    again = CoordinatorHarness(Tally, 2, storage_url=h.storage_url)
    again.start(RestorePoint(epoch, committed=True))
    assert again.coordinator.total == 11
    again.checkpoint()  # the new run seals its next epoch before the re-send arrives
    assert again.ask_as_client(10, client="driver-program", seq=0).result() == 11
    assert again.coordinator.total == 11  # not applied a second time
    assert again.ask_as_client(10, client="driver-program", seq=1).result() == 21  # a new one
