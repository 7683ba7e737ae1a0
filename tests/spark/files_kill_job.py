"""A file-source job run as its own process by the driver-kill tests and the soak:
``python -m tests.spark.files_kill_job <workdir> <waves> [<failure> <seed>]``.

A continuous JSON-lines file source (2 readers, at most 2 files per batch) tails
``<workdir>/data`` into an idempotent sink (one file per batch id). The driver program writes
the files itself, in waves of 3 files of ``ROWS`` rows with consecutive ids, each wave once the
sink holds the rows of the previous ones (a restarted job writes the waves still missing), and
stops when the sink holds every row of ``<waves>`` waves plus any wave already present (a
test may add one while the job is down: files arriving during the restart).

SPARKCOORD_TEST_KILL may kill it at a protocol point (sparkcoord.runtime.kills). ``<failure>``
injects one more failure, once per work directory (a marker file): ``task`` (a reader's task
raises in the middle of a split), ``fail_job`` (the enumerator fails the job while handing
out splits), both at a split chosen by ``<seed>``.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
from typing import Any

SCHEMA = "id long, wave int"
ROWS = 150
FILES_PER_WAVE = 3


def wave_files(data: str, wave: int) -> list[str]:
    return [os.path.join(data, f"w{wave:04d}-{f}.json") for f in range(FILES_PER_WAVE)]


def write_wave(data: str, wave: int) -> None:
    os.makedirs(data, exist_ok=True)
    for f, path in enumerate(wave_files(data, wave)):
        if os.path.exists(path):
            continue
        first = (wave * FILES_PER_WAVE + f) * ROWS
        tmp = os.path.join(data, f".tmp-{wave}-{f}")
        with open(tmp, "w") as out:
            for i in range(first, first + ROWS):
                out.write(json.dumps({"id": i, "wave": wave}) + "\n")
        os.rename(tmp, path)


def waves_present(data: str) -> list[int]:
    if not os.path.isdir(data):
        return []
    return sorted({int(name[1:5]) for name in os.listdir(data) if name.startswith("w")})


def sink_check(workdir: str) -> dict[str, int]:
    """Rows lost and duplicated: the sink against the ids of every file in the data directory."""
    from collections import Counter

    from sparkcoord.examples.sinks import read_batch_files

    data = os.path.join(workdir, "data")
    expected = {(w * FILES_PER_WAVE + f) * ROWS + i for w in waves_present(data)
                for f in range(FILES_PER_WAVE) for i in range(ROWS)}
    counts = Counter(r["id"] for rows in read_batch_files(os.path.join(workdir, "sink")).values()
                     for r in rows)
    return {"rows": sum(counts.values()), "expected": len(expected),
            "lost": len(expected - set(counts)),
            "duplicated": sum(c - 1 for c in counts.values() if c > 1),
            "unexpected": len(set(counts) - expected)}


def failing_reader(options: Any, schema_json: str, marker_dir: str, at: int,
                   needle: str | None = None, **kwargs: Any) -> Any:
    """A file reader whose task raises once, in the middle of the first split whose id
    contains ``needle`` (default: a file of wave ``at``); ``kwargs`` go to the reader (its
    ``alignment``)."""
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.files.reading import FileReader

    needle = f"w{at:04d}-" if needle is None else needle

    class Reader(FileReader):
        def read_split(self, split: Any, position: Any) -> Any:
            for n, item in enumerate(super().read_split(split, position)):
                yield item
                if n == 1 and needle in split.split_id and _once(marker_dir, "task"):
                    raise RuntimeError(f"injected task failure in the middle of {split.split_id}")

    reader = Reader(options, schema_json, **kwargs)
    return reader


def failing_enumerator(context: Any, marker_dir: str, at: int, **kwargs: Any) -> Any:
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.enumerator import SplitEnumerator

    class Enumerator(SplitEnumerator):
        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            if self.state.handed_out == at and _once(marker_dir, "fail_job"):
                self.context.fail_job(f"injected failure at split {at}")
            return super().handle_request(subtask, attempt, request)

    return Enumerator(context, **kwargs)


def main() -> None:
    workdir, waves = sys.argv[1], int(sys.argv[2])
    failure = sys.argv[3] if len(sys.argv) > 3 else "none"
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-files-kill-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    report = run_job(spark, workdir, waves, failure, seed)
    print("done", sink_check(workdir), report.restarts, report.failures)


def run_job(spark: Any, workdir: str, waves: int, failure: str = "none", seed: int = 0) -> Any:
    """Run the job until the sink holds every row (the driver program's thread); its report."""
    import dataclasses

    from sparkcoord.examples.sinks import BatchFileSink, read_batch_files
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    spark.dataSource.register(BatchFileSink)
    data, sink = os.path.join(workdir, "data"), os.path.join(workdir, "sink")
    markers = os.path.join(workdir, "markers")
    if not waves_present(data):
        write_wave(data, 0)
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
    spec, struct = (FileStream(job).format("json").schema(SCHEMA)
                    .options(discoveryInterval="100ms", maxFilesPerTrigger="2",
                             batchRows="50", parallelism="2")
                    .operator_spec(data))
    rng = random.Random(seed)
    if failure == "task":
        spec = dataclasses.replace(spec, operator=functools.partial(
            failing_reader, *spec.operator.args, marker_dir=markers, at=rng.randrange(waves)))
    elif failure == "fail_job":
        spec = dataclasses.replace(spec, coordinator=functools.partial(
            failing_enumerator, marker_dir=markers,
            at=rng.randrange(waves * FILES_PER_WAVE), **spec.coordinator.keywords))
    elif failure != "none":
        raise ValueError(f"unknown failure {failure!r}")
    df = job.sources([spec], struct, name="files")
    writer = (df.writeStream.format("sparkcoord-batchfiles").option("path", sink)
              .trigger(processingTime="0 seconds"))

    def rows_in_sink() -> int:
        return sum(len(rows) for rows in read_batch_files(sink).values())

    def target() -> int:
        return len(set(waves_present(data)) | set(range(waves))) * FILES_PER_WAVE * ROWS

    def next_wave() -> None:
        present = waves_present(data)
        missing = [w for w in range(waves) if w not in present]
        if missing and rows_in_sink() >= len(present) * FILES_PER_WAVE * ROWS:
            write_wave(data, missing[0])

    def until() -> bool:
        next_wave()
        return rows_in_sink() >= target()

    return job.run(writer, until=until, poll_s=0.2, timeout_s=300)


if __name__ == "__main__":
    main()
