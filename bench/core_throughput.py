"""In-process throughput of send -> seal -> delivery for small events (target >= 500k events/s).

What one round measures, for N small events over P subtasks:
  send      the coordinator sends N events from its mailbox thread (encode, future, valve)
  seal      checkpoint: boundary, record encoding, durable write (local temp dir), commit
  delivery  the subtasks' side: decode the record and unpickle every event, in order

The baseline, measured in the same run, is the floor any design pays: pickle.dumps and
pickle.loads of the same events. Results: medians over rounds, and the ratio to the baseline.
Usage: python bench/core_throughput.py [--events N] [--parallelism P] [--rounds R] [--json F]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import tempfile
import time
from concurrent.futures import Future
from typing import Any

from sparkcoord import OperatorCoordinator
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import decode_checkpoint, encode_checkpoint
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import ManualClock, ManualMailboxes


class Burst(OperatorCoordinator):
    def burst(self, n: int) -> list[Future[None]]:
        """One ``send_event`` per event, round-robin over the subtasks."""
        gateways = [g for _, g in self.ready_gateways()]
        p = len(gateways)
        return [gateways[i % p].send_event(("split", i)) for i in range(n)]

    def burst_many(self, n: int) -> list[Future[None]]:
        """The same events, one ``send_events`` call per subtask (the batch API)."""
        gateways = [g for _, g in self.ready_gateways()]
        p = len(gateways)
        futures: list[Future[None]] = []
        for s, gateway in enumerate(gateways):
            futures += gateway.send_events([("split", i) for i in range(s, n, p)])
        return futures

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(checkpoint_id)


def one_round(service: CoordinationService, mailboxes: ManualMailboxes, epoch: int,
              n: int, p: int, batch_api: bool = False) -> dict[str, float]:
    holder = service.holders["bench"]
    futures: list[list[Future[None]]] = []
    coordinator = holder.coordinator
    assert isinstance(coordinator, Burst)
    send = coordinator.burst_many if batch_api else coordinator.burst
    t0 = time.perf_counter()
    holder.mailbox.execute(lambda: futures.append(send(n)))
    mailboxes.run_all()
    t1 = time.perf_counter()
    prepared = service.trigger_checkpoint(epoch)
    mailboxes.run_all()
    record = service.seal(prepared.result(timeout=0))
    service.batch_committed(epoch)
    mailboxes.run_all()
    t2 = time.perf_counter()
    data = encode_checkpoint(record)  # what a subtask reads: the stored record
    t3 = time.perf_counter()
    back = decode_checkpoint(data, "record")
    delivered = 0
    for s in range(p):
        for payload in back.events_for(SubtaskId("bench", s)):
            pickle.loads(payload)
            delivered += 1
    t4 = time.perf_counter()
    assert delivered == n and all(f.done() for f in futures[0])
    return {"send": t1 - t0, "seal": t2 - t1, "delivery": t4 - t3, "total": (t2 - t0) + (t4 - t3)}


def baseline(n: int) -> float:
    t0 = time.perf_counter()
    blobs = [pickle.dumps(("split", i), protocol=pickle.HIGHEST_PROTOCOL) for i in range(n)]
    for b in blobs:
        pickle.loads(b)
    return time.perf_counter() - t0


def run(preset: str) -> dict[str, Any]:
    """The benchmark runner's entry: figures for ``bench/run.py``."""
    from bench.common import figure

    n, p, rounds = 100_000, 8, (9 if preset == "quick" else 21)
    figures, notes, raw = [], [], {}
    for label, batch_api in (("send_event per event", False), ("send_events per subtask", True)):
        result = measure(n, p, rounds, batch_api)
        raw[label] = result
        events_per_s = result["events_per_s"]
        notes.append(f"- {label}: {n:,} events, P={p}, median of {rounds} rounds: send "
                     f"{result['median_s']['send'] * 1e3:.0f} ms, seal "
                     f"{result['median_s']['seal'] * 1e3:.0f} ms, delivery "
                     f"{result['median_s']['delivery'] * 1e3:.0f} ms; baseline pickle dumps+loads "
                     f"{result['baseline_pickle_roundtrip_s'] * 1e3:.0f} ms")
        figures.append(figure("core", f"send -> seal -> delivery ({label})", events_per_s,
                              "events/s", result["baseline_events_per_s"], ">= 500k events/s",
                              events_per_s >= 500_000))
    return {"figures": figures, "raw": raw, "notes": notes}


def measure(n: int, p: int, rounds: int, batch_api: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        mailboxes = ManualMailboxes()
        service = CoordinationService([CoordinatorSpec("bench", Burst, p)], CheckpointStorage(tmp),
                                      clock=ManualClock(), mailbox_factory=mailboxes)
        service.restore(FRESH)
        mailboxes.run_all()
        results, bases = [], []
        for epoch in range(rounds):
            bases.append(baseline(n))
            results.append(one_round(service, mailboxes, epoch, n, p, batch_api))
        service.close()
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    base = statistics.median(bases)
    return {
        "events": n, "parallelism": p, "rounds": rounds,
        "median_s": med, "baseline_pickle_roundtrip_s": base,
        "events_per_s": n / med["total"], "baseline_events_per_s": n / base,
        "ratio_to_baseline": med["total"] / base, "target_events_per_s": 500_000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--parallelism", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--batch-api", action="store_true", help="send with send_events per subtask")
    args = ap.parse_args()
    n, p = args.events, args.parallelism
    result = measure(n, p, args.rounds, args.batch_api)
    med, base = result["median_s"], result["baseline_pickle_roundtrip_s"]
    print(f"send->seal->delivery, {n} events, P={p}, median of {args.rounds} rounds")
    for k, v in med.items():
        print(f"  {k:<9} {v * 1e3:8.1f} ms  ({n / v / 1e3:8.0f}k events/s)")
    print(f"  baseline  {base * 1e3:8.1f} ms  ({n / base / 1e3:8.0f}k events/s) pickle dumps+loads")
    print(f"  throughput {result['events_per_s'] / 1e3:.0f}k events/s, "
          f"{result['ratio_to_baseline']:.2f}x the baseline time; target >= 500k events/s: "
          f"{'met' if result['events_per_s'] >= 500_000 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
