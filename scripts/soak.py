"""Soak: run the exactly-once scenarios with many seeds and print a table.

    python scripts/soak.py --seeds 50                      # every scenario
    python scripts/soak.py --scenario simulation --seeds 2000
    python scripts/soak.py --scenario two-speeds --seeds 10 --first-seed 100

Scenarios:
  simulation   the in-process simulated Spark lifecycle with every fault injected (fast)
  two-speeds   tests/spark/scenarios.py on local Spark (about a minute per seed)
  driver-kill  SIGKILL of the job at each kill point in turn, then a restart (~1 min per seed)
  cluster      two-speeds on a standalone cluster (a master and two workers started from the
               pyspark package on loopback; ~30 s per seed after a ~30 s start)
  files-task, files-fail-job
               the file source (tests/spark/files_kill_job.py) tailing a directory while the
               job writes 2-4 waves of files, with a task failure in the middle of a split or a
               fail_job at a split chosen by the seed (one local session; ~10 s per seed)
  files-kill   the same job killed with SIGKILL at a kill point and epoch chosen by the seed,
               a wave of files written while it is down, then restarted (~35 s per seed)
  cdc          the PostgreSQL source (tests/spark/cdc_job.py) on a PostgreSQL started for the
               scenario, two writer processes going on; by seed a task failure, a fail_job,
               a driver SIGKILL in the snapshot, at the hand-over, in the stream or at a sink
               commit, then a restart, or PostgreSQL crashed (pg_ctl -m immediate) and started
               while the stream runs; a per-seed table gives the stream's lag behind the
               writers at the end of the writes and the catch-up time (about 1-2 minutes
               per seed)
  sink         the lake sink: a file stream into Delta or Iceberg killed with SIGKILL at a
               lake kill point (a task's files not reported, before or after the table commit,
               mid-cleanup) or mid-batch, maybe with a sink task failure, then run to the end;
               judged against the files' ids and for orphan files; by seed also a second
               driver on the same checkpoint (refused: LeaseHeld) or a job on a fresh
               checkpoint with the same jobId (refused: CheckpointBehindTable, nothing
               written) (about 1-1.5 minutes per seed)
  merge        the lake sink in mode merge: PostgreSQL's change stream of a table merged by
               key into Delta or Iceberg (tests/spark/cdc_lake_kill_job.py) on a PostgreSQL
               started for the scenario, cdc_job's writers going on; killed with SIGKILL at a
               lake kill point or mid-batch at an epoch chosen by the seed, bulk statements
               run while it is down (updates, deletes, key changes or a truncate, by seed),
               restarted; by seed the table also has a large TOASTed column most updates
               leave alone and a timestamptz at both ends of the range; judged row by row
               against the source table, for orphan files and for staged files of committed
               epochs left (about 1-2 minutes per seed)
  aligned      watermark alignment: two directories at 1x and 20x in an aligned availableNow
               run into a windowed count, P readers, bounded or continuous, a task failure
               or a fail_job chosen by the seed (one local session; ~20 s per seed)

Columns: runs, passes, lost, duplicated and out-of-order events, and the failing seeds.
Run from the repository root with the project's interpreter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def _count_numbers(sim: Any, row: dict[str, Any]) -> None:
    """Lost, duplicated and out-of-order numbered events in the subtasks' surviving state."""
    import pickle

    from sparkcoord.core.ids import SubtaskId

    last = max(sim.world.commits)
    epoch = sim.world.offsets[last][1]
    for spec in sim.specs:
        for s in range(spec.parallelism):
            found = sim.storage.read_subtask_state(SubtaskId(spec.name, s), epoch + 1)
            numbers = [e[2] for e in (pickle.loads(found[1]) if found else []) if e[0] == "x"]
            row["lost"] += len(set(range(sim.numbers_per_subtask)) - set(numbers))
            row["duplicated"] += len(numbers) - len(set(numbers))
            row["out of order"] += int(numbers != sorted(numbers))


