"""The coordination directory on a real S3 server (moto's standalone server on loopback,
started here), Spark's own checkpoint on local disk: a job killed with SIGKILL after sealing
an epoch restarts from the records on S3 and ends exactly-once."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from sparkcoord.examples.sinks import read_batch_files
from tests.s3_server import S3Server
from tests.spark.test_driver_kill import REPO, N

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]


def run_job(workdir: pathlib.Path, kill: str | None, checkpoint: dict
            ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARKCOORD_TEST_CHECKPOINT"] = json.dumps(checkpoint)
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    return subprocess.run([sys.executable, "-m", "tests.spark.kill_job", str(workdir), str(N)],
                          cwd=REPO, env=env, start_new_session=True, timeout=400,
                          capture_output=True, text=True)


def test_a_killed_driver_restarts_exactly_once_from_a_coordination_directory_on_s3(
        tmp_path) -> None:
    server = S3Server()
    try:
        server.create_bucket("checkpoints")
        checkpoint = {"url": "s3://checkpoints/job1", "storage_options": server.storage_options}
        markers = tmp_path / "markers"
        first = run_job(tmp_path, f"sealed:1:{markers}", checkpoint)
        assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
        assert (markers / "killed-sealed").exists()
        second = run_job(tmp_path, None, checkpoint)
        assert second.returncode == 0, second.stderr[-3000:]
        records = server.filesystem().ls("checkpoints/job1/coordination/numbers/records")
        assert any(r.endswith(".ckpt") for r in records), records
        assert not os.path.exists(tmp_path / "ckpt")  # nothing of the coordination went local
    finally:
        server.stop()
    batches = read_batch_files(str(tmp_path / "sink"))
    for s in (0, 1):
        rows = sorted((r for b in batches.values() for r in b if r["subtask"] == s),
                      key=lambda r: r["position"])
        assert [r["value"] for r in rows] == list(range(N)), f"subtask {s}: {rows}"
