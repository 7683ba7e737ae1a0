"""Coordinated jobs through Spark Connect: a real Connect server started from the pyspark
package (local[2,4], loopback), a driver program that reaches it only through
``SparkSession.builder.remote``: a fail_job restart and task retries end exactly-once, the file
source's readers pull splits with requests while the program asks its coordinator, and
relative paths (checkpoint, Spark checkpoint, file source) are refused with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.connect_server import ConnectServer
from tests.spark.test_driver_kill import REPO

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]


def test_a_job_through_spark_connect_survives_fail_job_and_task_retries_exactly_once(
        tmp_path) -> None:
    server_dir = tmp_path / "server-cwd"
    server_dir.mkdir()
    server = ConnectServer(str(server_dir))
    try:
        env = {k: v for k, v in os.environ.items()
               if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
        env["PYSPARK_PYTHON"] = sys.executable
        client = subprocess.run(
            [sys.executable, "-m", "tests.spark.connect_job", server.url, str(tmp_path), "11"],
            cwd=REPO, env=env, timeout=600, capture_output=True, text=True)
        assert client.returncode == 0, (client.stderr[-4000:], server.log_tail())
    finally:
        server.stop()
    result = json.loads(client.stdout.strip().splitlines()[-1])
    print(result)
    assert result["connect"].startswith("pyspark.sql.connect"), result  # no JVM on this side

    two_speeds = result["two_speeds"]
    assert two_speeds["restarts"] == 2, two_speeds  # one fail_job per coordinator
    assert (two_speeds["lost"], two_speeds["duplicated"], two_speeds["out_of_order"],
            two_speeds["detail"]) == (0, 0, 0, []), two_speeds  # detail: both task retries ran

    files = result["files"]
    assert (files["lost"], files["duplicated"], files["failures"]) == (0, 0, []), files
    assert files["finished"] >= 5 and {"done", "pending"} <= set(files["status_keys"]), files

    for what in ("checkpoint_dir", "spark_checkpoint", "file source path"):
        reason = result["refusals"][what]
        assert reason.startswith(f"{what} 'relative/"), result["refusals"]
        assert "Spark Connect session" in reason and "absolute path" in reason
