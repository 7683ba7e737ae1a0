"""Requests from Spark tasks: round trip, requests per second, and the skewed work queue.

Runs in a Spark session of its own (``local[8,4]``, started in a subprocess), because "P=8
requesting at once" needs eight task slots: the shared benchmark session has two.
- round trip: P=2 and P=8 tasks at once, each asking its coordinator one request at a time
  (logged, answered on the mailbox, the answer logged, then sent back); baseline, same tasks,
  same run: the raw channel round trip (one event sent and acknowledged, i.e. logged and on
  the mailbox);
- requests per second per job: P=8 tasks asking back to back, with fsync off (the default)
  and on, each against the raw channel's event round trips per second from the same tasks
  (the target, fsync off: at least that rate, a cost ratio <= 1.0);
  every task starts at one start line (a "ready" request the coordinator answers when all P
  asked), so the rate is not diluted by Spark starting tasks up to a second apart;
- the work queue (``sparkcoord.examples.workqueue``) on a skewed workload: P=4 subtasks pull
  items one at a time with ``request`` inside the batch, against the same items split
  statically at batch start (every item sent to subtask ``i % P`` as an event: today's only
  option). Batch time = the ``foreachBatch`` action that runs the batch's tasks. Skewed: the
  static share of subtask 0 holds 70% of the work (a hot partition). Also reported without a
  target: a random heavy-tailed workload, where the static shares are less uneven.

    python bench/run.py --only requests
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench.common import REPO, figure, stats


def run(preset: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.requests", preset], cwd=REPO,
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    if out.returncode != 0:
        raise RuntimeError(f"the requests benchmark failed:\n{out.stdout[-3000:]}\n"
                           f"{out.stderr[-3000:]}")
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    figures = []
    for p in (2, 8):
        rt, base = raw[f"rtt_{p}"], raw[f"event_rtt_{p}"]
        median_ok = rt["median"] * 1e3 <= 0.5 if p == 8 else None
        p99_ok = rt["p99"] * 1e3 <= 5 if p == 8 else None
        figures.append(figure("requests", f"request round trip P={p}, median", rt["median"] * 1e3,
                              "ms", base["median"] * 1e3, "<= 0.5 ms" if p == 8 else None,
                              median_ok))
        figures.append(figure("requests", f"request round trip P={p}, p99", rt["p99"] * 1e3, "ms",
                              base["p99"] * 1e3, "<= 5 ms" if p == 8 else None, p99_ok))
    for fsync in ("off", "on"):
        # the target is a ratio against the raw channel's event round trips per second from
        # the same tasks in the same run (issue 29 item 4): an absolute rate on a shared
        # 2-core machine swings from 14k to 25k/s between runs. A request costs at most what
        # an event round trip costs (cost ratio = baseline rate / our rate <= 1.0); the old
        # absolute target (20k/s) was set when the baseline ran at 20k/s
        rate, base = raw[f"rate_fsync_{fsync}"], raw[f"event_rate_fsync_{fsync}"]
        target = fsync == "off"
        figures.append(figure("requests", f"requests per second per job, P=8, fsync {fsync}",
                              rate, "requests/s", base,
                              "<= 1.0x (at least the raw event round trips/s)" if target
                              else None, base / rate <= 1.0 if target else None))
    skew = raw["skewed"]
    ratio = skew["dynamic"] / skew["static"]
    figures.append(figure("requests", "skewed work queue batch time, dynamic / static", ratio,
                          "ratio", None, "<= 0.6", ratio <= 0.6))
    heavy = raw["heavy_tailed"]
    figures.append(figure("requests", "heavy-tailed work queue batch time, dynamic / static",
                          heavy["dynamic"] / heavy["static"], "ratio"))
    notes = [
        f"- round trip, {raw['n_rtt']} requests per task: P=2 median "
        f"{raw['rtt_2']['median'] * 1e3:.3f} ms, p99 {raw['rtt_2']['p99'] * 1e3:.3f} ms; P=8 median "
        f"{raw['rtt_8']['median'] * 1e3:.3f} ms, p99 {raw['rtt_8']['p99'] * 1e3:.3f} ms (raw "
        f"channel round trip P=8: median {raw['event_rtt_8']['median'] * 1e3:.3f} ms, p99 "
        f"{raw['event_rtt_8']['p99'] * 1e3:.3f} ms)",
        f"- requests/s per job, 8 tasks back to back: fsync off {raw['rate_fsync_off']:,.0f}, "
        f"fsync on {raw['rate_fsync_on']:,.0f} (event round trips/s from the same tasks: "
        f"{raw['event_rate_fsync_off']:,.0f} / {raw['event_rate_fsync_on']:,.0f})",
        f"- skewed work queue (40 items, {skew['work_s']:.1f} s of work, P=4, hot share 70%): "
        f"dynamic {skew['dynamic']:.2f} s, static {skew['static']:.2f} s, ideal work/P "
        f"{skew['work_s'] / 4:.2f} s (medians of {skew['rounds']} rounds each)",
        f"- heavy-tailed work queue (Pareto costs): dynamic {heavy['dynamic']:.2f} s, static "
        f"{heavy['static']:.2f} s, ideal {heavy['work_s'] / 4:.2f} s",
    ]
    return {"figures": figures, "raw": raw, "notes": notes}


# ------------------------------------------------------------------- inside the subprocess
def _ask_task(address: tuple[str, int], secret: bytes, run: str, epoch: int, n: int,
              events: bool, parallelism: int, index: int) -> tuple[list[float], float, float]:
    import pickle
    import time

    from sparkcoord.channel.client import ChannelClient
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", index), epoch, 0))
    client.register()
    # a start line: Spark starts the P tasks (and their Python workers) up to a second apart;
    # timed from their own starts, the rate would measure that spread. The coordinator
    # answers "ready" when all P asked, so every task starts at once.
    client.request(pickle.dumps(("ready", parallelism)), 120.0)
    payload = pickle.dumps(("next", index))
    samples = []
    start = time.time()
    for _ in range(n):
        t0 = time.perf_counter()
        if events:
            client.send(payload)
            client.flush()
        else:
            client.request(payload, 30.0)
        samples.append(time.perf_counter() - t0)
    end = time.time()
    client.close()
    return samples, start, end


def _measure(sc: Any, fsync: bool, n: int) -> dict[str, Any]:
    import functools
    import tempfile
    from concurrent.futures import Future

    from sparkcoord import OperatorCoordinator
    from sparkcoord.channel.server import ChannelServer
    from sparkcoord.core.restore import FRESH
    from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
    from sparkcoord.runtime.storage import CheckpointStorage

    class Answers(OperatorCoordinator):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            self.count = 0
            self.ready: list[Future[Any]] = []

        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            if request[0] == "ready":  # the start line (_ask_task): answered when all are in
                ready: Future[Any] = Future()
                self.ready.append(ready)
                if len(self.ready) == request[1]:
                    for waiting in self.ready:
                        waiting.set_result(True)
                    self.ready = []
                return ready
            self.count += 1
            return self.count

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        service = CoordinationService([CoordinatorSpec("op", Answers, 8)],
                                      CheckpointStorage(tmp, fsync=fsync))
        service.restore(FRESH)
        service.checkpoint(0)
        secret = os.urandom(32)
        server = ChannelServer(service.inbox, secret).start()
        try:
            for p in (2, 8):
                for events in (False, True):
                    # a fresh epoch for every round: new task attempts, an empty log
                    service.batch_committed(service.last_sealed)
                    service.checkpoint(service.last_sealed + 1)
                    task = functools.partial(_ask_task, server.address, secret, service.run_id,
                                             service.last_sealed, n, events, p)
                    results = sc.parallelize(range(p), p).mapPartitionsWithIndex(
                        lambda i, _, task=task: [task(i)]).collect()
                    samples = [s for r in results for s in r[0]]
                    rate = len(samples) / (max(r[2] for r in results) - min(r[1] for r in results))
                    key = f"{'event_' if events else ''}rtt_{p}"
                    out[key] = stats(samples)
                    out[key.replace("rtt", "rate")] = rate
        finally:
            server.close()
            service.close()
    return out


def _queue_batch_time(spark: Any, dynamic: bool, costs: list[float]) -> float:
    import functools
    import tempfile
    import time

    from sparkcoord.examples.workqueue import (
        SCHEMA,
        QueueWorker,
        ShareWorker,
        StaticShares,
        WorkQueue,
    )
    from sparkcoord.spark import CoordinatedJob

    times: list[float] = []
    rows: list[int] = []

    def batch(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        n = len(df.collect())
        if n:
            times.append(time.perf_counter() - t0)
            rows.append(n)

    with tempfile.TemporaryDirectory() as tmp:
        job = CoordinatedJob(spark, os.path.join(tmp, "ckpt"))
        if dynamic:
            df = job.source(QueueWorker, functools.partial(WorkQueue, costs=costs), 4, SCHEMA)
        else:
            df = job.source(ShareWorker, functools.partial(StaticShares, costs=costs), 4, SCHEMA)
        writer = df.writeStream.foreachBatch(batch).trigger(processingTime="0 seconds")
        job.run(writer, until=lambda: sum(rows) >= len(costs), poll_s=0.1, timeout_s=300)
    assert len(times) == 1, f"expected all items in one batch, got batches of {rows}"
    return times[0]


def _queue(spark: Any, costs: list[float], rounds: int) -> dict[str, Any]:
    import statistics

    dynamic, static = [], []
    for _ in range(rounds):  # alternating, so a slow phase of the machine hits both
        dynamic.append(_queue_batch_time(spark, True, costs))
        static.append(_queue_batch_time(spark, False, costs))
    return {"dynamic": statistics.median(dynamic), "static": statistics.median(static),
            "work_s": sum(costs), "rounds": rounds, "dynamic_all": dynamic, "static_all": static}


def hot_share_costs(count: int, parallelism: int, total_s: float, hot: float) -> list[float]:
    """Item costs where the static share of subtask 0 (items ``i % parallelism == 0``) holds
    the fraction ``hot`` of ``total_s``; the other items share the rest equally."""
    hot_items = len(range(0, count, parallelism))
    cold_items = count - hot_items
    return [total_s * hot / hot_items if i % parallelism == 0
            else total_s * (1 - hot) / cold_items for i in range(count)]


def _inner(preset: str) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from sparkcoord.examples.workqueue import skewed_costs

    quick = preset == "quick"
    spark = (SparkSession.builder.master("local[8,4]").appName("sparkcoord-bench-requests")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")
    n = 3_000 if quick else 5_000  # per task: shorter runs measure warm-up and stragglers
    raw: dict[str, Any] = {"n_rtt": n}
    off = _measure(spark.sparkContext, False, n)
    raw.update(off)
    on = _measure(spark.sparkContext, True, n // 5)
    raw["rate_fsync_off"], raw["event_rate_fsync_off"] = off["rate_8"], off["event_rate_8"]
    raw["rate_fsync_on"], raw["event_rate_fsync_on"] = on["rate_8"], on["event_rate_8"]
    raw["rtt_8_fsync_on"] = on["rtt_8"]
    rounds = 3 if quick else 5
    raw["skewed"] = _queue(spark, hot_share_costs(40, 4, 2.0, 0.7), rounds)
    raw["heavy_tailed"] = _queue(spark, skewed_costs(40, 2.0, seed=3), rounds)
    spark.stop()
    return raw


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    result = _inner(sys.argv[1] if len(sys.argv) > 1 else "quick")
    print(json.dumps(result))
