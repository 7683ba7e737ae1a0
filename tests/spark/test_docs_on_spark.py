"""The examples of docs/spark.md and docs/sources.md that need Spark run as written (issue 14
item 8), each in a process of its own started in a temporary working directory (the examples
use relative paths; tests/spark/docs_example_job.py runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.spark.helpers import sink_rows
from tests.spark.test_driver_kill import REPO

pytestmark = pytest.mark.spark


def run_examples(cwd, doc: str, blocks: str, *extra: str) -> tuple[dict, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, str(REPO / "tests" / "spark" / "docs_example_job.py"),
                           doc, blocks, *extra], cwd=cwd, env=env, timeout=400,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_the_job_example_of_spark_md_runs_and_ends_exactly_once(spark, tmp_path) -> None:
    summary, printed = run_examples(tmp_path, "spark.md", "0")
    assert summary == {"handle": True, "exception": None, "running": False, "failures": []}
    assert "RunReport(" in printed
    by_subtask: dict[int, list[int]] = {}
    for r in sink_rows(spark, str(tmp_path / "out")):
        by_subtask.setdefault(r.subtask, []).append(r.value)
    # each subtask got its coordinator's numbers once, in order, from 0 on
    assert sorted(by_subtask) == [0, 1], by_subtask
    for values in by_subtask.values():
        assert sorted(values) == list(range(len(values))) and len(values) > 0, values


def test_the_read_files_example_of_sources_md_runs_as_written(tmp_path) -> None:
    (tmp_path / "events").mkdir()
    with open(tmp_path / "events" / "part-0.json", "w") as f:
        f.writelines(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(100))
    # block 0 tails events/ and asks the source for its status; block 1 (storage options)
    # builds another source on the same job
    summary, printed = run_examples(tmp_path, "sources.md", "0,1", "--session")
    assert summary == {"handle": True, "exception": None, "running": False, "failures": []}
    assert "'finished':" in printed and "'pending':" in printed, printed
