"""Sealing: the time ``latestOffset`` spends to seal an epoch, as it does in the runner.

For P subtasks and E held events: trigger the checkpoint on the coordinator's mailbox thread,
wait for its future, write the record durably (local disk, temp + rename) and start the
epoch's inbound log; then commit it as the next ``latestOffset`` would. Measured with real
mailbox threads. The baseline, in the same run, is the floor of any durable seal: joining the
same E already-pickled events and writing them to a file atomically (temp + rename).

Also: the same P=8 / 1k-events seal after few and after many past epochs (must stay flat:
no growing listings, logs or maps).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from concurrent.futures import Future
from typing import Any

from bench.common import figure, stats
from sparkcoord import OperatorCoordinator
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage


class Holding(OperatorCoordinator):
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result({"epoch": checkpoint_id})

    def burst(self, events: int, done: Future[None]) -> None:
        gateways = [g for _, g in self.ready_gateways()]
        p = len(gateways)
        for k in range(events):
            gateways[k % p].send_event(("split", k))
        done.set_result(None)


class Bench:
    def __init__(self, directory: str, parallelism: int, fsync: bool = False) -> None:
        self.service = CoordinationService([CoordinatorSpec("op", Holding, parallelism)],
                                           CheckpointStorage(directory, fsync=fsync))
        self.service.restore(FRESH)
        self.epoch = 0

    def seal_once(self, events: int) -> float:
        holder = self.service.holders["op"]
        done: Future[None] = Future()

        def burst() -> None:  # on the mailbox: runs after the coordinator was created
            coordinator = holder.coordinator
            assert isinstance(coordinator, Holding)
            coordinator.burst(events, done)

        holder.mailbox.execute(burst)
        done.result(60)
        epoch = self.epoch
        t0 = time.perf_counter()
        record = self.service.checkpoint(epoch)
        elapsed = time.perf_counter() - t0
        assert record is not None and record.event_count() == events
        self.service.batch_committed(epoch)
        self.epoch += 1
        return elapsed

    def close(self) -> None:
        self.service.close()


def baseline_once(directory: str, events: int) -> float:
    # the floor of a durable seal: the already-pickled events (sends pickle them, as ours do)
    # joined and written to a file atomically
    blobs = [pickle.dumps(("split", k), protocol=pickle.HIGHEST_PROTOCOL) for k in range(events)]
    t0 = time.perf_counter()
    data = b"".join(blobs)
    tmp = os.path.join(directory, "baseline.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(directory, "baseline.ckpt"))
    return time.perf_counter() - t0


def run(preset: str) -> dict[str, Any]:
    quick = preset == "quick"
    sizes = [1_000, 10_000, 100_000]
    rounds = {1_000: 15, 10_000: 7, 100_000: 3} if quick else {1_000: 40, 10_000: 15, 100_000: 5}
    series: dict[str, list[dict[str, float]]] = {}
    figures = []
    notes = []
    for p in (1, 8, 64):
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            bench = Bench(tmp, p)
            try:
                for events in sizes:
                    bench.seal_once(events)  # warm-up
                    seal = stats([bench.seal_once(events) for _ in range(rounds[events])])
                    base = stats([baseline_once(tmp, events) for _ in range(rounds[events])])
                    rows.append({"events": events, "seal_ms": seal["median"] * 1e3,
                                 "seal_p90_ms": seal["p90"] * 1e3,
                                 "baseline_ms": base["median"] * 1e3})
            finally:
                bench.close()
        series[str(p)] = rows
        for row in rows:
            target = None
            met = None
            if p == 8 and row["events"] == 1_000:
                target, met = "<= 5 ms", row["seal_ms"] <= 5.0
            figures.append(figure("seal", f"seal P={p}, {row['events']:,} events", row["seal_ms"],
                                  "ms", row["baseline_ms"], target, met))
        per_event = [row["seal_ms"] / row["events"] * 1e3 for row in rows]
        notes.append(f"- P={p}: us per event at 1k / 10k / 100k events: "
                     + " / ".join(f"{v:.2f}" for v in per_event))
    # linearity: time per event at 100k vs at 10k (1.0 = linear; the 1k point carries fixed costs)
    for p, rows in series.items():
        r10, r100 = rows[1], rows[2]
        growth = (r100["seal_ms"] / r100["events"]) / (r10["seal_ms"] / r10["events"])
        figures.append(figure("seal", f"linearity P={p}: per-event time at 100k / at 10k", growth,
                              "x", None, "<= 1.5 (linear or better)", growth <= 1.5))
    figures.append(_past_epochs(quick, notes))
    return {"figures": figures, "series": series, "notes": notes}


def _past_epochs(quick: bool, notes: list[str]) -> dict[str, Any]:
    """Seal P=8/1k after ``many`` past epochs, against a fresh job sealing the same at the same
    time (the baseline: this machine's speed drifts over a long run, so the job with a long
    history is compared with one without, sample by sample, not with itself hours earlier)."""
    few, many = 1_000, 10_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(os.path.join(tmp, "long"), 8)
        try:
            t0 = time.perf_counter()
            while bench.epoch < few:
                bench.seal_once(0)
            early, early_fresh = _interleaved(bench, os.path.join(tmp, "fresh-early"))
            while bench.epoch < many:
                bench.seal_once(0)
            late, late_fresh = _interleaved(bench, os.path.join(tmp, "fresh-late"))
            files = sum(len(names) for _, _, names in os.walk(os.path.join(tmp, "long")))
            elapsed = time.perf_counter() - t0
        finally:
            bench.close()
    ratio = late["median"] / late_fresh["median"]
    notes.append(f"- past epochs: seal P=8/1k after {few:,} epochs {early['median'] * 1e3:.2f} ms "
                 f"(a fresh job at that time: {early_fresh['median'] * 1e3:.2f} ms), after {many:,} "
                 f"epochs {late['median'] * 1e3:.2f} ms (a fresh job at that time: "
                 f"{late_fresh['median'] * 1e3:.2f} ms); files in the long job's checkpoint "
                 f"directory at the end: {files}; {elapsed:.0f} s for the run")
    return figure("seal", f"seal P=8/1k after {many:,} past epochs vs a fresh job",
                  late["median"] * 1e3, "ms", late_fresh["median"] * 1e3, "flat (ratio <= 1.2)",
                  ratio <= 1.2, files_at_end=files, after_few_ms=early["median"] * 1e3,
                  after_few_fresh_ms=early_fresh["median"] * 1e3)


def _interleaved(bench: Bench, fresh_dir: str, samples: int = 40) -> tuple[dict[str, float], dict[str, float]]:
    fresh = Bench(fresh_dir, 8)
    try:
        for _ in range(20):
            fresh.seal_once(0)  # past its first epochs, like the long job
        old, new = [], []
        for _ in range(samples):
            old.append(bench.seal_once(1_000))
            new.append(fresh.seal_once(1_000))
    finally:
        fresh.close()
    return stats(old), stats(new)
