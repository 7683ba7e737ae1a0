"""Recovery: how long a failure costs, from the failure to the next committed batch.

1. A task fails (a Spark task retry inside the batch; the coordinator is reset or told, the
   retried task re-registers): from the instant the operator raised to the commit of the
   batch it was in. Baseline: Spark's own task retry on the same shape of query without
   sparkcoord, in the same run: a plain PySpark Python streaming source of two partitions
   (a batch whenever Spark asks, a few rows each) into the noop sink, whose ``read`` raises
   once at each failure point (marker files, as sparkcoord.examples.numbers does), from the
   instant it raised to the commit of the batch it was in. Each query fails at five points
   about a second apart (numbers 30, 70, ..., 190 of subtask 0's stream; plain batches 5,
   10, ..., 25), each point once. Two shapes: one of the batch's two tasks fails, and both
   fail. A Python worker whose task raised exits, so a retry runs in an idle worker only if
   one is there when Spark schedules it (a few ms after the failure); otherwise Spark starts
   a new worker, which costs about 400 ms more here (pyarrow and the rest imported in the
   fork, before and after the read). When both tasks fail there is never an idle worker.
   When one fails, it depends on whether the other task has ended: the plain source's tasks
   end in about 0.1 ms, ours in about 4 ms (median; 9 ms p90: a registration and a finish
   over the channel, the state file), so the bench also measures Spark's own retry while the
   plain batch's other task takes ``BUSY_MS``. Each retry says whether it ran in a new
   worker (marked * in the notes).
2. A coordinator calls ``fail_job`` (global failover: the query fails, CoordinatedJob.run
   restarts it from its checkpoint after the restart strategy's delay, here none:
   ``RESTART_DELAY_S``): from ``fail_job`` to the first batch committed by the restarted query
   (a batch that was already running may still commit after ``fail_job``; it does not
   count), in several runs (``FAIL_JOB_RUNS`` per round). Baseline: a fresh query's time from
   ``start()`` to its first committed batch, in the same run; fresh starts spread too, so
   the median restart is held against the median fresh start and the slowest against the
   slowest.
Instants come from marker files written at the failure and the modification times of Spark's
commit log files. Also told: the median interval between commits away from the failures.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench.common import figure, wait_until

#: where each query fails: numbers of the coordinated stream (40 a second per subtask) ...
FAIL_NUMBERS = (30, 70, 110, 150, 190)
#: ... and batches of the plain query (about 0.2 s each)
FAIL_BATCHES = (5, 10, 15, 20, 25)
#: how long the plain query's other tasks take in the "busy" baseline (about our own task's
#: time in a failing batch; with it, Spark's own retry started a new Python worker for 1 to
#: all of the failures of a run, in the runs made for issue 29)
BUSY_MS = 10


def _note_retry(markers: str, index: int, point: int) -> None:
    """In a retried task (executor): whether it runs in a Python worker started after the
    failure (a new worker) or in one that was there (marker ``retry-<index>-<point>``).
    Pickled by value with the closures that call it (:func:`_by_value`)."""
    import os as os_
    import time as time_

    failed = os_.path.join(markers, f"fail-{index}-{point}")
    if not os_.path.exists(failed):
        return
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start after boot
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    born = time_.time() - uptime + ticks / os_.sysconf("SC_CLK_TCK")
    with open(os_.path.join(markers, f"retry-{index}-{point}"), "w") as f:
        f.write("new" if born > os_.path.getmtime(failed) - 0.02 else "reused")


@contextlib.contextmanager
def _by_value() -> Iterator[None]:
    """Pickle this module's functions by value meanwhile: the workers cannot import ``bench``."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _new_workers(markers: str, points: Sequence[int]) -> list[bool]:
    """For each failure point, whether a retry ran in a new Python worker."""
    got = []
    for point in points:
        said = [open(os.path.join(markers, n)).read() for n in os.listdir(markers)
                if n.startswith("retry-") and n.endswith(f"-{point}")]
        got.append("new" in said)
    return got


def _commit_times(spark_checkpoint: str) -> list[float]:
    commits = os.path.join(spark_checkpoint, "commits")
    if not os.path.isdir(commits):
        return []
    return sorted(os.path.getmtime(os.path.join(commits, n)) for n in os.listdir(commits) if n.isdigit())


def _failure_instants(markers: str, points: Sequence[int], failing: int) -> list[float] | None:
    """When each failure point's first task raised (None until every point failed)."""
    instants = []
    for point in points:
        paths = [os.path.join(markers, f"fail-{index}-{point}") for index in range(failing)]
        if not all(os.path.exists(p) for p in paths):
            return None
        instants.append(min(os.path.getmtime(p) for p in paths))
    return instants


