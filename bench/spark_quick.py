"""Quick measurements of the Spark runtime (the benchmark issue makes them rigorous).

1. seal: what ``latestOffset`` does to seal an epoch (trigger on the coordinator's mailbox
   thread, boundary, record written to local disk), P=8 subtasks, 1k events held; median.
2. channel: round trip of one event from inside a Spark task to the coordination service on
   loopback (register once, then send + wait for the acknowledgement, one at a time).
3. per batch: median ``triggerExecution`` of the coordinated source vs a plain Python
   streaming source with the same partitions and rows (noop sink), measured in this run.

Usage: python bench/spark_quick.py [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from sparkcoord import OperatorCoordinator  # noqa: E402
from sparkcoord.core.ids import SubtaskId, TaskAttempt  # noqa: E402
from sparkcoord.core.restore import FRESH  # noqa: E402
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec  # noqa: E402
from sparkcoord.runtime.storage import CheckpointStorage  # noqa: E402


class Holding(OperatorCoordinator):
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result({"n": checkpoint_id})


def _burst(holder: Any, events: int, parallelism: int, done: Future[None]) -> None:
    gws = holder.coordinator.ready_gateways()
    for i in range(events):
        gws[i % parallelism][1].send_event(("e", i))
    done.set_result(None)


def measure_seal(parallelism: int = 8, events: int = 1000, rounds: int = 30) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        service = CoordinationService([CoordinatorSpec("op", Holding, parallelism)],
                                      CheckpointStorage(tmp))
        service.restore(FRESH)
        times = []
        try:
            for epoch in range(rounds):
                holder = service.holders["op"]
                done: Future[None] = Future()
                holder.mailbox.execute(functools.partial(_burst, holder, events, parallelism, done))
                done.result(10)
                t0 = time.perf_counter()
                record = service.checkpoint(epoch)
                times.append(time.perf_counter() - t0)
                assert record is not None and record.event_count() == events
                service.batch_committed(epoch)
        finally:
            service.close()
    return {"median_ms": statistics.median(times) * 1e3, "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3,
            "parallelism": parallelism, "events": events}


def _rtt_task(address: tuple[str, int], secret: bytes, run: str, n: int, index: int) -> list[float]:
    from sparkcoord.channel.client import ChannelClient

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", index), 0, 0))
    client.register()
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        client.send(pickle.dumps(i))
        client.flush()
        out.append(time.perf_counter() - t0)
    client.close()
    return out


def measure_channel(spark: Any, n: int = 2000) -> dict[str, float]:
    from sparkcoord.channel.server import ChannelServer

    with tempfile.TemporaryDirectory() as tmp:
        service = CoordinationService([CoordinatorSpec("op", OperatorCoordinator, 2)],
                                      CheckpointStorage(tmp))
        service.restore(FRESH)
        service.checkpoint(0)
        secret = os.urandom(32)
        server = ChannelServer(service, secret).start()
        address, run = server.address, service.run_id
        try:
            task = functools.partial(_rtt_task, address, secret, run, n)
            samples = spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(
                lambda i, _: task(i)).collect()
            burst = functools.partial(_throughput, address, secret, run, 20000)
            t0 = time.perf_counter()
            spark.sparkContext.parallelize(range(1), 1).mapPartitionsWithIndex(
                lambda i, _: [burst()]).collect()
            elapsed = time.perf_counter() - t0
        finally:
            server.close()
            service.close()
    samples.sort()
    return {"median_ms": statistics.median(samples) * 1e3,
            "p99_ms": samples[int(0.99 * len(samples))] * 1e3, "samples": len(samples),
            "pipelined_events_per_s_incl_task_start": 20000 / elapsed}


def _throughput(address: tuple[str, int], secret: bytes, run: str, n: int) -> int:
    from sparkcoord.channel.client import ChannelClient

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", 1), 0, 0))
    client.register()
    payload = pickle.dumps(("e", 0))
    for _ in range(n):
        client.send(payload)
    client.flush()
    client.close()
    return n


def measure_batches(spark: Any, parallelism: int = 8, events: int = 1000,
                    batches: int = 20, report: bool = True) -> dict[str, float]:
    from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
    from sparkcoord.examples.plain import PlainSource
    from sparkcoord.spark import CoordinatedJob

    spark.dataSource.register(PlainSource)
    per_subtask = events // parallelism

    def durations(query: Any) -> list[float]:
        return [p["durationMs"]["triggerExecution"] for p in query.recentProgress
                if p["numInputRows"] > 0]

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        plain = (spark.readStream.format("sparkcoord-plain").option("parallelism", parallelism)
                 .option("rows", per_subtask).load().writeStream.format("noop")
                 .option("checkpointLocation", f"{tmp}/plain").start())
        while len(durations(plain)) < batches + 2:
            time.sleep(0.5)
        plain.stop()
        job = CoordinatedJob(spark, f"{tmp}/coord")
        coordinator = functools.partial(NumbersCoordinator, total=10**9, per_tick=per_subtask,
                                        interval_s=0.2)
        operator = functools.partial(NumberCollector, report=report)
        df = job.source(operator, coordinator, parallelism, SCHEMA, name="bench")
        coord = (df.writeStream.format("noop")
                 .option("checkpointLocation", job.spark_checkpoint).start())
        while len(durations(coord)) < batches + 2:
            time.sleep(0.5)
        coord.stop()
    p, c = durations(plain)[2:], durations(coord)[2:]
    return {"plain_median_ms": statistics.median(p), "coordinated_median_ms": statistics.median(c),
            "ratio": statistics.median(c) / statistics.median(p), "parallelism": parallelism,
            "events_per_epoch_about": events, "subtasks_report_each_event": report}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    from pyspark.sql import SparkSession

    results: dict[str, Any] = {"seal": measure_seal()}
    print("seal (latestOffset's work), P=8, 1k events:", results["seal"])
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results["channel"] = measure_channel(spark)
    print("channel round trip from a Spark task:", results["channel"])
    results["batch"] = measure_batches(spark)
    print("per batch, coordinated vs plain source:", results["batch"])
    results["batch_no_reports"] = measure_batches(spark, report=False)
    print("per batch, subtasks send nothing back:", results["batch_no_reports"])
    spark.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
