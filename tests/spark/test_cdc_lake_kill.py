"""PostgreSQL merged by key into a lake table (``LakeSink`` mode ``merge``) with the driver
killed with SIGKILL at a lake kill point, then restarted on the same checkpoint while a writer
goes on: the table read back equals the source table row by row, no data file is left in the
table's location that the table does not reference, and no staged change file of an epoch the
table holds is left (``sparkcoord/sinks/coordinator.py`` rule 7).

Each case runs tests/spark/cdc_lake_kill_job.py twice as its own process group: once until
the kill, then, after bulk statements run while it is down, until it caught up. The default
suite kills a Delta job after a merge landed in the table and before it was reported done
(``lake-committed``: the restore must skip the epoch without its staged files, and still
delete them); the other points on both formats are marked ``slow``; scripts/soak.py's
``merge`` scenario draws format, point, epoch and writers from a seed.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server
from tests.spark import cdc_job, cdc_lake_kill_job

__all__ = ["postgres_server"]  # the session's server fixture

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]
REPO = pathlib.Path(__file__).resolve().parents[2]


def start_job(workdir: pathlib.Path, url: str, kind: str, kill: str | None,
              run: int) -> subprocess.Popen[bytes]:
    """The job as a process group of its own; its output in ``<workdir>/job-<run>.log``."""
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env.update(PYSPARK_PYTHON=sys.executable, CDC_URL=url, PYTHONPATH=str(REPO))
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    with open(workdir / f"job-{run}.log", "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tests.spark.cdc_lake_kill_job",
                                 str(workdir), kind], cwd=REPO, env=env,
                                start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


def ended(process: subprocess.Popen[bytes], workdir: pathlib.Path, run: int,
          timeout_s: float = 420) -> tuple[int, str]:
    """The process's exit code and its output's tail (killed as a group on a timeout)."""
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process.returncode, (workdir / f"job-{run}.log").read_text(errors="replace")[-3000:]


def killed_and_restarted(server: PostgresServer, workdir: pathlib.Path, kind: str, point: str,
                         epoch: int, *, writers: list[int], transactions: int = 300,
                         pause_s: float = 0.05, down: str = "bulk",
                         must_kill: bool = True, extras: Sequence[str] = ()) -> dict[str, Any]:
    """Run the job until the kill at ``point``:``epoch`` with cdc_job's writers (seeds
    ``writers``) started once it staged its first file, run :data:`DOWN_MIXES` ``down`` while
    it is down, run it again until it caught up; the judge's verdict, with ``killed``. With
    ``must_kill`` false a first run that ended by itself (the point not reached) is judged
    the same. ``extras`` (cdc_job.add_order_extras: ``toast``, ``edges``) adds columns to
    ``orders`` before the job starts; the writers and the judge take them in."""
    database = server.create_database(f"t_mk_{kind}_{point.replace('-', '_')}_{epoch}")
    url = server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    markers = workdir / "markers"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            cdc_job.create_tables(conn)
            cdc_job.add_order_extras(conn, list(extras))
            started: list[Any] = []
            try:
                first = start_job(workdir, url, kind, f"{point}:{epoch}:{markers}", 1)
                cdc_lake_kill_job.when_running(str(workdir), kind, first)
                # started even if the job died first: they write while it is down, then on
                started = cdc_job.start_writers(url, str(workdir), writers, transactions,
                                                pause_s)
                code, out = ended(first, workdir, 1)
                killed = code == -signal.SIGKILL
                assert killed or (not must_kill and code == 0), (code, out)
                if killed:
                    assert (markers / f"killed-{point}").exists(), out
                cdc_lake_kill_job.run_down_mix(conn, down)
                code, out = ended(start_job(workdir, url, kind, None, 2), workdir, 2)
                assert code == 0, out
            finally:
                for w in started:
                    try:
                        w.wait(300)
                    except subprocess.TimeoutExpired:
                        w.kill()
                        w.wait()
            verdict: dict[str, Any] = cdc_lake_kill_job.judge(str(workdir), kind, conn)
            verdict["killed"] = int(killed)
            return verdict
    finally:
        server.drop_slots(database)


def assert_clean(verdict: dict[str, Any]) -> None:
    assert {k: verdict[k] for k in cdc_lake_kill_job.CLEAN} == dict.fromkeys(
        cdc_lake_kill_job.CLEAN, 0), verdict
    assert verdict["rows"] == verdict["source_rows"] > 2000, verdict


@pytest.mark.parametrize("point,epoch,kind", [
    ("lake-committed", 5, "delta"),     # the merge landed, not reported done nor cleaned
    pytest.param("lake-committed", 5, "iceberg", marks=pytest.mark.slow),
    pytest.param("lake-committing", 5, "delta", marks=pytest.mark.slow),   # before the merge
    pytest.param("lake-committing", 5, "iceberg", marks=pytest.mark.slow),
    pytest.param("lake-cleaning", 5, "delta", marks=pytest.mark.slow),     # half cleaned
    pytest.param("lake-cleaning", 5, "iceberg", marks=pytest.mark.slow),
    pytest.param("lake-written", 5, "delta", marks=pytest.mark.slow),      # staged, unreported
    pytest.param("lake-written", 5, "iceberg", marks=pytest.mark.slow),
    pytest.param("mid-batch", 5, "delta", marks=pytest.mark.slow),
    pytest.param("mid-batch", 5, "iceberg", marks=pytest.mark.slow),
])
def test_a_merge_killed_at_a_lake_point_and_restarted_equals_the_source_and_leaves_no_file(
        postgres_server: PostgresServer, tmp_path: pathlib.Path, point: str, epoch: int,
        kind: str) -> None:
    verdict = killed_and_restarted(postgres_server, tmp_path, kind, point, epoch,
                                   writers=[7], transactions=200)
    assert verdict["killed"] == 1
    assert_clean(verdict)