def _measured(instants: list[float], commits: list[float]) -> dict[str, Any]:
    """Each failure's time to the commit of its batch (the first commit after it), and the
    median interval between commits with no failure in between."""
    recoveries = [min(t for t in commits if t > f) - f for f in instants]
    intervals = [b - a for a, b in zip(commits, commits[1:], strict=False)
                 if not any(a < f <= b for f in instants)]
    return {"recovery_s": recoveries,
            "batch_interval_s": statistics.median(intervals) if intervals else float("nan")}


def _recovered(markers: str, points: Sequence[int], failing: int, ckpt: str) -> bool:
    instants = _failure_instants(markers, points, failing)
    return instants is not None and len([t for t in _commit_times(ckpt) if t > instants[-1]]) >= 2


def _failing_collector(markers: str, failing: int) -> Any:
    """A NumberCollector whose subtasks below ``failing`` raise once at each of
    ``FAIL_NUMBERS`` (marker ``fail-<subtask>-<number>``). Defined in a function and pickled
    under :func:`_by_value`: the executors' workers cannot import ``bench``."""
    from sparkcoord.examples.numbers import NumberCollector, _once

    points = FAIL_NUMBERS

    class FailingCollector(NumberCollector):
        def handle_operator_event(self, event: Any) -> Any:
            index = self.context.subtask
            if index < failing and event.value in points:
                if _once(markers, f"fail-{index}-{event.value}"):
                    raise RuntimeError(f"injected task failure at number {event.value}")
                if self.context.spark_attempt > 0:
                    _note_retry(markers, index, event.value)
            return NumberCollector.handle_operator_event(self, event)

    return FailingCollector


def _task_failures(spark: Any, root: str, failing: int) -> dict[str, Any]:
    """The coordinated query: the first ``failing`` subtasks fail at each of FAIL_NUMBERS."""
    from sparkcoord.examples.numbers import SCHEMA, NumbersCoordinator
    from sparkcoord.runtime.restart import FixedDelay
    from sparkcoord.spark import CoordinatedJob

    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"), checkpoint_interval_s=0.2)
    coordinator = functools.partial(NumbersCoordinator, total=10**6, per_tick=2, interval_s=0.05)
    operator = functools.partial(_failing_collector(markers, failing), report=True)
    with _by_value():
        df = job.source(operator, coordinator, 2, SCHEMA, name="numbers")
    started = time.time()
    job.run(df.writeStream.format("noop").trigger(processingTime="0 seconds"),
            restart=FixedDelay(attempts=0, delay_s=0.5), poll_s=0.1, timeout_s=300,
            until=lambda: _recovered(markers, FAIL_NUMBERS, failing, job.spark_checkpoint))
    instants = _failure_instants(markers, FAIL_NUMBERS, failing)
    assert instants is not None
    commits = _commit_times(job.spark_checkpoint)
    return {**_measured(instants, commits), "first_commit_s": commits[0] - started,
            "new_worker": _new_workers(markers, FAIL_NUMBERS)}


def _plain_source(markers: str, failing: int, busy_ms: int) -> Any:
    """A plain PySpark Python streaming source (no sparkcoord) of two partitions, a batch
    whenever Spark asks, four rows per partition; ``read`` of the partitions below
    ``failing`` raises once after two rows in each of FAIL_BATCHES (marker
    ``fail-<partition>-<batch>``), so Spark retries the task; the other partitions sleep
    ``busy_ms`` before their rows. Defined in a function and pickled under
    :func:`_by_value`: the executors' workers cannot import ``bench``."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    points = FAIL_BATCHES

    class Part(InputPartition):
        def __init__(self, index: int, batch: int) -> None:
            super().__init__(index)
            self.index, self.batch = index, batch

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"batch": -1}

        def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
            return {"batch": start["batch"] + 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return [Part(i, end["batch"]) for i in range(2)]

        def read(self, partition: Any) -> Iterator[tuple[Any, ...]]:
            import os as os_

            from pyspark import TaskContext

            if (partition.index < failing and partition.batch in points
                    and TaskContext.get().attemptNumber() > 0):
                _note_retry(markers, partition.index, partition.batch)
            if busy_ms and partition.index >= failing:
                import time as time_

                time_.sleep(busy_ms / 1000)
            for k in range(4):
                if k == 2 and partition.index < failing and partition.batch in points:
                    os_.makedirs(markers, exist_ok=True)
                    try:
                        fd = os_.open(os_.path.join(markers, f"fail-{partition.index}-{partition.batch}"),
                                      os_.O_CREAT | os_.O_EXCL | os_.O_WRONLY)
                    except FileExistsError:
                        pass
                    else:
                        os_.close(fd)
                        raise RuntimeError(f"injected task failure in batch {partition.batch}")
                yield ("plain", partition.index, k, k, partition.batch)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class FailingOnce(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sparkcoord-bench-plain-failing"

        def schema(self) -> str:
            return "operator string, subtask int, value int, position int, epoch int"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    return FailingOnce


def _spark_retries(spark: Any, root: str, failing: int, busy_ms: int = 0) -> dict[str, Any]:
    """The baseline: Spark's own task retries, the same shape of query without sparkcoord."""
    markers = os.path.join(root, "markers")
    ckpt = os.path.join(root, "ckpt")
    with _by_value():
        spark.dataSource.register(_plain_source(markers, failing, busy_ms))
    query = (spark.readStream.format("sparkcoord-bench-plain-failing").load()
             .writeStream.format("noop").trigger(processingTime="0 seconds")
             .option("checkpointLocation", ckpt).start())
    try:
        wait_until(lambda: _recovered(markers, FAIL_BATCHES, failing, ckpt) or not query.isActive,
                   300, "the plain query's task retries", poll_s=0.1)
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the plain baseline query failed: {query.exception()}")
    instants = _failure_instants(markers, FAIL_BATCHES, failing)
    assert instants is not None
    return {**_measured(instants, _commit_times(ckpt)),
            "new_worker": _new_workers(markers, FAIL_BATCHES)}


