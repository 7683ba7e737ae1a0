"""Scenario two-speeds on a real standalone cluster: a master and two workers started from the
pyspark package on loopback, executors in their own JVMs with their own Python workers, the
driver in a process of its own (see docs/spark.md, "Running on a standalone cluster").

Marked ``cluster`` (about 85 s, not in the default suite, which runs the same scenario in local
mode in test_scenarios.py and through Spark Connect in test_connect.py):
``.venv/bin/python -m pytest -q -m cluster``; scripts/soak.py's ``cluster`` runs it with many
seeds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkcoord.spark.cluster import LocalStandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalStandaloneCluster(workers=2, cores_per_worker=1, memory_per_worker="1536m",
                                work_dir=str(tmp_path_factory.mktemp("cluster"))) as started:
        yield started


def test_the_cluster_comes_up_with_every_worker_alive(cluster) -> None:
    status = cluster.status()
    assert status["status"] == "ALIVE"
    assert [w["state"] for w in status["workers"]] == ["ALIVE", "ALIVE"]


def test_two_speeds_with_fail_job_and_task_retries_is_exactly_once_on_a_standalone_cluster(
        cluster, tmp_path) -> None:
    seed = 11
    proc = subprocess.run([sys.executable, "-m", "tests.spark.cluster_job", cluster.master_url,
                           str(tmp_path), str(seed)], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUTCOME ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    outcome = json.loads(lines[-1][len("OUTCOME "):])
    print(f"seed {seed}: {outcome}")
    assert outcome["executors"] == 2, outcome  # both workers ran an executor of the job
    assert outcome["restarts"] == 2, outcome
    assert outcome["passed"], outcome
    assert outcome["lost"] == outcome["duplicated"] == outcome["out_of_order"] == 0
