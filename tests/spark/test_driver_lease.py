"""Two driver programs on one checkpoint location (issue 43 finding 9; docs/protocol.md
[one-driver-per-checkpoint]): the second is refused at start, naming the holder, before it
writes anything; the first, then killed with SIGKILL, is restarted on the same checkpoint at
once (its lease is taken over: its process is gone) and the sink ends exactly-once.

Each driver program is tests/spark/kill_job.py in a session of its own (~30 s each)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from sparkcoord.examples.sinks import read_batch_files
from sparkcoord.runtime.kills import kill_session
from sparkcoord.runtime.storage import CheckpointStorage

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]
REPO = pathlib.Path(__file__).resolve().parents[2]
N = 20


def job_command(workdir: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "tests.spark.kill_job", str(workdir), str(N)]


def job_env(hold: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARKCOORD_TEST_HOLD"] = str(hold)
    return env


def wait_until(condition: Callable[[], bool], driver: subprocess.Popen[bytes], what: str) -> None:
    """Wait for an observable state of the running driver program (it must not end first)."""
    deadline = time.monotonic() + 180
    while not condition():
        assert driver.poll() is None, f"the first driver program ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 180 s"
        time.sleep(0.2)


def test_a_second_driver_on_one_checkpoint_is_refused_naming_the_holder_and_a_killed_ones_restart_runs(
        tmp_path) -> None:
    hold = tmp_path / "hold"
    coordination = tmp_path / "ckpt" / "coordination" / "numbers"
    commits = tmp_path / "ckpt" / "spark" / "commits"
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(job_command(tmp_path), cwd=REPO, env=job_env(hold),
                                 start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: commits.is_dir() and any(n.isdigit() for n in os.listdir(commits)),
                   first, "committed batch")
        assert sorted(os.listdir(coordination / "lease")) == ["0.json"]
        second = subprocess.run(job_command(tmp_path), cwd=REPO, env=job_env(hold),
                                start_new_session=True, timeout=300, capture_output=True,
                                text=True)
        assert second.returncode != 0
        assert "sparkcoord.core.lease.LeaseHeld: checkpoint " in second.stderr, second.stderr[-3000:]
        assert f"pid {first.pid} on host" in second.stderr and "held since" in second.stderr
        assert "Stop the other driver program" in second.stderr
        # refused before its query started: none of the symptoms of two runs
        for symptom in ("CONCURRENT_STREAM_LOG_UPDATE", "ChannelRejected", "different bytes"):
            assert symptom not in second.stderr, second.stderr[-3000:]
        assert sorted(os.listdir(coordination / "lease")) == ["0.json"]
        assert first.poll() is None  # the first runs on, undisturbed
    finally:
        kill_session(first.pid)  # SIGKILL, as when its machine dies: it releases nothing
        first.wait()
    hold.touch()
    third = subprocess.run(job_command(tmp_path), cwd=REPO, env=job_env(hold),
                           start_new_session=True, timeout=400, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"its process (pid {first.pid}) is gone" in third.stderr  # taken over at once
    batches = read_batch_files(str(tmp_path / "sink"))
    for s in (0, 1):
        rows = sorted((r for b in batches.values() for r in b if r["subtask"] == s),
                      key=lambda r: r["position"])
        assert [r["value"] for r in rows] == list(range(N)), f"subtask {s}: {rows}"
    # the checkpoint restores: the newest record and its epoch's inbound log read back
    # verified (the log of the epoch before is pruned once the newest batch completed, so a
    # run that ended after that completion has only this one)
    storage = CheckpointStorage(str(coordination))
    newest = max(storage.record_epochs())
    storage.read_record(newest)
    storage.read_inbound_log(newest)
    assert sorted(os.listdir(coordination / "lease")) == ["1.json"]