#: the restart strategy's delay in the fail_job runs: none, so the figure is what the restart
#: itself costs (a delay is a wait the user chooses, added as it is)
RESTART_DELAY_S = 0.0
#: fail_job runs per bench round (issue 29 item 3: a spread over several rounds, not one)
FAIL_JOB_RUNS = 3


def _fail_job(spark: Any, root: str) -> dict[str, float]:
    from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
    from sparkcoord.runtime.restart import FixedDelay
    from sparkcoord.spark import CoordinatedJob

    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"), checkpoint_interval_s=0.2)
    coordinator = functools.partial(NumbersCoordinator, total=10**6, per_tick=2, interval_s=0.05,
                                    fail_job_at=30, marker_dir=markers)
    operator = functools.partial(NumberCollector, marker_dir=markers, report=True)
    df = job.source(operator, coordinator, 2, SCHEMA, name="numbers")
    marker = os.path.join(markers, "fail_job-numbers")
    # A batch already running when fail_job is called may still commit (the query fails at
    # its next driver call): only commits after the driver saw the failure are the restart's.
    query_failed_at: list[float] = []

    def recovered() -> bool:
        return (os.path.exists(marker) and bool(query_failed_at)
                and len([t for t in _commit_times(job.spark_checkpoint)
                         if t > query_failed_at[0]]) >= 2)

    started = time.time()
    job.run(df.writeStream.format("noop").trigger(processingTime="0 seconds"),
            restart=FixedDelay(attempts=2, delay_s=RESTART_DELAY_S), until=recovered, poll_s=0.1,
            timeout_s=300, on_failure=lambda _: query_failed_at.append(time.time()))
    failed_at = os.path.getmtime(marker)
    commits = _commit_times(job.spark_checkpoint)
    after = [t for t in commits if t > query_failed_at[0]]
    # the parts: fail_job -> the job runner saw the query fail (and stopped it), then the
    # restart (the strategy's delay, a fresh start, the coordinators' restore) -> the commit
    return {"recovery_s": after[0] - failed_at, "first_commit_s": commits[0] - started,
            "detected_s": query_failed_at[0] - failed_at,
            "restarted_s": after[0] - query_failed_at[0] - RESTART_DELAY_S}


#: the query runs of one bench round: (name, what fails); the baselines before ours
RUNS = (("spark_retry-1", "one of the batch's two tasks fails; Spark's own retry, plain source"),
        ("spark_retry_busy-1", f"one of two fails, the other task takes {BUSY_MS} ms; Spark's "
                               "own retry, plain source"),
        ("task-1", "one of the batch's two tasks fails; sparkcoord"),
        ("spark_retry-2", "both tasks of the batch fail; Spark's own retry, plain source"),
        ("task-2", "both tasks of the batch fail; sparkcoord"),
        ("fail_job", "fail_job; sparkcoord"))


def _run_one(spark: Any, root: str, name: str) -> dict[str, Any]:
    kind, _, n = name.partition("-")
    if kind == "fail_job":
        return _fail_job(spark, root)
    if kind.startswith("spark_retry"):
        return _spark_retries(spark, root, int(n), BUSY_MS if kind.endswith("busy") else 0)
    return _task_failures(spark, root, int(n))


