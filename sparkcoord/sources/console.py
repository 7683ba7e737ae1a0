"""What the sources' commands (``sparkcoord tail``, ``sparkcoord cdc``) share: a local Spark
session of their own that Ctrl-C stops, a live progress line, the rows read over a whole run,
and the loop that watches a running job.

Thread model: the command's main thread (the job runs on its handle's thread,
sparkcoord.spark.job.JobHandle).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def command_session(spark: Any, app: str) -> Iterator[tuple[Any, threading.Event]]:
    """``spark``, or a local[2,4] session of the command's own (stopped at the end) when None;
    and an event that Ctrl-C sets while an own session runs (the watch loop then stops the
    job). Called by a command's runner on the main thread."""
    own = spark is None
    stop = threading.Event()
    if own:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2,4]").appName(app)
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield spark, stop
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)
            spark.stop()


@contextmanager
def progress_line(console: Any) -> Iterator[Any]:
    """A live progress line on ``console`` (rich's ``Live``), ended by a newline whatever
    ``console`` writes to. On a terminal rich ends it itself; elsewhere (a pipe, a file, a
    ``StringIO``) rich prints the last state once, at the end, without a newline, so the
    next line written (the command's summary) would run into it. Main thread."""
    from rich.live import Live

    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            yield live
    finally:  # after Live printed its last state, also when the run raised
        if not console.is_terminal:
            console.line()


class RowCount:
    """The rows read over a whole run: Spark keeps the newest 100 progress reports, and a
    stream runs a batch every poll interval. A report is counted by (runId, batchId), the
    newest of each (an idle trigger reports the next batch id with 0 rows until that batch
    runs); a batch that left the newest reports is final and folded into a total. Used on the
    command's main thread."""

    def __init__(self) -> None:
        self._done = 0
        self._recent: dict[tuple[str, int], int] = {}

    def add(self, reports: Iterable[Any]) -> None:
        """Take the newest progress reports (``JobHandle.recentProgress``, oldest first).
        Called by :func:`watch` on the command's main thread at each poll."""
        now: dict[tuple[str, int], int] = {}
        for p in reports:
            now[(str(p.runId), int(p.batchId))] = int(p.numInputRows or 0)
        if not now:
            return  # nothing to go by (a query starting): keep what was counted
        for key, rows in list(self._recent.items()):
            if key not in now:
                self._done += rows  # out of the window of the newest reports: final
                del self._recent[key]
        self._recent.update(now)

    @property
    def rows(self) -> int:
        """The rows counted so far (the command's main thread)."""
        return self._done + sum(self._recent.values())


def watch(handle: Any, source: str, stop: threading.Event, console: Any,
          line: Callable[[int, dict[str, Any], int], str]) -> tuple[int, dict[str, Any]]:
    """Show ``line(rows, status, restarts)`` on a progress line until the job ends or ``stop``
    is set (then the job is stopped); the rows read and the last status the source's
    coordinator gave (``job.request(source, "status")``; it may lag the last batch). Blocks
    the command's main thread."""
    count = RowCount()
    status: dict[str, Any] = {}
    with progress_line(console) as live:
        while not handle.await_termination(0.25):
            if stop.is_set():
                handle.stop()
                break
            count.add(handle.recentProgress)
            try:
                status = handle.request(source, "status", timeout_s=5)
            except Exception:  # noqa: BLE001 - the query may be (re)starting
                pass
            live.update(line(count.rows, status, handle.restarts))
        count.add(handle.recentProgress)
        live.update(line(count.rows, status, handle.restarts))
    return count.rows, status