def _count_answers(sim: Any, row: dict[str, Any]) -> None:
    """Answers to requests: consumed by surviving tasks, ids handed out and never consumed
    nor given back by a withdrawal (lost), ids consumed twice (duplicated). Diverging answers (a retry or a replayed batch
    that saw another answer than an earlier attempt) fail the run where they happen."""
    import pickle

    from sparkcoord.core.ids import SubtaskId

    if "ask" not in {spec.name for spec in sim.specs}:
        return
    last = max(sim.world.commits)
    epoch = sim.world.offsets[last][1]
    snap = pickle.loads(sim.storage.read_record(epoch).snapshots["ask"])
    consumed = []
    for s in range(sim.parallelism):
        found = sim.storage.read_subtask_state(SubtaskId("ask", s), epoch + 1)
        consumed += [e[2] for e in (pickle.loads(found[1]) if found else []) if e[0] == "ans"]
    row["answers"] += len(consumed)
    # ids a withdrawal gave back wait in the coordinator's pool to be handed out again
    returned = set(snap.get("returned", []))
    row["returned, waiting"] = row.get("returned, waiting", 0) + len(returned)
    row["lost answers"] += len(set(range(snap["next_id"])) - set(consumed) - returned)
    row["duplicated answers"] += len(consumed) - len(set(consumed))


def soak_simulation(seeds: list[int]) -> dict[str, Any]:
    from tests.runtime.simulation import Simulation

    row: dict[str, Any] = {"runs": 0, "passes": 0, "lost": 0, "duplicated": 0,
                           "out of order": 0, "failed seeds": [], "answers": 0,
                           "lost answers": 0, "duplicated answers": 0, "diverging answers": 0}
    for seed in seeds:
        row["runs"] += 1
        sim = Simulation(seed)
        try:
            for _ in range(400):
                sim.random_step(faults=True)
            sim.drain()
            _count_numbers(sim, row)
            _count_answers(sim, row)
            sim.check_invariants()
            row["passes"] += 1
        except AssertionError as exc:
            row["diverging answers"] += "an earlier attempt got" in str(exc)
            row["failed seeds"].append(f"{seed}: {str(exc)[:100]}")
        finally:
            sim.cleanup()
    return row


def soak_two_speeds(seeds: list[int]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    return _two_speeds_runs(builder, seeds, "two-speeds")


def soak_cluster(seeds: list[int]) -> dict[str, Any]:
    from sparkcoord.spark.cluster import LocalStandaloneCluster

    with LocalStandaloneCluster(workers=2, cores_per_worker=1, memory_per_worker="1536m") as cluster:
        # executors import the scenario's classes from this repository's tests package
        builder = cluster.session_builder("soak-cluster").config("spark.executorEnv.PYTHONPATH", REPO)
        return _two_speeds_runs(builder, seeds, "cluster")


def _two_speeds_runs(builder: Any, seeds: list[int], name: str) -> dict[str, Any]:
    from tests.spark.scenarios import run_two_speeds

    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    row: dict[str, Any] = {"runs": 0, "passes": 0, "lost": 0, "duplicated": 0,
                           "out of order": 0, "failed seeds": []}
    try:
        for seed in seeds:
            workdir = tempfile.mkdtemp(prefix=f"soak-{name}-{seed}-")
            row["runs"] += 1
            try:
                outcome = run_two_speeds(spark, workdir, seed)
            except Exception as exc:  # noqa: BLE001 - a crash of the run is a failure to report
                row["failed seeds"].append(f"{seed} ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            row["lost"] += outcome.lost
            row["duplicated"] += outcome.duplicated
            row["out of order"] += outcome.out_of_order
            if outcome.passed:
                row["passes"] += 1
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                row["failed seeds"].append(f"{seed} ({workdir})")
    finally:
        spark.stop()
    return row


def soak_driver_kill(seeds: list[int]) -> dict[str, Any]:
    import pathlib

    from tests.spark.test_driver_kill import test_a_killed_driver_restarts_exactly_once as case

    points = [("mid-batch", 0), ("sealing", 1), ("sealed", 1), ("mid-batch", 1),
              ("sink-committed", 1)]
    row: dict[str, Any] = {"runs": 0, "passes": 0, "lost": 0, "duplicated": 0,
                           "out of order": 0, "failed seeds": []}
    for seed in seeds:
        point, epoch = points[seed % len(points)]
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"soak-kill-{seed}-"))
        row["runs"] += 1
        try:
            case(workdir, point, epoch)
            row["passes"] += 1
            shutil.rmtree(workdir, ignore_errors=True)
        except AssertionError as exc:
            row["failed seeds"].append(f"{seed} {point}@{epoch} ({workdir}): {str(exc)[:80]}")
    return row


