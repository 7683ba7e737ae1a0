"""A lake-sink job run as its own process by the sink's driver-kill tests and the soak:
``python -m tests.spark.lake_kill_job <workdir> <delta|iceberg> [<failure> <seed> [compact]]``.

An ``availableNow`` run of a JSON-lines file source (2 files per batch) over
``<workdir>/data`` into a Delta table or an Iceberg table (pyiceberg's SQL catalog on sqlite
in ``<workdir>``) through :class:`~sparkcoord.sinks.LakeSink`, with 2 writing tasks and small
data files (several per task). SPARKCOORD_TEST_KILL may kill it at a kill point
(sparkcoord.runtime.kills: the lake points and ``mid-batch``); ``<failure>`` ``task`` fails
one sink task once after it wrote and reported its files (at a batch chosen by ``<seed>``);
``compact`` turns the sink's compaction on (its small files are swapped for larger ones).
With SPARKCOORD_TEST_HOLD (a path) each sink task waits, once the run is under way, until
that file exists (it writes ``<workdir>/markers/holding`` first): the soak keeps this driver
program running while a second one starts on the same checkpoint. LAKE_JOB_CHECKPOINT names
another checkpoint location than ``<workdir>/ckpt`` (the sink's ``jobId`` stays ``events``).
:func:`table_check` judges a work directory: the table against every file's ids, and the data
files left beside the table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import sys
from typing import Any

from sparkcoord.sinks.task import SinkSubtask

SCHEMA = "id long, name string"
ROWS = 200
TABLE = "lake.events"


def write_files(workdir: str, first_file: int, files: int) -> None:
    data = os.path.join(workdir, "data")
    os.makedirs(data, exist_ok=True)
    for f in range(first_file, first_file + files):
        path = os.path.join(data, f"part-{f:05d}.json")
        if os.path.exists(path):
            continue
        tmp = os.path.join(data, f".tmp-{f}")
        with open(tmp, "w") as out:
            for i in range(f * ROWS, (f + 1) * ROWS):
                out.write(json.dumps({"id": i, "name": f"n{i}"}) + "\n")
        os.rename(tmp, path)


def expected_ids(workdir: str) -> set[int]:
    data = os.path.join(workdir, "data")
    files = [int(n[5:10]) for n in os.listdir(data) if n.startswith("part-")]
    return {i for f in files for i in range(f * ROWS, (f + 1) * ROWS)}


def catalog_options(workdir: str) -> dict[str, str]:
    return {"catalog.uri": f"sqlite:///{workdir}/catalog.db",
            "catalog.warehouse": f"file://{workdir}/warehouse"}


def iceberg_table(workdir: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    options = catalog_options(workdir)
    catalog = SqlCatalog("default", uri=options["catalog.uri"],
                         warehouse=options["catalog.warehouse"])
    catalog.create_namespace_if_not_exists("lake")
    return catalog, TABLE


def table_location(workdir: str, kind: str) -> str:
    if kind == "delta":
        return os.path.join(workdir, "delta")
    catalog, name = iceberg_table(workdir)
    return str(catalog.load_table(name).location()).removeprefix("file://")


def table_data(workdir: str, kind: str) -> Any:
    """The table's rows (a ``pyarrow.Table``): deltalake / pyiceberg scans."""
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(table_location(workdir, kind)).to_pyarrow_table()
    catalog, name = iceberg_table(workdir)
    return catalog.load_table(name).scan().to_arrow()


def referenced(workdir: str, kind: str) -> set[str]:
    """The data files the table references, relative to its location."""
    from sparkcoord.sinks.target import SinkTarget

    location = table_location(workdir, kind)
    if kind == "delta":
        from sparkcoord.sinks.delta import DeltaCommitter

        return DeltaCommitter(location, "check", None).referenced_paths()
    options = catalog_options(workdir)
    target = SinkTarget("iceberg", TABLE, "check", None, location, catalog={
        "uri": options["catalog.uri"], "warehouse": options["catalog.warehouse"]})
    return set(target.committer().referenced_paths())


def current(workdir: str, kind: str) -> set[str]:
    """The data files of the table's current version, relative to its location."""
    import pyarrow as pa

    location = table_location(workdir, kind)
    if kind == "delta":
        from deltalake import DeltaTable

        adds = pa.table(DeltaTable(location).get_add_actions())
        return {str(p) for p in adds.column("path").to_pylist()}
    catalog, name = iceberg_table(workdir)
    prefix = location.rstrip("/") + "/"
    return {str(p).removeprefix("file://").removeprefix(prefix)
            for p in catalog.load_table(name).inspect.files().column("file_path").to_pylist()}


