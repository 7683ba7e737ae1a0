"""A big backlog: what a trigger writes and how long it plans while 100,000 files wait.

The file source's enumerator over a directory of N tiny files (``listing`` mode, so the seen
files are N entries too), in this process, with the real coordination service and checkpoint
storage on local disk (the same calls ``latestOffset`` makes: trigger the checkpoint, the
coordinator's snapshot, seal the record). Each trigger, two readers take ``maxFilesPerTrigger``
files (1,000) and report them finished, the batch commits, and the next trigger is timed, and
the bytes it wrote counted (the record and any new state part). The baseline, in the same run,
is the same enumerator state written as before decision 60: one pickle of every pending split
and seen file, written atomically (temp + rename) as each record was.
Targets (issue 25 item 3): <= 100 KB written and <= 5 ms of planning per trigger with 100,000
files pending.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import shutil
import tempfile
import time
from typing import Any

from bench.common import figure, stats


def _tiny_files(directory: str, count: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        with open(os.path.join(directory, f"f-{i:09d}.json"), "w") as f:
            f.write(f'{{"id": {i}}}\n')


def _written(root: str, seen: set[str]) -> int:
    """Bytes of files under ``root``'s records/ and parts/ not in ``seen`` (then added)."""
    total = 0
    for sub in ("records", "parts"):
        directory = os.path.join(root, sub)
        for name in os.listdir(directory) if os.path.isdir(directory) else ():
            path = os.path.join(directory, name)
            key = f"{path}:{os.stat(path).st_mtime_ns}"
            if key not in seen:
                seen.add(key)
                total += os.path.getsize(path)
    return total


def run(preset: str) -> dict[str, Any]:
    from sparkcoord.core.restore import FRESH
    from sparkcoord.sources import NextSplit, NoSplitNow, SplitEnumerator
    from sparkcoord.sources.files.discovery import FileDiscovery
    from sparkcoord.sources.files.options import FileSourceOptions
    from sparkcoord.sources.splits import ReadLimit
    from sparkcoord.testing import CoordinatorHarness, ManualWorkers

    n = 100_000
    triggers = 10 if preset == "quick" else 30
    per_trigger = 1_000
    tmp = tempfile.mkdtemp(prefix="bench-backlog-")
    try:
        data, root = os.path.join(tmp, "data"), os.path.join(tmp, "ckpt")
        _tiny_files(data, n)
        # packing off: one split per file, the most a backlog of N files can be (packed, the
        # same files are N / 32 splits)
        discovery = FileDiscovery(FileSourceOptions(url=data, format="json", packing=False,
                                                    max_files_per_discovery=10**9))
        enumerator = functools.partial(SplitEnumerator, discovery=discovery,
                                       limit=ReadLimit(max_units=per_trigger))
        h = CoordinatorHarness(enumerator, 2, name="files", storage_url=root,
                               workers=ManualWorkers(inline=True))
        t0 = time.perf_counter()
        h.start(FRESH)
        h.checkpoint()  # the listing joins the state: its chunks are written once here
        first_ms = (time.perf_counter() - t0) * 1e3
        seen: set[str] = set()
        first_bytes = _written(root, seen)
        ours_ms, ours_bytes, base_ms, base_bytes, pending = [], [], [], [], []
        reading: dict[int, tuple[str, ...]] = {0: (), 1: ()}
        for t in range(triggers):
            k = 0
            while True:  # the readers ask until the read limit ends the batch
                answer = h.request_from_subtask(k % 2, NextSplit(reading[k % 2]))
                reading[k % 2] = ()
                if isinstance(answer, NoSplitNow):
                    break
                reading[k % 2] = (answer.split_id,)
                k += 1
            h.commit()
            started = time.perf_counter()
            h.checkpoint()
            ours_ms.append((time.perf_counter() - started) * 1e3)
            ours_bytes.append(_written(root, seen))
            state = h.coordinator.state  # type: ignore[attr-defined]
            pending.append(len(h.coordinator._pending))  # type: ignore[attr-defined]
            # the baseline: this state as one pickle of lists and dicts, written atomically
            started = time.perf_counter()
            plain = dataclasses.replace(
                state, pending=[s for _, s in h.coordinator._pending],  # type: ignore[attr-defined]
                discovery=dataclasses.replace(state.discovery,
                                              recent={p: state.discovery.recent.get(p)
                                                      for p in state.discovery.recent}))
            blob = pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)
            h.storage.files.write_atomic(os.path.join(tmp, f"plain-{t}.ckpt"), blob)
            base_ms.append((time.perf_counter() - started) * 1e3)
            base_bytes.append(len(blob))
        h.service.close()
        ms, kb = stats(ours_ms)["median"], stats(ours_bytes)["median"] / 1e3
        b_ms, b_kb = stats(base_ms)["median"], stats(base_bytes)["median"] / 1e3
        figures = [
            figure("backlog", f"planning per trigger, {min(pending):,}-{max(pending):,} files "
                   f"pending, one split each (seal in-process)", ms, "ms", b_ms, "<= 5 ms",
                   ms <= 5.0),
            figure("backlog", f"written per trigger, {min(pending):,}-{max(pending):,} files "
                   "pending, one split each", kb, "KB", b_kb, "<= 100 KB",
                   max(ours_bytes) <= 100_000),
        ]
        notes = [f"- {n:,} tiny files, listing mode, one split per file, {per_trigger:,} files "
                 "per trigger, "
                 f"{triggers} triggers: planning median {ms:.2f} ms (max {max(ours_ms):.2f}), "
                 f"written median {kb:.1f} KB (max {max(ours_bytes) / 1e3:.1f} KB); before "
                 f"decision 60 the same state was {b_kb:,.0f} KB in {b_ms:.0f} ms; the listing's "
                 f"first trigger wrote {first_bytes / 1e6:.1f} MB once in {first_ms:.0f} ms "
                 f"(listing included)"]
        return {"figures": figures, "notes": notes,
                "raw": {"ours_ms": ours_ms, "ours_bytes": ours_bytes, "base_ms": base_ms,
                        "base_bytes": base_bytes, "pending": pending,
                        "first_bytes": first_bytes, "first_ms": first_ms}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