def run(preset: str, spark: Any) -> dict[str, Any]:
    reps = 1 if preset == "quick" else 3
    got: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in RUNS}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        for i in range(reps):
            for name in got:
                for k in range(FAIL_JOB_RUNS if name == "fail_job" else 1):
                    got[name].append(_run_one(spark, os.path.join(tmp, f"{name}-{i}-{k}"), name))
    return report(got, reps)


def report(got: dict[str, list[dict[str, Any]]], reps: int) -> dict[str, Any]:
    """The figures and notes of the runs ``got`` (each shape's results; ``reps`` rounds)."""

    def each(name: str, key: str = "recovery_s") -> list[float]:
        return [x for r in got[name] for x in (r[key] if isinstance(r[key], list) else [r[key]])]

    def ms(name: str) -> str:
        return ", ".join(f"{x * 1e3:.0f}{'*' if new else ''}"
                         for x, new in zip(each(name), each(name, "new_worker"), strict=True))

    def median(name: str, key: str = "recovery_s") -> float:
        return statistics.median(each(name, key))

    figures = []
    # the "busy" baseline only explains the new workers (see the module's docstring): no figure
    for ours, base, what in (
            ("task-1", "spark_retry-1", "one of the batch's two tasks fails; baseline: Spark's "
                                        "own task retry"),
            ("task-2", "spark_retry-2", "both tasks of the batch fail; baseline: Spark's own "
                                        "task retry")):
        figures.append(figure("recovery", f"task failure -> its batch committed ({what})",
                              median(ours) * 1e3, "ms", median(base) * 1e3, target="<= 1.2x",
                              met=median(ours) <= 1.2 * median(base)))
    # a restart against a fresh start, as distributions: fresh starts spread too (0.94-1.77 s
    # in one run), so the median against the median and the slowest against the slowest
    starts = (each("fail_job", "first_commit_s") + each("task-1", "first_commit_s")
              + each("task-2", "first_commit_s"))
    fresh = statistics.median(starts)
    ratios = sorted(x / fresh for x in each("fail_job"))
    for what, ours_s, base_s in (("median", median("fail_job"), fresh),
                                 ("slowest", max(each("fail_job")), max(starts))):
        figures.append(figure(
            "recovery", f"fail_job -> first batch committed after the restart, {what} of "
            f"{len(ratios)} runs (restart delay {RESTART_DELAY_S:g} s; baseline: the {what} of "
            f"{len(starts)} fresh starts)", ours_s * 1e3, "ms", base_s * 1e3, target="<= 1.1x",
            met=ours_s <= 1.1 * base_s))
    notes = [f"- {reps} query run(s) per shape, {len(FAIL_NUMBERS)} task failures in each; the "
             "baseline of a task failure is Spark's own task retry on a plain Python streaming "
             "source of two partitions (no sparkcoord) failing at the same points, from the raise "
             "to the commit of its batch, measured in the same run; * marks a failure whose "
             "retry ran in a Python worker started after it (a worker whose task raised exits, "
             "and Spark starts a new one when no idle worker is there as it schedules the "
             "retry)",
             *(f"- {what}: {ms(name)} ms (median {median(name) * 1e3:.0f} ms)"
               for name, what in RUNS if name != "fail_job"),
             "- median interval between commits away from the failures: "
             + ", ".join(f"{name} {median(name, 'batch_interval_s') * 1e3:.0f} ms"
                         for name, _ in RUNS if name != "fail_job"),
             "- fail_job -> first commit after the restart, each run: "
             + ", ".join(f"{x * 1e3:.0f}" for x in each("fail_job"))
             + f" ms (ratios to the median fresh start {ratios[0]:.2f}x-{ratios[-1]:.2f}x); "
             "of which "
             "fail_job -> the job runner saw the query fail: "
             + ", ".join(f"{x * 1e3:.0f}" for x in each("fail_job", "detected_s"))
             + " ms, and the restart to the commit: "
             + ", ".join(f"{x * 1e3:.0f}" for x in each("fail_job", "restarted_s"))
             + " ms; baseline: a fresh query's start to its first commit, each: "
             + ", ".join(f"{x * 1e3:.0f}" for x in sorted(starts))
             + f" ms; the restart strategy's delay is {RESTART_DELAY_S:g} s (a delay the user "
             "sets adds to it as it is)"]
    return {"figures": figures, "raw": got, "notes": notes}


if __name__ == "__main__":  # some runs alone, for profiling: python -m bench.recovery task-1 ...
    from bench.common import spark_session

    session = spark_session()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        for k, arg in enumerate(sys.argv[1:]):
            print(arg, _run_one(session, os.path.join(tmp, str(k)), arg), flush=True)
    session.stop()