def _files_row() -> dict[str, Any]:
    return {"runs": 0, "passes": 0, "lost": 0, "duplicated": 0, "out of order": "-",
            "failed seeds": []}


def _tally(row: dict[str, Any], seed: int, what: str, workdir: Any, error: str | None,
           verdict: dict[str, Any] | None, lost: int, duplicated: int, clean: bool,
           width: int = 120) -> None:
    """Count one seed's run in ``row``: a pass (its directory removed) or a failed seed with
    its directory and the error or the verdict."""
    row["runs"] += 1
    row["lost"] += lost
    row["duplicated"] += duplicated
    if error is None and verdict is not None and clean:
        row["passes"] += 1
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        row["failed seeds"].append(f"{seed} {what} ({workdir}): "
                                   f"{(error or str(verdict))[:width]}")


def _files_tally(row: dict[str, Any], seed: int, what: str, workdir: str,
                 error: str | None) -> None:
    from tests.spark.files_kill_job import sink_check

    check = sink_check(workdir)
    _tally(row, seed, what, workdir, error, check, check["lost"],
           check["duplicated"] + check["unexpected"],
           check["lost"] == check["duplicated"] == check["unexpected"] == 0, width=80)


def _files_in_session(seeds: list[int], failure: str) -> dict[str, Any]:
    import random

    from bench.common import spark_session
    from tests.spark.files_kill_job import run_job

    row = _files_row()
    spark = spark_session("sparkcoord-soak-files")
    try:
        for seed in seeds:
            waves = random.Random(seed).randint(2, 4)
            workdir = tempfile.mkdtemp(prefix=f"soak-files-{failure}-{seed}-")
            error = None
            try:
                report = run_job(spark, workdir, waves, failure, seed)
                if not os.listdir(os.path.join(workdir, "markers")):
                    error = "no failure was injected"
                elif failure == "fail_job" and report.restarts != 1:
                    error = f"{report.restarts} restarts"
            except Exception as exc:  # noqa: BLE001 - a failed seed, reported in the table
                error = f"{type(exc).__name__}: {exc}"
            _files_tally(row, seed, f"{failure}, {waves} waves", workdir, error)
    finally:
        spark.stop()
    return row


def soak_files_task(seeds: list[int]) -> dict[str, Any]:
    return _files_in_session(seeds, "task")


def soak_files_fail_job(seeds: list[int]) -> dict[str, Any]:
    return _files_in_session(seeds, "fail_job")


def soak_files_kill(seeds: list[int]) -> dict[str, Any]:
    import pathlib
    import random
    import signal

    from tests.spark.files_kill_job import write_wave
    from tests.spark.test_driver_kill import run_files_job

    points = ["sealing", "sealed", "mid-batch", "answered", "sink-committed"]
    row = _files_row()
    for seed in seeds:
        rng = random.Random(seed)
        point, epoch, waves = points[seed % len(points)], rng.randint(0, 3), rng.randint(2, 4)
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"soak-files-kill-{seed}-"))
        what = f"{point}@{epoch}, {waves} waves"
        first = run_files_job(workdir, f"{point}:{epoch}:{workdir / 'markers'}", waves)
        error = None
        if first.returncode not in (0, -signal.SIGKILL):
            error = f"first run exited {first.returncode}: {first.stderr[-200:]}"
        else:
            # files arriving while the job is down (a wave past the ones the job writes)
            write_wave(str(workdir / "data"), waves + rng.randint(0, 3))
            second = run_files_job(workdir, None, waves)
            if second.returncode != 0:
                error = f"second run exited {second.returncode}: {second.stderr[-200:]}"
        _files_tally(row, seed, what, str(workdir), error)
    return row


