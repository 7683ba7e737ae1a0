"""The job runner and the lease (spark/job.py rule 6; docs/protocol.md
[one-driver-per-checkpoint]), without Spark: stand-ins for the session and the query, a real
checkpoint directory, and a real second process holding the lease. A second driver program is
refused at start naming the holder; a run whose lease was taken over ends with ``LeaseLost``
whatever its last failure looked like; a permanent refusal is not restarted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkcoord.core.lease import Identity, LeaseHeld, LeaseLost
from sparkcoord.runtime.lease import CoordinationLease
from sparkcoord.runtime.restart import FixedDelay
from sparkcoord.spark.job import CoordinatedJob, JobGaveUp, JobHandle, permanent_error_in
from sparkcoord.testing import ManualClock
from tests.test_until_handling import FakeSpark, RunningQuery

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys
from sparkcoord.runtime.lease import CoordinationLease
lease = CoordinationLease(sys.argv[1])
lease.acquire()
print(lease.run, flush=True)
sys.stdin.read()
"""


class Session(FakeSpark):
    """FakeSpark that also builds a (stand-in) streaming DataFrame."""

    def __init__(self) -> None:
        super().__init__()
        load = SimpleNamespace(load=lambda: "a streaming DataFrame")
        self.readStream = SimpleNamespace(
            format=lambda fmt: SimpleNamespace(option=lambda key, value: load))


def job_on(root: Path) -> CoordinatedJob:
    job = CoordinatedJob(Session(), str(root))  # type: ignore[arg-type]
    job.source(object, object, 1, "x long", name="numbers")  # type: ignore[arg-type]
    return job


@pytest.fixture
def other_driver(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Another driver program holding the lease of ``<tmp_path>/coordination/numbers``."""
    url = str(tmp_path / "coordination" / "numbers")
    proc = subprocess.Popen([sys.executable, "-c", HOLD, url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    run = proc.stdout.readline().strip()
    try:
        yield proc, run
    finally:
        proc.kill()
        proc.wait()


class Writer:
    """A DataStreamWriter stand-in that counts the queries started."""

    def __init__(self) -> None:
        self.started: list[RunningQuery] = []

    def option(self, key: str, value: str) -> Any:
        def start() -> RunningQuery:
            self.started.append(RunningQuery())
            return self.started[-1]
        return SimpleNamespace(start=start)


def test_a_second_driver_program_is_refused_at_start_naming_the_holder_before_any_query(
        tmp_path, other_driver) -> None:
    proc, run = other_driver
    writer = Writer()
    job = CoordinatedJob(Session(), str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(LeaseHeld) as at_source:  # building the DataFrame is refused already
        job.source(object, object, 1, "x long", name="numbers")  # type: ignore[arg-type]
    job._specs.clear()
    job._names.clear()
    # and start() too, for a DataFrame made before the other program took the lease
    proc.kill()
    proc.wait()
    job.source(object, object, 1, "x long", name="numbers")  # type: ignore[arg-type]
    again = subprocess.Popen([sys.executable, "-c", HOLD, job.coordination_url("numbers")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert again.stdout is not None
        again_run = again.stdout.readline().strip()
        with pytest.raises(LeaseHeld) as at_start:
            job.run(writer)  # type: ignore[arg-type]
    finally:
        again.kill()
        again.wait()
    for refusal, pid, holder_run in ((at_source, proc.pid, run), (at_start, again.pid, again_run)):
        text = str(refusal.value)
        assert f"pid {pid} on host" in text and holder_run in text and "held since" in text
        assert "Stop the other driver program" in text
    assert writer.started == []  # refused before any query started


def test_a_killed_driver_programs_lease_does_not_stop_its_restart(tmp_path, other_driver,
                                                                   caplog) -> None:
    proc, _ = other_driver
    proc.kill()  # SIGKILL: it released nothing
    proc.wait()
    writer = Writer()
    with caplog.at_level("WARNING", logger="sparkcoord.runtime.lease"):
        handle = job_on(tmp_path).start(writer, until=lambda: True, poll_s=0.01)  # type: ignore[arg-type]
    assert handle.await_termination(30)
    assert len(writer.started) == 1
    # the takeover is told once, as the lease is taken (not also as the DataFrame is built)
    takeovers = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert len(takeovers) == 1 and f"its process (pid {proc.pid}) is gone" in takeovers[0]


def test_a_run_whose_lease_was_taken_over_ends_with_lease_lost_not_its_last_failure(tmp_path) -> None:
    job = job_on(tmp_path)
    clock = ManualClock(1_800_000_000.0)
    writer = Writer()

    def cause() -> str:
        # as the run fails (the symptom of two runs), another machine's driver has taken the
        # lease over: this one looked dead for longer than the ttl
        if not taken:
            taken.append(CoordinationLease(
                job.coordination_url("numbers"), ttl_s=30.0, wall=lambda: clock.now() + 10_000,
                me=Identity("driver-b", "boot-2", 9, "1")).acquire())
        return "nondeterministic subtask numbers[0]: different bytes at seq 3"

    taken: list[Any] = []
    job.failure_cause = cause  # type: ignore[method-assign]
    handle = job.start(writer, restart=FixedDelay(attempts=3, delay_s=0.0), poll_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(LeaseLost) as lost:
        handle.await_termination(30)
    assert "taken over by a newer run (generation 1: pid 9 on host driver-b" in str(lost.value)
    assert "nondeterministic subtask" in str(lost.value)  # the symptom, told after the cause
    assert len(writer.started) == 1 and handle.restarts == 0


def test_a_failure_with_a_permanent_sparkcoord_error_is_not_restarted(tmp_path) -> None:
    spark_text = ("[STREAM_FAILED] Query terminated with exception: ...\n"
                  "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                  "sparkcoord.core.lease.LeaseHeld: checkpoint /c: another driver program runs "
                  "this job\n\tat org.apache.spark.Foo")
    assert permanent_error_in(spark_text) == "LeaseHeld"
    assert permanent_error_in(spark_text.replace("lease.LeaseHeld", "errors.CorruptRecord")) is None
    job = CoordinatedJob(Session(), str(tmp_path))  # type: ignore[arg-type]
    job.failure_cause = lambda: spark_text  # type: ignore[method-assign]
    writer = Writer()
    handle = JobHandle(job, writer, FixedDelay(attempts=3, delay_s=0.0), None, 0.01,  # type: ignore[arg-type]
                       None, None)
    with pytest.raises(JobGaveUp, match="LeaseHeld, which a restart cannot change"):
        handle._loop()
    assert handle.restarts == 0 and len(handle.failures) == 1 and len(writer.started) == 1


def test_the_lease_is_released_when_the_job_ends_so_the_next_program_starts_at_once(tmp_path) -> None:
    job = job_on(tmp_path)
    job.run(Writer(), until=lambda: True, poll_s=0.01)  # type: ignore[arg-type]
    # a driver on another machine, inside any ttl: the lease was released, not left to lapse
    taken = CoordinationLease(job.coordination_url("numbers"),
                              me=Identity("driver-b", "boot-2", 9, "1")).acquire()
    assert taken.generation == 1