def data_files(workdir: str, kind: str) -> set[str]:
    """The files in the table's data directory, relative to its location."""
    directory = os.path.join(table_location(workdir, kind), "data")
    return {f"data/{n}" for n in os.listdir(directory)} if os.path.isdir(directory) else set()


def table_check(workdir: str, kind: str) -> dict[str, int]:
    """Rows lost, duplicated and unexpected (the table read back against the files' ids), and
    orphans: data files in the table's data directory that the table does not reference."""
    from collections import Counter

    ids = table_data(workdir, kind).column("id").to_pylist()
    held, present = referenced(workdir, kind), data_files(workdir, kind)
    expected = expected_ids(workdir)
    counts = Counter(ids)
    return {"rows": len(ids), "expected": len(expected), "lost": len(expected - set(counts)),
            "duplicated": sum(c - 1 for c in counts.values() if c > 1),
            "unexpected": len(set(counts) - expected),
            "orphans": len(present - held), "missing files": len(held - present),
            "swapped out": len(held - current(workdir, kind))}


class FailingSinkSubtask(SinkSubtask):
    """Fails once (a marker file), in the batch of epoch ``at`` or later, after it wrote and
    reported its files."""

    def __init__(self, target: Any, marker_dir: str, at: int) -> None:
        super().__init__(target)
        self.marker_dir, self.at = marker_dir, at

    def process(self) -> Any:
        from sparkcoord.examples.numbers import _once

        super().process()
        context = self._context
        assert context is not None
        if self._reported and context.epoch >= self.at and _once(self.marker_dir, "task"):
            raise RuntimeError(f"injected: sink task failed after reporting its files "
                               f"(epoch {context.epoch})")
        return None


class HoldingSinkSubtask(SinkSubtask):
    """Waits (up to 300 s) before it writes until the file ``hold`` exists, after writing
    the marker ``holding`` into ``marker_dir``."""

    def __init__(self, target: Any, marker_dir: str, hold: str) -> None:
        super().__init__(target)
        self.marker_dir, self.hold = marker_dir, hold

    def process(self) -> Any:
        import time

        if not os.path.exists(self.hold):
            os.makedirs(self.marker_dir, exist_ok=True)
            with open(os.path.join(self.marker_dir, "holding"), "w") as f:
                f.write(f"epoch {self._context.epoch if self._context else '?'}\n")
            deadline = time.monotonic() + 300
            while not os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.2)
        return super().process()


def run_job(spark: Any, workdir: str, kind: str, failure: str = "none", seed: int = 0,
            compaction: bool = False, checkpoint: str | None = None,
            hold: str | None = None) -> Any:
    """One availableNow run over what ``<workdir>/data`` holds (driver program thread), on
    ``checkpoint`` (default ``<workdir>/ckpt``), its sink tasks waiting for ``hold``."""
    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, checkpoint or os.path.join(workdir, "ckpt"))
    df = (FileStream(job).format("json").schema(SCHEMA)
          .options(maxFilesPerTrigger="2", parallelism="2").load(os.path.join(workdir, "data")))
    sink = LakeSink(job).format(kind).options(targetFileSize="8k", parallelism="2",
                                              jobId="events", compaction=compaction)
    if compaction:
        sink = sink.option("compactionMaxFiles", "2")  # a bin as soon as 2 small files are in
    if kind == "iceberg":
        iceberg_table(workdir)  # the namespace
        sink = sink.options(**catalog_options(workdir))
    table = os.path.join(workdir, "delta") if kind == "delta" else TABLE
    spec = sink.operator_spec(df, table)
    if failure == "task":
        at = random.Random(seed).randint(0, 3)
        spec = dataclasses.replace(spec, operator=functools.partial(
            FailingSinkSubtask, spec.operator.args[0], os.path.join(workdir, "markers"), at))
    elif failure != "none":
        raise ValueError(f"unknown failure {failure!r}")
    if hold is not None:
        spec = dataclasses.replace(spec, operator=functools.partial(
            HoldingSinkSubtask, spec.operator.args[0], os.path.join(workdir, "markers"), hold))
    writer = sink.writer_of(df, spec)
    return job.run(writer.trigger(availableNow=True), timeout_s=300)


def main() -> None:
    from bench.common import spark_session

    workdir, kind = sys.argv[1], sys.argv[2]
    failure = sys.argv[3] if len(sys.argv) > 3 else "none"
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    compaction = len(sys.argv) > 5 and sys.argv[5] == "compact"
    report = run_job(spark_session("sparkcoord-lake-kill-job"), workdir, kind, failure, seed,
                     compaction, os.environ.get("LAKE_JOB_CHECKPOINT"),
                     os.environ.get("SPARKCOORD_TEST_HOLD"))
    print("done", table_check(workdir, kind), report.restarts, report.failures)


if __name__ == "__main__":
    main()
