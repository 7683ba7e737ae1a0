"""The PostgreSQL source with its driver killed (SIGKILL of the job's whole process group) at a
point of its own life, then restarted on the same checkpoint location while two writer
processes go on: the sink applied by key equals the tables, every transaction's rows once.

The default suite kills at the sink's commit of a batch (Spark's commit log not yet written),
the case decision 68 is about: Spark runs that batch again and the batch-file sink keeps what
the second run wrote, so the second run must emit what the first did. The kills in the
snapshot, at the hand-over and in the stream are marked ``slow``; scripts/soak.py's ``cdc``
scenario runs them with many seeds.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server
from tests.spark import cdc_job

__all__ = ["postgres_server"]  # the session's server fixture

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]
REPO = pathlib.Path(__file__).resolve().parents[2]


def start_cdc_job(workdir: pathlib.Path, url: str, kill: str | None, seed: int,
                  failure: str = "kill") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env.update(PYSPARK_PYTHON=sys.executable, CDC_URL=url, PYTHONPATH=str(REPO))
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    return subprocess.Popen([sys.executable, "-m", "tests.spark.cdc_job", "run", str(workdir),
                             failure, str(seed)], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def ended(process: subprocess.Popen[str], timeout_s: float = 420) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        raise
    return process.returncode, err[-3000:]


def killed_and_restarted(server: PostgresServer, workdir: pathlib.Path, point: str,
                         min_epoch: int, seed: int, failure: str = "kill",
                         crash: bool = False) -> dict[str, Any]:
    """Run the job until the kill (or, without a ``point``, with ``failure`` injected), then
    to the end, with two writers started once its first batch committed; the verdict, with
    the runs' ``reports`` (cdc_job.REPORTS). With ``crash`` PostgreSQL is stopped with
    ``pg_ctl -m immediate`` and started again once the stream carried some transactions
    (:func:`crash_in_the_stream`; ``crashed`` says whether it was)."""
    database = server.create_database(f"t_kill_{seed % 100_000}_{(point or failure).replace('-', '_')}")
    url = server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    markers = workdir / "markers"
    crashed = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        cdc_job.create_tables(conn)
    writers: list[Any] = []
    try:
        first = start_cdc_job(workdir, url, f"{point}:{min_epoch}:{markers}" if point
                              else None, seed, failure)
        if cdc_job.when_running(str(workdir), first):
            writers = cdc_job.start_writers(url, str(workdir), [seed, seed + 1],
                                            transactions=500, pause_s=0.06)
            if crash:
                threading.Thread(target=crash_in_the_stream, args=(server, workdir, crashed),
                                 daemon=True).start()
        code, err = ended(first)
        if point:
            assert code == -signal.SIGKILL, err
            assert (markers / f"killed-{point}").exists()
            code, err = ended(start_cdc_job(workdir, url, None, seed))
        assert code == 0, err
    finally:
        for w in writers:
            w.wait(300)
    # a connection of its own: a crash ended the one that made the tables
    with psycopg.connect(url, autocommit=True) as conn:
        verdict: dict[str, Any] = cdc_job.judge(str(workdir), conn)
        conn.execute("SELECT pg_drop_replication_slot(%s)",
                     ((workdir / "slot").read_text(),))
    verdict["crashed"] = int(crashed.is_set())
    reports = workdir / cdc_job.REPORTS
    verdict["reports"] = ([json.loads(line) for line in reports.read_text().splitlines()]
                          if reports.exists() else [])
    return verdict


def crash_in_the_stream(server: PostgresServer, workdir: pathlib.Path,
                        crashed: threading.Event, timeout_s: float = 180) -> None:
    """Once the sink holds 20 changes past the snapshot's last high watermark, stop PostgreSQL
    with ``pg_ctl -m immediate`` (a crash: the start replays the WAL) and start it again after
    a second; ``crashed`` set then (a thread of the test's process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = cdc_job.sink_rows(str(workdir))
        highs = [r["lsn"] for r in rows if r["op"] == "r"]
        if highs and sum(1 for r in rows if r["op"] != "r" and r["lsn"] > max(highs)) > 20:
            server.restart(down_s=1.0, mode="immediate")
            crashed.set()
            return
        time.sleep(0.3)


@pytest.mark.parametrize("point,min_epoch", [
    ("sink-committed", 4),   # a snapshot batch's rows committed by the sink, commit log not
    pytest.param("sink-committed", 14, marks=pytest.mark.slow),  # a stream batch's
    pytest.param("cdc-snapshot", 3, marks=pytest.mark.slow),    # a reader read chunks
    pytest.param("cdc-handover", 0, marks=pytest.mark.slow),    # the stream was handed out
    pytest.param("cdc-stream", 12, marks=pytest.mark.slow),     # the stream reader read
])
def test_a_cdc_job_killed_and_restarted_ends_equal_to_the_tables_each_change_once(
        postgres_server: PostgresServer, tmp_path: pathlib.Path, point: str,
        min_epoch: int) -> None:
    seed = random.randrange(1 << 30)
    print(f"cdc driver kill seed {seed} at {point}:{min_epoch}")
    verdict = killed_and_restarted(postgres_server, tmp_path, point, min_epoch, seed)
    assert {k: verdict[k] for k in cdc_job.CLEAN} == dict.fromkeys(cdc_job.CLEAN, 0), (
        f"seed {seed}: {verdict}")
    assert verdict["transactions"] > 300 and verdict["snapshot_rows"] >= 3000
