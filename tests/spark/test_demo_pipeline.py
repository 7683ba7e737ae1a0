"""``sparkcoord demo pipeline`` (sparkcoord/demo_pipeline.py) as a user runs it, small: a
PostgreSQL of its own, a writer, the CDC source merged into a Delta table, the driver SIGKILLed
while the writer writes and restarted on the same checkpoint, and a PASS verdict comparing the
two tables row by row; the password it was given never in its checkpoint, table or logs."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]


def test_the_pipeline_demo_kills_its_driver_restarts_it_and_ends_equal_to_the_source(
        tmp_path: pathlib.Path) -> None:
    from sparkcoord.demo_pipeline import sink_commits

    workdir = tmp_path / "demo"
    password = f"demo-pw-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env.update(PYSPARK_PYTHON=sys.executable, PGPASSWORD=password, COLUMNS="160")
    done = subprocess.run([sys.executable, "-m", "sparkcoord.cli", "demo", "pipeline", "--dir",
                           str(workdir), "--rows", "300", "--seconds", "6"],
                          cwd=tmp_path, env=env, timeout=400, capture_output=True, text=True)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    assert "VERDICT: PASS" in out
    verdict = next(line for line in out.splitlines() if line.count("│") == 7)
    source, target, missing, extra, differing, word = (
        cell.strip() for cell in verdict.strip("│ ").split("│"))
    assert (missing, extra, differing, word) == ("0", "0", "0", "PASS") and source == target
    assert int(source.replace(",", "")) > 0
    # the driver was really killed (SIGKILL: exit code -9) and restarted on the same checkpoint
    assert "driver run 1 killed with SIGKILL" in out and "exit code -9" in out, out[-3000:]
    assert "driver run 2: restarted on the same checkpoint" in out
    assert "run 1 killed with SIGKILL: yes" in out
    assert (workdir / "driver-1.log").exists() and (workdir / "driver-2.log").exists()
    assert "caught up" in (workdir / "driver-2.log").read_text()
    # the table's history: commits from the killed driver's run and from the restarted one's
    assert len(sink_commits(str(workdir / "items"))) >= 2
    # PostgreSQL stopped and removed; the password nowhere in what the demo leaves
    assert not (workdir / "postgres").exists()
    assert password not in out + done.stderr
    for path in workdir.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