def soak_aligned(seeds: list[int]) -> dict[str, Any]:
    """Watermark alignment under faults: two directories at 1x and 20x (16 files each)
    read by an aligned availableNow run into a windowed count per lane
    (tests/spark/test_alignment_spark.py's ``run``). The seed picks the readers (1-3), the
    files per trigger (1-3), a bounded or a continuous source, and one failure: a reader's
    task raising in the middle of a file, or the enumerator failing the job at a split. A
    seed passes when every row is counted once (a row dropped as late by the watermark
    counts as lost), the spread stays within max drift plus one file, and the failure was
    injected (a fail_job restarts the query once)."""
    import random

    from bench.common import spark_session
    from tests.spark.test_alignment_spark import (
        ALIGNED_DELAY_S,
        DRIFT_S,
        FAST_STEP_MS,
        FILES,
        ROWS,
        run,
    )

    row = _files_row()
    bound_ms = DRIFT_S * 1000 + ROWS * FAST_STEP_MS
    spark = spark_session("sparkcoord-soak-aligned")
    try:
        for seed in seeds:
            rng = random.Random(seed)
            parallelism, per_trigger = rng.randint(1, 3), rng.randint(1, 3)
            bounded, failure = rng.random() < 0.5, rng.choice(["task", "fail_job"])
            lane, at = rng.choice(["fast", "slow"]), rng.randrange(FILES)
            where = f"{lane}/{at}" if failure == "task" else f"split {2 * at}"
            what = (f"P={parallelism}, {per_trigger}/trigger, "
                    f"{'bounded' if bounded else 'continuous'}, {failure} at {where}")
            workdir = tempfile.mkdtemp(prefix=f"soak-aligned-{seed}-")
            error = None
            try:
                result = run(spark, workdir, aligned=True, delay=f"{ALIGNED_DELAY_S} seconds",
                             parallelism=parallelism, bounded=bounded,
                             files_per_trigger=per_trigger, batch_rows=10,
                             fail_at=2 * at if failure == "fail_job" else None,
                             task_fails_in=f"{lane}/part-{at:04d}" if failure == "task"
                             else None)
                for count in result["by_lane"].values():
                    row["lost"] += max(0, FILES * ROWS - count)
                    row["duplicated"] += max(0, count - FILES * ROWS)
                spread = max(result["spreads"], default=0)
                if result["by_lane"] != {"fast": FILES * ROWS, "slow": FILES * ROWS}:
                    error = f"counts {result['by_lane']}"
                elif spread > bound_ms:
                    error = f"spread {spread} ms > {bound_ms} ms"
                elif result["injected"] != [failure]:
                    error = f"injected {result['injected']}"
                elif result["restarts"] != (failure == "fail_job"):
                    error = f"{result['restarts']} restarts"
            except Exception as exc:  # noqa: BLE001 - a failed seed, reported in the table
                error = f"{type(exc).__name__}: {exc}"
            row["runs"] += 1
            if error is None:
                row["passes"] += 1
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                row["failed seeds"].append(f"{seed} {what} ({workdir}): {error[:80]}")
    finally:
        spark.stop()
    return row


#: Requests (issue 12): only the simulation has a requesting operator so far.
ANSWER_COLUMNS = ("answers", "lost answers", "duplicated answers", "diverging answers")

#: a failure text of a run that took PostgreSQL's crash recovery for a refusal (issue 43
#: finding 5): the source must wait through it, not fail the job
CRASH_REFUSED = ("ConnectionRefused", "not yet accepting connections", "is starting up",
                 "in recovery mode")


