"""What the job runner does when ``until`` asks a job that is failing over or starting (issue 24
item 4; docs/decisions/051-client-request-across-failover.md), without Spark: a stand-in for
the query and the failure report."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sparkcoord.core.errors import RequestRefused, RunUnavailable
from sparkcoord.runtime.restart import NoRestart
from sparkcoord.spark.job import CoordinatedJob, JobHandle


class FakeSpark:
    """What CoordinatedJob reads of a session: ``conf`` and ``dataSource.register``."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(get=lambda key, default=None: default)
        self.dataSource = SimpleNamespace(register=lambda cls: None)


class Query:
    def __init__(self, active: bool = True) -> None:
        self.isActive = active


def handle_of(until: Any, cause: str | None = None, batches_run: bool = True) -> JobHandle:
    job = SimpleNamespace(failure_cause=lambda: cause)
    handle = JobHandle(job, None, NoRestart(), until, 0.1, None, None)  # type: ignore[arg-type]
    handle._last_counted = 5 if batches_run else -1
    return handle


def unavailable() -> bool:
    raise RunUnavailable("no run of the job took it")


def test_until_meeting_a_failed_run_is_not_done_so_the_job_restarts_or_gives_up() -> None:
    assert handle_of(unavailable, cause="coordinator 'q' called fail_job: x")._until_done(
        Query()) is False
    assert handle_of(unavailable)._until_done(Query(active=False)) is False  # the query ended


def test_until_meeting_a_query_that_ran_no_batch_yet_is_not_done() -> None:
    # a new driver program after a killed one, or a restart, before the run sealed an epoch
    assert handle_of(unavailable, batches_run=False)._until_done(Query()) is False


def test_until_meeting_no_run_while_the_query_runs_batches_ends_the_job() -> None:
    with pytest.raises(RunUnavailable):  # a channel this program cannot reach is an error
        handle_of(unavailable)._until_done(Query())


def test_any_other_error_of_until_ends_the_job_also_while_failing_over() -> None:
    def refused() -> bool:
        raise RequestRefused("coordinator 'q' refused request 'stauts': unknown request")

    with pytest.raises(RequestRefused):
        handle_of(refused, cause="coordinator 'q' called fail_job: x")._until_done(Query())


def job_with_source(tmp_path: Any) -> CoordinatedJob:
    job = CoordinatedJob(FakeSpark(), str(tmp_path))
    op = SimpleNamespace(name="q")
    job._specs["src"] = SimpleNamespace(  # type: ignore[assignment]
        name="src", operators=[op], recipients=[], storage_options={},
        checkpoint_url=str(tmp_path / "coordination" / "src"))  # no channel.json: no run
    return job


def test_a_request_from_until_does_not_wait_for_the_restart_its_own_thread_performs(
        tmp_path) -> None:
    job = job_with_source(tmp_path)
    seen: list[BaseException] = []

    def until() -> bool:
        try:
            return bool(job.request("q", "status", timeout_s=60))
        except RunUnavailable as exc:
            seen.append(exc)
            raise

    handle = handle_of(until, cause="coordinator 'q' called fail_job: x")
    assert handle._until_done(Query()) is False
    assert "the job is failing over; ask again after its restart" in str(seen[0]), seen  # not a timeout


def test_a_request_from_another_thread_waits_for_a_run_until_its_timeout(tmp_path) -> None:
    with pytest.raises(RunUnavailable, match=r"no answer within 0.3 s \(no channel.json yet"):
        job_with_source(tmp_path).request("q", "status", timeout_s=0.3)


class RunningQuery:
    """A stand-in for a running StreamingQuery: never ends by itself, counts its stops."""

    id = runId = "q-1"
    name = None
    isActive = True
    recentProgress: list[Any] = []
    lastProgress = None
    status = {"message": "Waiting for data to arrive", "isDataAvailable": False,
              "isTriggerActive": False}

    def __init__(self) -> None:
        self.stops = 0

    def awaitTermination(self, timeout: float) -> bool:
        return not self.isActive

    def stop(self) -> None:
        self.stops += 1
        self.isActive = False


def test_an_error_of_until_stops_the_query_before_it_ends_the_job(tmp_path) -> None:
    # the handle's thread ended with until()'s error and left the Spark query running
    query = RunningQuery()
    writer = SimpleNamespace(option=lambda key, value: SimpleNamespace(start=lambda: query))

    def refused() -> bool:
        raise RequestRefused("coordinator 'q' refused request 'stauts': unknown request")

    job = CoordinatedJob(FakeSpark(), str(tmp_path))
    handle = JobHandle(job, writer, NoRestart(), refused, 0.01, None, None)  # type: ignore[arg-type]
    with pytest.raises(RequestRefused):
        handle._loop()
    assert query.stops == 1 and not query.isActive


def test_a_local_jobs_failure_report_is_read_every_50_ms_whatever_poll_s_is() -> None:
    # rule 5 of job.py (decision 84): a fail_job is acted on within ~50 ms, not a poll_s later;
    # a store's report costs a request, so a remote one is read at poll_s as before
    def waits(poll_s: float, *urls: str, options: Any = None) -> tuple[float, int]:
        specs = {u: SimpleNamespace(checkpoint_url=u, storage_options=options or {})
                 for u in urls}
        job = SimpleNamespace(failure_cause=lambda: None, _specs=specs)
        return JobHandle(job, None, NoRestart(), None, poll_s, None, None)._waits()  # type: ignore[arg-type]

    assert waits(0.5, "/ckpt/coordination/a") == (0.05, 10)
    assert waits(0.1, "file:///ckpt/coordination/a") == (0.05, 2)
    assert waits(0.02, "/ckpt/coordination/a") == (0.02, 1)
    assert waits(0.5, "/ckpt/coordination/a", "s3://b/ckpt/coordination/c") == (0.5, 1)
    assert waits(0.5, "/ckpt/coordination/a", options={"anon": True}) == (0.5, 1)
