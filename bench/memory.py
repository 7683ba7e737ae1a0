"""Memory: the runner process's RSS over many epochs must stay flat.

The runner's code (CoordinatedStreamReader: coordination service, mailboxes, channel server,
checkpoint storage) is driven in this process by a loop that makes Spark's calls in Spark's
order (``latestOffset`` -> ``partitions`` -> every partition's ``read`` -> next
``latestOffset``, docs/protocol.md [spark-call-order-per-trigger]), with the subtasks running
in the same process over the real loopback channel; each subtask reports every event back, so
the inbound path (log, gate, futures, connections) is exercised every epoch. Without the JVM,
10k epochs take minutes instead of hours, and the RSS is this code's alone.

The baseline is the same loop over the plain source (sparkcoord.examples.plain). Figures: RSS
growth from 10% to 100% of the run, per 1k epochs, and the peak.
"""

from __future__ import annotations

import functools
import gc
import resource
import tempfile
import time
from typing import Any

from bench.common import figure


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def drive(reader: Any, epochs: int, samples: list[tuple[int, float]]) -> float:
    """Spark's call sequence for ``epochs`` batches; returns the seconds it took."""
    start = reader.initialOffset()
    every = max(1, epochs // 50)
    t0 = time.perf_counter()
    for batch in range(epochs):
        end = reader.latestOffset(start)
        for partition in reader.partitions(start, end):
            for _ in reader.read(partition):
                pass
        reader.commit(end)
        start = end
        if batch % every == 0 or batch == epochs - 1:
            gc.collect()
            samples.append((batch, rss_mb()))
    return time.perf_counter() - t0


def run(preset: str) -> dict[str, Any]:
    from sparkcoord.examples.plain import PlainReader
    from sparkcoord.examples.steady import SCHEMA, SteadyCoordinator, SteadyOperator
    from sparkcoord.spark.source import CoordinatedStreamReader
    from sparkcoord.spark.spec import OperatorSpec, SourceSpec

    epochs = 2_000 if preset == "quick" else 10_000
    parallelism, events = 4, 40
    results: dict[str, Any] = {}
    for name in ("plain", "coordinated"):
        samples: list[tuple[int, float]] = []
        with tempfile.TemporaryDirectory() as tmp:
            if name == "plain":
                reader: Any = PlainReader(parallelism, events // parallelism, carry=True)
            else:
                op = OperatorSpec("steady", functools.partial(SteadyCoordinator, events_per_epoch=events),
                                  functools.partial(SteadyOperator, report=True), parallelism)
                reader = CoordinatedStreamReader(SourceSpec("bench", f"{tmp}/coordination", [op],
                                                            SCHEMA, checkpoint_interval_s=0.0))
            try:
                elapsed = drive(reader, epochs, samples)
            finally:
                reader.stop()
        first = next(mb for b, mb in samples if b >= epochs // 10)
        last = samples[-1][1]
        results[name] = {"samples": samples, "seconds": elapsed, "growth_mb": last - first,
                         "peak_mb": max(mb for _, mb in samples), "ms_per_epoch": elapsed / epochs * 1e3}
    c, p = results["coordinated"], results["plain"]
    per_1k = c["growth_mb"] / (epochs * 0.9 / 1000)
    notes = [f"- {epochs:,} epochs, P={parallelism}, {events} events per epoch, each reported back: "
             f"coordinated RSS {c['samples'][0][1]:.0f} -> {c['samples'][-1][1]:.0f} MB "
             f"(peak {c['peak_mb']:.0f} MB), {c['ms_per_epoch']:.2f} ms per epoch in the runner's "
             f"code; plain {p['samples'][0][1]:.0f} -> {p['samples'][-1][1]:.0f} MB, "
             f"{p['ms_per_epoch']:.2f} ms per epoch"]
    return {"figures": [
        figure("memory", f"runner RSS growth over {epochs:,} epochs (10% -> 100%)", c["growth_mb"],
               "MB", None, "flat (< 0.5 MB per 1k epochs)", per_1k < 0.5,
               plain_growth_mb=p["growth_mb"], per_1k_epochs_mb=per_1k),
        figure("memory", "runner peak RSS", c["peak_mb"], "MB", p["peak_mb"]),
    ], "raw": results, "notes": notes}
