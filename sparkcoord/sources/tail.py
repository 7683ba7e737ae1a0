"""``sparkcoord tail``: read a directory of files into a parquet sink with the file source, with
a live progress line, until Ctrl-C (or, with ``--bounded``, until every file present at start
was read).

Thread model: the command's main thread builds and watches the job; the job runs on its
handle's thread (sparkcoord.spark.job.JobHandle).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def run_tail(path: str, fmt: str, out: str, checkpoint: str, *, schema: str | None = None,
             options: dict[str, str] | None = None, bounded: bool = False,
             spark: Any = None, console: Any = None) -> dict[str, Any]:
    """Tail ``path`` into parquet files under ``out`` (caller's thread). Returns the rows read,
    the restarts, and the source's last status. Starts a local[2,4] session unless given one."""
    from rich.console import Console

    from sparkcoord.sources.stream import FileStream
    from sparkcoord.spark.job import CoordinatedJob

    console = console or Console()
    own = spark is None
    if own:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-tail")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGINT) if own else None
    if own:
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        job = CoordinatedJob(spark, checkpoint)
        stream = FileStream(job).format(fmt).options(**(options or {}))
        if schema:
            stream = stream.schema(schema)
        if bounded:
            stream = stream.option("bounded", "true")
        df = stream.load(path, name="files")
        writer = df.writeStream.format("parquet").option("path", out)
        writer = writer.trigger(availableNow=True) if bounded else writer.trigger(
            processingTime="0 seconds")
        handle = job.start(writer)
        status: dict[str, Any] = {}
        rows = 0
        with progress_line(console) as live:
            while not handle.await_termination(0.25):
                if stop.is_set():
                    handle.stop()
                    break
                query = handle.query
                if query is not None:
                    rows = sum(p.numInputRows for p in query.recentProgress)
                try:
                    status = handle.request("files", "status", timeout_s=5)
                except Exception:  # noqa: BLE001 - the query may be (re)starting
                    pass
                live.update(_line(path, out, rows, status, handle.restarts))
            query = handle.query
            if query is not None:
                rows = sum(p.numInputRows for p in query.recentProgress)
            live.update(_line(path, out, rows, status, handle.restarts))
        # the status is the last one asked while the query ran (it may lag its last batch)
        return {"rows": rows, "restarts": handle.restarts, "last_status": status}
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)
            spark.stop()


@contextmanager
def progress_line(console: Any) -> Iterator[Any]:
    """A live progress line on ``console`` (rich's ``Live``), ended by a newline whatever
    ``console`` writes to. On a terminal rich ends it itself; elsewhere (a pipe, a file, a
    ``StringIO``) rich prints the last state once, at the end, without a newline, so the
    next line written (the command's summary) would run into it."""
    from rich.live import Live

    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            yield live
    finally:  # after Live printed its last state, also when the run raised
        if not console.is_terminal:
            console.line()


def _line(path: str, out: str, rows: int, status: dict[str, Any], restarts: int) -> str:
    files = (f"splits: {status.get('finished', 0)} read, {status.get('in_flight', 0)} reading, "
             f"{status.get('pending', 0)} waiting") if status else "splits: listing"
    return (f"{os.path.basename(path.rstrip('/')) or path} -> {out}: {rows:,} rows; {files}"
            + (f"; {restarts} restart(s)" if restarts else ""))
