"""``sparkcoord tail``: read a directory of files into a parquet sink with the file source, with
a live progress line, until Ctrl-C (or, with ``--bounded``, until every file present at start
was read).

Thread model: the command's main thread builds and watches the job; the job runs on its
handle's thread (sparkcoord.spark.job.JobHandle).
"""

from __future__ import annotations

import os
from typing import Any


def run_tail(path: str, fmt: str, out: str, checkpoint: str, *, schema: str | None = None,
             options: dict[str, str] | None = None, bounded: bool = False,
             spark: Any = None, console: Any = None) -> dict[str, Any]:
    """Tail ``path`` into parquet files under ``out`` (caller's thread). Returns the rows read,
    the restarts, and the source's last status. Starts a local[2,4] session unless given one."""
    from rich.console import Console

    from sparkcoord.sources.console import command_session, watch
    from sparkcoord.sources.files.stream import FileStream
    from sparkcoord.spark.job import CoordinatedJob

    console = console or Console()
    with command_session(spark, "sparkcoord-tail") as (spark, stop):
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
        rows, status = watch(handle, "files", stop, console,
                             lambda rows, status, restarts: _line(path, out, rows, status,
                                                                  restarts))
        return {"rows": rows, "restarts": handle.restarts, "last_status": status}


def _line(path: str, out: str, rows: int, status: dict[str, Any], restarts: int) -> str:
    files = (f"splits: {status.get('finished', 0)} read, {status.get('in_flight', 0)} reading, "
             f"{status.get('pending', 0)} waiting") if status else "splits: listing"
    return (f"{os.path.basename(path.rstrip('/')) or path} -> {out}: {rows:,} rows; {files}"
            + (f"; {restarts} restart(s)" if restarts else ""))
