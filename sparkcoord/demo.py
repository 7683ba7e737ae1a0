"""The main job: two coordinators at different speeds feeding subtasks on local Spark, with an
injected global failure and an injected task failure; the verdict is computed from the sink.

Pipeline: one coordinated source with two operators, ``fast`` (many numbers, quickly) and
``slow`` (few numbers, slowly), each with 2 subtasks. Every subtask records the numbers it gets
in its state and emits them to a parquet sink. The ``fast`` coordinator calls ``fail_job`` once
(the query fails and the job runner restarts it from its checkpoint); subtask 0 of ``fast``
raises once inside a batch (Spark retries the task). At the end the sink is read back and each
subtask must hold exactly [0..N-1], in the order it received them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
from sparkcoord.runtime.restart import FixedDelay
from sparkcoord.spark.job import CoordinatedJob
from sparkcoord.spark.spec import OperatorSpec

PARALLELISM = 2


def _rows(spark: Any, path: str) -> list[Any]:
    if not os.path.exists(os.path.join(path, "_spark_metadata")):
        return []
    try:
        rows: list[Any] = spark.read.parquet(path).collect()
        return rows
    except Exception:  # noqa: BLE001 - no committed file yet
        return []


def _timeline(spark_checkpoint: str) -> list[tuple[int, int, bool]]:
    """(batch id, epoch, committed) from Spark's offset and commit logs."""
    out: list[tuple[int, int, bool]] = []
    offsets = os.path.join(spark_checkpoint, "offsets")
    commits = os.path.join(spark_checkpoint, "commits")
    if not os.path.isdir(offsets):
        return out
    for name in sorted((n for n in os.listdir(offsets) if n.isdigit()), key=int):
        with open(os.path.join(offsets, name)) as f:
            lines = f.read().splitlines()
        epoch = -1
        for line in lines[2:]:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("sparkcoord") == "demo":
                epoch = int(value["epoch"])
        out.append((int(name), epoch, os.path.exists(os.path.join(commits, name))))
    return out


#: The file that marks a directory the demo created (and may therefore wipe).
DEMO_MARKER = ".sparkcoord-demo"


class WorkDirNotOurs(Exception):
    """The demo's work directory holds files the demo did not put there."""


def prepare_workdir(workdir: str, force: bool = False) -> None:
    """Empty ``workdir`` for a demo run and mark it as the demo's.

    Called by :func:`run_demo` (the user's driver program thread) before Spark starts. A
    directory that is not empty and was not created by the demo (no marker) is refused unless
    ``force``: the demo must never delete someone's data because of a mistyped ``--dir``.
    """
    if os.path.isdir(workdir) and os.listdir(workdir) and not force \
            and not os.path.exists(os.path.join(workdir, DEMO_MARKER)):
        raise WorkDirNotOurs(
            f"{workdir} is not empty and was not created by the demo; the demo wipes its work "
            f"directory, so it refuses this one. Pick another --dir, or pass --force to wipe it")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise WorkDirNotOurs(f"{workdir} exists and is not a directory")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    with open(os.path.join(workdir, DEMO_MARKER), "w") as f:
        f.write("created by `sparkcoord demo`; the demo may wipe this directory\n")


#: Spark's own log (the JVM's log4j) of a demo that started Spark, in its work directory
SPARK_LOG = "spark.log"

