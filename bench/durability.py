"""Durability: what ``fsync=True`` costs against the default ``fsync=False``, on local disk.

``fsync=False`` flushes every write to the operating system (an acknowledged event survives a
killed process); ``fsync=True`` also forces it to the disk before the acknowledgement or the
offset is handed out (it survives a machine crash). Measured in the same run, alternating:
  * an acknowledged inbound append: one run of 8 small events appended to the epoch's log, as
    the channel's critical section does before it acknowledges them;
  * a seal (P=8, 1k held events) as ``latestOffset`` does it: record + empty inbound log;
  * a completion: the log seal written when the batch commits.
The baseline of each figure is the same operation with ``fsync=False``.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from typing import Any

from bench.common import figure, stats
from bench.seal import Bench
from sparkcoord.core.entries import EventRunEntry
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.records import encode_log_entry
from sparkcoord.runtime.storage import CheckpointStorage


def _append_once(storage: CheckpointStorage, epoch: int, frame: bytes) -> float:
    t0 = time.perf_counter()
    storage.append_inbound(epoch, frame)
    return time.perf_counter() - t0


def _complete_once(storage: CheckpointStorage, epoch: int, frame: bytes) -> float:
    storage.start_inbound_log(epoch)
    storage.append_inbound(epoch, frame)
    t0 = time.perf_counter()
    storage.seal_inbound_log(epoch)
    return time.perf_counter() - t0


def run(preset: str) -> dict[str, Any]:
    quick = preset == "quick"
    appends, seals, completions = (200, 30, 60) if quick else (1000, 100, 200)
    attempt = TaskAttempt("bench", SubtaskId("op", 0), 0, 0)
    payloads = tuple(pickle.dumps(("split", k)) for k in range(8))
    frame = encode_log_entry(EventRunEntry(attempt, 0, payloads))
    samples: dict[str, dict[bool, list[float]]] = {k: {False: [], True: []}
                                                    for k in ("append", "seal", "complete")}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {f: CheckpointStorage(os.path.join(tmp, f"logs-{f}"), fsync=f) for f in (False, True)}
        for store in stores.values():
            store.start_inbound_log(0)
        for i in range(appends):
            for f in ((False, True) if i % 2 == 0 else (True, False)):
                samples["append"][f].append(_append_once(stores[f], 0, frame))
        for i in range(completions):
            for f in ((False, True) if i % 2 == 0 else (True, False)):
                samples["complete"][f].append(_complete_once(stores[f], 1 + i, frame))
        for s in stores.values():
            s.close()
        benches = {f: Bench(os.path.join(tmp, f"seal-{f}"), 8, fsync=f) for f in (False, True)}
        try:
            for b in benches.values():
                b.seal_once(1_000)  # warm-up
            for i in range(seals):
                for f in ((False, True) if i % 2 == 0 else (True, False)):
                    samples["seal"][f].append(benches[f].seal_once(1_000))
        finally:
            for b in benches.values():
                b.close()
    med = {k: {f: stats(v)["median"] for f, v in by.items()} for k, by in samples.items()}
    figures = [
        figure("durability", "acknowledged inbound append (a run of 8 events), fsync=True",
               med["append"][True] * 1e6, "us", med["append"][False] * 1e6),
        figure("durability", "seal P=8/1k events, fsync=True", med["seal"][True] * 1e3, "ms",
               med["seal"][False] * 1e3),
        figure("durability", "completion (inbound log seal), fsync=True",
               med["complete"][True] * 1e6, "us", med["complete"][False] * 1e6),
    ]
    notes = [f"- {k}: fsync=False {med[k][False] * 1e6:.0f} us, fsync=True {med[k][True] * 1e6:.0f} us"
             for k in ("append", "seal", "complete")]
    return {"figures": figures, "notes": notes}
