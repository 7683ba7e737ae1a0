"""The driver killed with SIGKILL at chosen points of the protocol, then restarted on the same
checkpoint location: the sink and the coordinator's state end exactly-once.

Each case runs the job twice as its own process group (~30 s each): once until the kill, once
to completion. The default suite runs one kill point of each part of the protocol: a later
batch's events (``mid-batch`` 1), the sink's commit (``sink-committed``), a sealed epoch
(``sealed``, in tests/spark/test_remote_checkpoint.py, its records on S3), a logged answer of
the work queue (``answered``, in tests/spark/test_until_recipe.py, the same queue job with the
documented ``until`` recipe) and a client request (``client-added``) and a file source's
answer (``answered`` 2) here. The other kill points are marked ``slow`` (about 3 minutes):
``.venv/bin/python -m pytest -q -m slow``; scripts/soak.py's ``driver-kill`` runs every point
with many seeds.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import subprocess
import sys

import pytest

from sparkcoord.examples.sinks import read_batch_files
from sparkcoord.runtime.storage import CheckpointStorage

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]
REPO = pathlib.Path(__file__).resolve().parents[2]
N = 20


def run_job(workdir: pathlib.Path, kill: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    return subprocess.run([sys.executable, "-m", "tests.spark.kill_job", str(workdir), str(N)],
                          cwd=REPO, env=env, start_new_session=True, timeout=400,
                          capture_output=True, text=True)


@pytest.mark.parametrize("point,min_epoch", [
    # inside the first batch: initialOffset() comes before partitions()
    pytest.param("mid-batch", 0, marks=pytest.mark.slow),
    # every coordinator completed, record not yet written
    pytest.param("sealing", 1, marks=pytest.mark.slow),
    # record durable, Spark's offset log not yet written (default suite: on S3, in
    # test_remote_checkpoint.py)
    pytest.param("sealed", 1, marks=pytest.mark.slow),
    ("mid-batch", 1),        # a later batch: a task sent its events, the batch did not finish
    ("sink-committed", 1),   # the sink committed, Spark's commit log not written (batch id)
])
def test_a_killed_driver_restarts_exactly_once(tmp_path, point: str, min_epoch: int) -> None:
    markers = tmp_path / "markers"
    first = run_job(tmp_path, f"{point}:{min_epoch}:{markers}")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (markers / f"killed-{point}").exists()
    second = run_job(tmp_path, None)
    assert second.returncode == 0, second.stderr[-3000:]
    batches = read_batch_files(str(tmp_path / "sink"))
    for s in (0, 1):
        rows = sorted((r for b in batches.values() for r in b if r["subtask"] == s),
                      key=lambda r: r["position"])
        assert [r["value"] for r in rows] == list(range(N)), f"subtask {s}: {rows}"
        assert [r["position"] for r in rows] == list(range(N))
    # the coordinator's surviving state took effect of the reports exactly once, in order
    storage = CheckpointStorage(str(tmp_path / "ckpt" / "coordination" / "numbers"))
    epochs = [int(p.rsplit("/", 1)[1][:-5]) for p in storage.fs.ls(f"{storage.root}/records",
                                                                    detail=False) if p.endswith(".ckpt")]
    snap = pickle.loads(storage.read_record(max(epochs)).snapshots["numbers"])
    for s in (0, 1):
        reports = [v for _, v in snap["reports"][s]]
        assert reports == list(range(len(reports)))


def run_queue_job(workdir: pathlib.Path, kill: str | None, first: int, added: int
                  ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    return subprocess.run([sys.executable, "-m", "tests.spark.queue_kill_job", str(workdir),
                           str(first), str(added)],
                          cwd=REPO, env=env, start_new_session=True, timeout=400,
                          capture_output=True, text=True)


@pytest.mark.parametrize("point", [
    # a task got a logged answer mid-queue: the batch runs again after (default suite: the
    # same queue and kill point in test_until_recipe.py's killed-driver test)
    pytest.param("answered", marks=pytest.mark.slow),
    "client-added",   # the driver program's request was answered: its effect must survive
])
def test_a_killed_driver_loses_and_repeats_no_answer_of_the_work_queue(tmp_path, point: str) -> None:
    first, added = 12, 8
    markers = tmp_path / "markers"
    run1 = run_queue_job(tmp_path, f"{point}:0:{markers}", first, added)
    assert run1.returncode == -signal.SIGKILL, run1.stderr[-3000:]
    assert (markers / f"killed-{point}").exists()
    run2 = run_queue_job(tmp_path, None, first, added)
    assert run2.returncode == 0, run2.stderr[-3000:]
    rows = [r for b in read_batch_files(str(tmp_path / "sink")).values() for r in b]
    items = sorted(r["item"] for r in rows)
    assert items == list(range(first + added)), items  # every item once: none lost or repeated


def run_files_job(workdir: pathlib.Path, kill: str | None, waves: int
                  ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    run = subprocess.run([sys.executable, "-m", "tests.spark.files_kill_job", str(workdir),
                          str(waves)], cwd=REPO, env=env, start_new_session=True, timeout=400,
                         capture_output=True, text=True)
    # kept beside the data: a failed soak seed keeps its work directory for a look
    runs = len(list(workdir.glob("run-*.log")))
    (workdir / f"run-{runs}.log").write_text(
        f"kill plan: {kill}\nexit code: {run.returncode}\n--- stdout\n{run.stdout}\n"
        f"--- stderr\n{run.stderr}")
    return run


def test_a_killed_driver_of_a_file_source_loses_and_repeats_no_row_with_files_arriving_meanwhile(
        tmp_path) -> None:
    from tests.spark.files_kill_job import sink_check, write_wave

    markers = tmp_path / "markers"
    # killed right after a reader got a split in a later batch (a logged answer, mid-batch)
    run1 = run_files_job(tmp_path, f"answered:2:{markers}", waves=3)
    assert run1.returncode == -signal.SIGKILL, run1.stderr[-3000:]
    assert (markers / "killed-answered").exists()
    write_wave(str(tmp_path / "data"), 7)  # a file arriving while the job is down
    run2 = run_files_job(tmp_path, None, waves=3)
    assert run2.returncode == 0, run2.stderr[-3000:]
    check = sink_check(str(tmp_path))
    assert check["lost"] == check["duplicated"] == check["unexpected"] == 0, check
    assert check["expected"] == 4 * 3 * 150 and check["rows"] == check["expected"]
