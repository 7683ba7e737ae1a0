"""The main job (README's `sparkcoord demo`), smaller: its verdict is exactly-once."""

import io

import pytest
from rich.console import Console

from sparkcoord.demo import run_demo

pytestmark = pytest.mark.spark


def test_the_demo_survives_its_injected_failures_and_reports_exactly_once(tmp_path, spark) -> None:
    out = io.StringIO()
    assert run_demo(str(tmp_path / "demo"), fast_total=40, slow_total=4,
                    console=Console(file=out, width=120), spark=spark)
    text = out.getvalue()
    assert "VERDICT: exactly-once" in text
    assert "fail_job-fast" in text and "fail_task-fast-0" in text
    assert "query restarts: 1" in text



@pytest.mark.own_processes
def test_the_demo_command_keeps_its_console_clean_and_sparks_log_in_a_file(tmp_path) -> None:
    """``sparkcoord demo`` as a user runs it (its own Spark, in a process of its own): its
    console has the demo's report and sparkcoord's own lines, no Spark stack traces; Spark's
    log, at Spark's console level, is in ``<dir>/spark.log``, which the demo names: the
    injected task failures are all there (issue 14 item 5: clean without hiding errors)."""
    import os
    import re
    import subprocess
    import sys

    workdir = tmp_path / "demo"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-m", "sparkcoord.cli", "demo", "--dir", str(workdir),
                           "--fast", "40", "--slow", "4"], cwd=tmp_path, env=env, timeout=400,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    console = done.stdout + done.stderr
    assert "VERDICT: exactly-once" in done.stdout
    assert f"Spark's own log: {workdir / 'spark.log'}" in " ".join(done.stdout.split())
    assert "Traceback" not in console and "\tat org.apache" not in console, console[-3000:]
    assert not re.search(r"\d\d:\d\d:\d\d (WARN|ERROR) [A-Z]", console), console[-3000:]
    assert "global failure: coordinator 'fast' called fail_job" in done.stderr  # ours stays
    log = (workdir / "spark.log").read_text()
    # the injected task failure of fast[0] and fast[1]: Spark's full report, in the file
    assert "RuntimeError: injected task failure" in log and "Lost task" in log, log[-3000:]