_LOG4J = """\
# written by `sparkcoord demo`: Spark's own log goes to a file, at Spark's console level
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def spark_log_settings(workdir: str) -> dict[str, str]:
    """Settings for a session the demo starts (before its JVM starts; driver program thread):
    Spark's own log goes to ``<workdir>/spark.log`` instead of the console.

    The demo injects a task failure, and Spark logs every failed task attempt with its
    Python traceback and JVM stack, several times over; on the console that buries the
    demo's own report. Nothing is hidden: the file keeps all of it at Spark's console level
    (WARN), the demo names it and counts its ERROR lines at the end, and sparkcoord's own
    lines (a job failure, a restart) stay on the console."""
    log = os.path.join(workdir, SPARK_LOG)
    config = os.path.join(workdir, "log4j2.properties")
    with open(config, "w") as f:
        f.write(_LOG4J.format(log=log))
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{config}"}


def demo_session(workdir: str, app_name: str) -> Any:
    """The local[2,4] session a demo starts (its driver program's main thread), Spark's own log
    in ``<workdir>/spark.log`` (:func:`spark_log_settings`)."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2,4]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in spark_log_settings(workdir).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _spark_log_summary(console: Console, workdir: str, ok: bool) -> None:
    path = os.path.join(workdir, SPARK_LOG)
    if not os.path.exists(path):
        return  # the session was not the demo's: its log went where its owner said
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    errors = [ln for ln in lines if " ERROR " in ln[:40]]
    warnings = sum(" WARN " in ln[:40] for ln in lines)
    console.print(f"Spark's own log: {path} ({len(errors)} ERROR and {warnings} WARN lines"
                  + ("; Spark logs the injected task failures and the batch the job failure "
                     "stopped there)" if ok else ")"))
    if not ok:
        for line in errors[-10:]:
            console.print(f"  {line[:200]}", markup=False, highlight=False)


def run_demo(workdir: str, fast_total: int = 200, slow_total: int = 10,
             console: Console | None = None, spark: Any = None, force: bool = False,
             prepared: bool = False) -> bool:
    """Run the demo in ``workdir`` (wiped first unless ``prepared``: see
    :func:`prepare_workdir`). Returns whether the verdict is exactly-once. Called by the CLI
    (or a test) on the driver program's main thread; starts local Spark unless ``spark`` is
    given (whose logging it leaves alone)."""
    console = console or Console()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not prepared:
        prepare_workdir(workdir, force)
    out, markers = os.path.join(workdir, "out"), os.path.join(workdir, "markers")
    console.print(f"[bold]sparkcoord demo[/] in {workdir}: starting local Spark (local[2,4]) ...")
    owned = spark is None
    if spark is None:
        spark = demo_session(workdir, "sparkcoord-demo")
    ok = False
    try:
        # sparkcoord's ERROR lines stay on the console; its WARNING lines about restarts are
        # what the demo reports itself (on_failure below)
        job = CoordinatedJob(spark, os.path.join(workdir, "checkpoint"), log_level="ERROR")
        totals = {"fast": fast_total, "slow": slow_total}
        operators = [
            OperatorSpec("fast", functools.partial(
                NumbersCoordinator, total=fast_total, per_tick=5, interval_s=0.05,
                fail_job_at=fast_total * 3 // 5, marker_dir=markers),
                functools.partial(NumberCollector, fail_task_at=fast_total // 3, marker_dir=markers),
                PARALLELISM),
            OperatorSpec("slow", functools.partial(
                NumbersCoordinator, total=slow_total, per_tick=1, interval_s=0.4),
                NumberCollector, PARALLELISM),
        ]
        df = job.sources(operators, SCHEMA, name="demo")
        writer = (df.writeStream.format("parquet").option("path", out)
                  .trigger(processingTime="0 seconds"))
        expected = PARALLELISM * (fast_total + slow_total)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            bars = {(op, s): progress.add_task(f"{op}[{s}]", total=totals[op])
                    for op in totals for s in range(PARALLELISM)}
            restarts = progress.add_task("query restarts", total=None)
            last_poll = [0.0]

            def done() -> bool:
                if time.monotonic() - last_poll[0] < 1.0:
                    return False
                last_poll[0] = time.monotonic()
                rows = _rows(spark, out)
                counts: dict[tuple[str, int], int] = {}
                for r in rows:
                    counts[(r.operator, r.subtask)] = counts.get((r.operator, r.subtask), 0) + 1
                for key, bar in bars.items():
                    progress.update(bar, completed=counts.get(key, 0))
                return len(rows) >= expected

            def failed(cause: str) -> None:
                progress.update(restarts, advance=1)
                first = next((ln for ln in cause.splitlines() if "fail_job" in ln), cause.splitlines()[0])
                progress.console.print(f"[yellow]query failed, restarting:[/] {first.strip()[:160]}")

            report = job.run(writer, restart=FixedDelay(attempts=3, delay_s=1.0), until=done,
                             poll_s=0.25, timeout_s=900, on_failure=failed)
        rows = _rows(spark, out)
        ok = _verdict(console, rows, totals, report, job, markers)
        return ok
    finally:
        _spark_log_summary(console, workdir, ok)
        if owned:
            spark.stop()


def _verdict(console: Console, rows: list[Any], totals: dict[str, int], report: Any,
             job: CoordinatedJob, markers: str) -> bool:
    by_subtask: dict[tuple[str, int], list[Any]] = {}
    for r in rows:
        by_subtask.setdefault((r.operator, r.subtask), []).append(r)
    table = Table(title="exactly-once verdict (from the parquet sink)")
    for col in ("subtask", "rows", "expected", "lost", "duplicated", "out of order", "verdict"):
        table.add_column(col)
    ok = True
    for op, total in totals.items():
        for s in range(PARALLELISM):
            got = sorted(by_subtask.get((op, s), []), key=lambda r: (r.position, r.epoch))
            values = [r.value for r in got]
            lost = sorted(set(range(total)) - set(values))
            dups = len(values) - len(set(values))
            disorder = sum(1 for r in got if r.value != r.position)
            good = values == list(range(total))
            ok &= good
            table.add_row(f"{op}[{s}]", str(len(values)), f"[0..{total - 1}]", str(len(lost)),
                          str(dups), str(disorder), "[green]exactly [0..N-1][/]" if good else "[red]WRONG[/]")
    console.print(table)
    timeline = _timeline(job.spark_checkpoint)
    epochs_rows: dict[int, int] = {}
    for r in rows:
        epochs_rows[r.epoch] = epochs_rows.get(r.epoch, 0) + 1
    console.print("[bold]checkpoint timeline[/] (Spark batch -> sparkcoord epoch, events delivered):")
    line = "  ".join(f"b{b}->e{e}:{epochs_rows.get(e, 0)}{'' if c else '(uncommitted)'}"
                     for b, e, c in timeline)
    console.print("  " + line)
    injected = sorted(os.listdir(markers)) if os.path.isdir(markers) else []
    console.print(f"injected failures: {', '.join(injected) or 'none'}; query restarts: "
                  f"{report.restarts}; batches: {len(timeline)}")
    console.print("[bold green]VERDICT: exactly-once[/]" if ok else "[bold red]VERDICT: NOT exactly-once[/]")
    return ok