def soak_cdc(seeds: list[int]) -> dict[str, Any]:
    """The PostgreSQL source (tests/spark/cdc_job.py) on a PostgreSQL 15 of its own, two writer
    processes going on, with, by seed (``seed % 7``): a task failure, a fail_job, the driver
    killed with SIGKILL in the snapshot, at the hand-over, in the stream or at a sink commit
    (then restarted), or PostgreSQL stopped with ``pg_ctl -m immediate`` (a crash) and
    started again while the stream runs (issue 43 finding 5: the job must ride through the
    crash recovery's "not yet accepting connections": a crash seed fails if the job gave up
    or any of its restarts was for a refused connection). Each run is judged by
    ``cdc_job.judge``; every seed's line gives the stream's lag behind the writers at the end
    of the writes and the catch-up time (``cdc_job.lag_figures``)."""
    import pathlib
    import random

    from tests.postgres_server import PostgresServer
    from tests.spark import cdc_job
    from tests.spark.test_cdc_driver_kill import killed_and_restarted

    kinds = ["task", "fail_job", "cdc-snapshot", "cdc-handover", "cdc-stream", "sink-committed",
             "pg-crash"]
    row: dict[str, Any] = {"runs": 0, "passes": 0, "lost": 0, "duplicated": 0,
                           "out of order": 0, "failed seeds": [], "per seed": []}
    server = PostgresServer()
    server.start()
    try:
        for seed in seeds:
            rng = random.Random(seed)
            kind = kinds[seed % len(kinds)]
            workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"soak-cdc-{kind}-{seed}-"))
            error, verdict = None, None
            t0 = time.monotonic()
            try:
                if kind in ("task", "fail_job"):
                    verdict = killed_and_restarted(server, workdir, "", 0, seed, kind)
                    if not (workdir / "markers").is_dir() or not os.listdir(workdir / "markers"):
                        error = "no failure was injected"
                elif kind == "pg-crash":
                    verdict = killed_and_restarted(server, workdir, "", 0, seed, "none",
                                                   crash=True)
                    refused = [f for r in verdict["reports"] for f in r["failures"]
                               if any(t in f for t in CRASH_REFUSED)]
                    if not verdict["crashed"]:
                        error = "PostgreSQL was not crashed (the stream carried too little)"
                    elif refused:
                        error = f"a restart for PostgreSQL's crash recovery: {refused[0]}"
                else:
                    # the snapshot of cdc_job's tables is read in about four batches
                    epoch = {"cdc-snapshot": rng.randint(1, 3), "cdc-handover": 0,
                             "cdc-stream": rng.randint(10, 20),
                             "sink-committed": rng.randint(2, 20)}[kind]
                    verdict = killed_and_restarted(server, workdir, kind, epoch, seed)
                    kind = f"{kind}@{epoch}"
            except Exception as exc:  # noqa: BLE001 - a failed seed, reported in the table
                error = f"{type(exc).__name__}: {exc}"
            row["runs"] += 1
            if verdict is not None:
                row["lost"] += (verdict["missing"] + verdict["wrong"]
                                + verdict["transactions_missing"])
                row["duplicated"] += (verdict["changes_twice"] + verdict["extra"]
                                      + verdict["snapshot_rows_twice"]
                                      + verdict["transactions_in_stream_and_snapshot"])
                row["out of order"] += verdict["out_of_order"]
            clean = verdict is not None and all(verdict[k] == 0 for k in cdc_job.CLEAN)
            lag = cdc_job.lag_figures(str(workdir))
            restarts = sum(r["restarts"] for r in verdict["reports"]) if verdict else "-"
            row["per seed"].append({
                "seed": seed, "case": kind,
                "result": "pass" if error is None and clean else "FAIL",
                "lag at end of writes": _seconds(lag["lag_at_end_s"]),
                "catch-up": _seconds(lag["catch_up_s"]), "restarts": str(restarts),
                "time": f"{time.monotonic() - t0:.0f}s"})
            print(f"cdc seed {seed}: {row['per seed'][-1]}", flush=True)
            if error is None and clean:
                row["passes"] += 1
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                row["failed seeds"].append(f"{seed} {kind} ({workdir}): "
                                           f"{(error or str(verdict))[:120]}")
    finally:
        server.stop()
    return row


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


#: the sink scenario's cases after the kill, by ``seed % 3`` (soak_sink)
SINK_CASES = ("restart", "second-driver", "same-job-id")


def soak_sink(seeds: list[int]) -> dict[str, Any]:
    """The lake sink (tests/spark/lake_kill_job.py): an availableNow file stream into a Delta
    or an Iceberg table (by seed), killed with SIGKILL at a lake kill point or ``mid-batch``
    at an epoch chosen by the seed, with or without a sink task failing after it reported its
    files, files written while it is down, then run to the end. A seed passes when the table
    holds every file's rows once and its data directory holds exactly the files it
    references (``lake_kill_job.table_check``). A kill point the run did not reach (a high
    epoch, a cleanup with nothing to delete) leaves a run that ended by itself: judged the
    same. Seeds whose ``seed // 10`` is odd run with the sink's compaction on (its point
    ``lake-compacted`` among the points). By ``seed % 3`` (:data:`SINK_CASES`), after the
    kill: ``restart``, the run to the end alone; ``second-driver`` (issue 43 finding 9), a
    second driver program started on the same checkpoint while that run holds its sink
    tasks: it must be refused at start with LeaseHeld naming the running one's pid, and
    afterwards every sealed inbound log and the newest record of each coordination directory
    must read back verified (:func:`_checkpoint_restores`); ``same-job-id`` (finding 11),
    once the table is complete a job on a fresh checkpoint with the same ``jobId`` on the
    same table: it must give up at once (CheckpointBehindTable, "which a restart cannot
    change", no "restarting in") and leave the table's location file for file as it was."""
    import pathlib
    import random
    import signal

    from tests.spark.lake_kill_job import table_check, write_files
    from tests.spark.test_lake_sink_kill import run_lake_job

    points = ["lake-written", "lake-committing", "lake-committed", "lake-cleaning", "mid-batch"]
    row = _files_row()
    for seed in seeds:
        rng = random.Random(seed)
        kind = ("delta", "iceberg")[seed % 2]
        compaction = (seed // 10) % 2 == 1
        kinds_of_point = [*points, "lake-compacted"] if compaction else points
        point = kinds_of_point[(seed // 2) % len(kinds_of_point)]
        epoch = rng.randint(0, 3)
        failure = "task" if point == "lake-cleaning" else rng.choice(["none", "task"])
        case = SINK_CASES[seed % len(SINK_CASES)]
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"soak-sink-{kind}-{seed}-"))
        what = (f"{kind} {point}@{epoch} {failure}" + (" compaction" if compaction else "")
                + f", {case}")
        error, check = None, None
        try:
            write_files(str(workdir), 0, 8)
            first = run_lake_job(workdir, kind, f"{point}:{epoch}:{workdir / 'markers'}",
                                 failure, seed, compaction)
            if first.returncode not in (0, -signal.SIGKILL):
                error = f"first run exited {first.returncode}: {first.stderr[-200:]}"
            else:
                write_files(str(workdir), 8, rng.randint(1, 3))
                if case == "second-driver":
                    error = _second_driver(workdir, kind, compaction)
                else:
                    second = run_lake_job(workdir, kind, None, compaction=compaction)
                    if second.returncode != 0:
                        error = f"second run exited {second.returncode}: {second.stderr[-200:]}"
                if error is None and case == "same-job-id":
                    error = _same_job_id(workdir, kind, compaction)
            check = table_check(str(workdir), kind)
        except Exception as exc:  # noqa: BLE001 - a failed seed, reported in the table
            error = f"{type(exc).__name__}: {exc}"
        clean = check is not None and all(check[k] == 0 for k in (
            "lost", "duplicated", "unexpected", "orphans", "missing files"))
        _tally(row, seed, what, workdir, error, check, check["lost"] if check else 0,
               check["duplicated"] + check["unexpected"] if check else 0, clean)
    return row


def _second_driver(workdir: Any, kind: str, compaction: bool) -> str | None:
    """Finding 9's case: the run to the end started with its sink tasks held, a second
    driver program on the same checkpoint meanwhile, the first let go; what went wrong."""
    from tests.spark.test_lake_sink_kill import run_lake_job, start_lake_job

    hold, holding = workdir / "hold", workdir / "markers" / "holding"
    running = start_lake_job(workdir, kind, hold, workdir / "held-run.log", compaction)
    error = None
    try:
        deadline = time.monotonic() + 300
        while not holding.exists() and running.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not holding.exists():
            return f"the held run never reached a sink task (exit {running.poll()})"
        second = run_lake_job(workdir, kind, None, compaction=compaction)
        tail = second.stderr[-300:].replace("\n", " ")
        if second.returncode == 0:
            error = f"a second driver on the same checkpoint ran to the end: {tail}"
        elif "LeaseHeld" not in second.stderr or f"pid {running.pid} " not in second.stderr:
            error = f"the second driver was not refused with LeaseHeld naming pid {running.pid}: {tail}"
        elif running.poll() is not None:
            error = f"the held run ended while the second driver started ({running.returncode})"
    finally:
        hold.touch()
        try:
            code = running.wait(timeout=400)
        except subprocess.TimeoutExpired:
            os.killpg(running.pid, signal.SIGKILL)
            code = running.wait()
    if error is None and code != 0:
        log = (workdir / "held-run.log").read_text(errors="replace")[-200:]
        error = f"the held run exited {code}: {log}"
    return error or _checkpoint_restores(workdir / "ckpt")


def _checkpoint_restores(checkpoint: Any) -> str | None:
    """Every coordination directory's newest record and every sealed inbound log read back
    verified (what a restore reads; finding 9 once left a log longer than its seal)."""
    from sparkcoord.runtime import layout
    from sparkcoord.runtime.storage import CheckpointStorage

    for directory in sorted((checkpoint / "coordination").iterdir()):
        storage = CheckpointStorage(str(directory))
        try:
            epochs = storage.record_epochs()
            if epochs:
                storage.read_record(max(epochs))
            inbound = directory / layout.INBOUND
            for name in sorted(os.listdir(inbound)) if inbound.is_dir() else []:
                if name.endswith(layout.SEAL_SUFFIX):
                    storage.read_inbound_log(int(name[:-len(layout.SEAL_SUFFIX)]))
        except Exception as exc:  # noqa: BLE001 - the failed seed's reason
            return f"{directory.name} does not restore: {type(exc).__name__}: {exc}"
    return None


def _same_job_id(workdir: Any, kind: str, compaction: bool) -> str | None:
    """Finding 11's case: a job on a fresh checkpoint with the same jobId on the complete
    table; what went wrong."""
    from tests.spark.lake_kill_job import table_location
    from tests.spark.test_lake_sink_kill import run_lake_job

    def listing() -> set[str]:
        location = table_location(str(workdir), kind)
        return {os.path.relpath(os.path.join(d, n), location)
                for d, _, names in os.walk(location) for n in names}

    before = listing()
    other = run_lake_job(workdir, kind, None, compaction=compaction,
                         checkpoint=workdir / "ckpt-same-job-id")
    tail = other.stderr[-300:].replace("\n", " ")
    if other.returncode == 0:
        return f"a fresh checkpoint with the same jobId ran to the end: {tail}"
    if "CheckpointBehindTable" not in other.stderr:
        return f"not refused with CheckpointBehindTable: {tail}"
    if "which a restart cannot change" not in other.stderr or "restarting in" in other.stderr:
        return f"the refusal was restarted: {tail}"
    added = sorted(listing() - before)
    if added:
        return f"the refused job wrote {len(added)} file(s) into the table: {added[:3]}"
    return None


def soak_merge(seeds: list[int]) -> dict[str, Any]:
    """The lake sink in mode ``merge`` (tests/spark/cdc_lake_kill_job.py): ``public.orders``
    merged by key into a Delta or an Iceberg table, on a PostgreSQL 15 of its own, with 1-2
    of cdc_job's writer processes (transactions and pace by seed) going on, killed with
    SIGKILL at a lake kill point or ``mid-batch`` at an epoch chosen by the seed, a mix of
    bulk statements run while it is down (``cdc_lake_kill_job.DOWN_MIXES``, by seed), then
    restarted until it caught up. By ``seed % 4`` ``orders`` also has none, one or both of
    cdc_job.add_order_extras's columns (:data:`MERGE_EXTRAS`): ``toast``, a large TOASTed
    column that most updates leave alone, so that under the default replica identity they
    arrive without it (issue 43 finding 3: the merge must keep the table's value, not fail
    the job nor write null); ``edges``, a timestamptz at 9999-12-31 23:59:59.999999 UTC and
    0001-01-01 UTC in the snapshot and the writers' changes (finding 1: a commit stuck
    for good on the maximum's statistics); the table must hold them equal too (the `cdc`
    scenario's sink is the batch-file sink of projected change rows, which neither finding
    is about: they are the merge's). A seed passes when the table equals the source table
    row by row, no data file is left that the table does not reference and no staged file of an
    epoch the table holds is left (``cdc_lake_kill_job.judge``). A kill point the run did not
    reach (a high epoch) leaves a run that ended by itself: judged the same."""
    import pathlib
    import random

    from tests.postgres_server import PostgresServer
    from tests.spark import cdc_lake_kill_job
    from tests.spark.test_cdc_lake_kill import killed_and_restarted

    points = ["lake-committed", "lake-cleaning", "lake-committing", "lake-written", "mid-batch"]
    row = _files_row()
    server = PostgresServer()
    server.start()
    try:
        for seed in seeds:
            rng = random.Random(seed)
            # (point, format) pairs cycle every 10 seeds
            point = points[seed % len(points)]
            kind = ("delta", "iceberg")[(seed % len(points) + seed // len(points)) % 2]
            epoch = rng.randint(1, 10)
            writers = [seed * 10 + i for i in range(rng.randint(1, 2))]
            transactions, pause_s = rng.randint(150, 400), round(rng.uniform(0.02, 0.08), 3)
            down = rng.choice(sorted(cdc_lake_kill_job.DOWN_MIXES))
            extras = MERGE_EXTRAS[seed % len(MERGE_EXTRAS)]
            what = (f"{kind} {point}@{epoch}, {len(writers)}x{transactions} tx "
                    f"pause {pause_s}, down {down}, extras {'+'.join(extras) or 'none'}")
            print(f"merge seed {seed}: {what}", flush=True)
            workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"soak-merge-{kind}-{seed}-"))
            error, verdict = None, None
            try:
                verdict = killed_and_restarted(server, workdir, kind, point, epoch,
                                               writers=writers, transactions=transactions,
                                               pause_s=pause_s, down=down, must_kill=False,
                                               extras=extras)
                if not verdict["killed"]:
                    what += " (not reached)"
            except Exception as exc:  # noqa: BLE001 - a failed seed, reported in the table
                error = f"{type(exc).__name__}: {exc}"
            clean = verdict is not None and all(
                verdict[k] == 0 for k in cdc_lake_kill_job.CLEAN)
            print(f"merge seed {seed}: {error or verdict}", flush=True)
            _tally(row, seed, what, workdir, error, verdict,
                   verdict["missing"] + verdict["wrong"] if verdict else 0,
                   verdict["extra"] + verdict["duplicated"] if verdict else 0, clean, width=160)
    finally:
        server.stop()
    return row


#: the merge scenario's extra columns of ``orders``, by ``seed % 4`` (cdc_job.add_order_extras)
MERGE_EXTRAS: list[tuple[str, ...]] = [(), ("toast",), ("edges",), ("toast", "edges")]


SCENARIOS = {"simulation": soak_simulation, "two-speeds": soak_two_speeds,
             "driver-kill": soak_driver_kill, "cluster": soak_cluster,
             "files-task": soak_files_task, "files-fail-job": soak_files_fail_job,
             "files-kill": soak_files_kill, "aligned": soak_aligned, "cdc": soak_cdc,
             "sink": soak_sink, "merge": soak_merge}


def main() -> int:
    ap = argparse.ArgumentParser(description="run exactly-once scenarios with many seeds")
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args()
    console = Console(width=max(Console().width, 160))  # full columns in logs and pipes too
    table = Table(title=f"soak: {args.seeds} seeds per scenario from {args.first_seed}")
    for col in ("scenario", "runs", "passes", "lost", "duplicated", "out of order",
                *ANSWER_COLUMNS, "failed seeds", "time"):
        table.add_column(col)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    ok = True
    seed_tables: list[tuple[str, list[dict[str, Any]]]] = []  # a scenario's "per seed" lines
    for name in names:
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        t0 = time.monotonic()
        row = SCENARIOS[name](seeds)
        ok &= not row["failed seeds"]
        table.add_row(name, str(row["runs"]), str(row["passes"]), str(row["lost"]),
                      str(row["duplicated"]), str(row["out of order"]),
                      *(str(row.get(col, "-")) for col in ANSWER_COLUMNS),
                      ", ".join(map(str, row["failed seeds"])) or "-",
                      f"{time.monotonic() - t0:.0f}s")
        if row.get("per seed"):
            seed_tables.append((name, row["per seed"]))
        console.print(f"{name}: done")
    console.print(table)
    for name, per_seed in seed_tables:
        detail = Table(title=f"{name}: per seed")
        for col in per_seed[0]:
            detail.add_column(col)
        for line in per_seed:
            detail.add_row(*(str(v) for v in line.values()))
        console.print(detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
