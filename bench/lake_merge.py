"""Mode ``merge`` of the lake sink keeping up with a change stream (issue 43 finding 4).

A change stream at 1,000 changes/s (one epoch a second: 800 updates and 100 deletes of random
live keys, 100 inserts of new keys) merged into a table of 100,000 keys, Delta and Iceberg,
by the committers directly (no Spark): each epoch's staged change rows are reduced
(``changes.reduce_changes``) and merged (``DeltaCommitter.merge``, ``IcebergCommitter.merge``)
as the sink's commit worker does. The commit worker is simulated: epoch i arrives at i s,
its commit starts when it arrived and the one before it finished and takes its measured wall
time. Figures: the lag per epoch (its commit's end minus its arrival; target p99 <= 5 s) and
the catch-up after the arrivals stop (the last epoch's commit end minus its arrival; target
<= 2 batch intervals), after 3,600 epochs (the full preset: an hour-equivalent) or 300 (the
quick preset). The per-epoch commit times at epochs 10, 100 and 1,000 are reported too.

Baselines, in the same run, over fewer epochs (30, the full preset 100: pyiceberg's falls
behind without bound, 37 s per epoch by epoch 100, so a run of the full length would not
end): Iceberg, pyiceberg's own delete + upsert per epoch (what
``IcebergCommitter.merge`` did before: ``_merge_by_pyiceberg``); Delta, delta-rs's own
``merge`` (delete when matched by a delete, update when matched, insert when not).

    python bench/run.py --only lake_merge                  # quick: 300 epochs
    python bench/run.py --only lake_merge --preset full    # 3,600 epochs
    python -m bench.lake_merge 200                         # one short run, no report
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench.common import figure, stats

KEYS, CHANGES, INSERTS, DELETES = 100_000, 1_000, 100, 100
KINDS = ("delta", "iceberg")


def _schemas() -> tuple[Any, Any]:
    import pyarrow as pa

    row = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()),
                     pa.field("score", pa.float64()), pa.field("note", pa.string())])
    staged = pa.schema([pa.field("op", pa.string()), pa.field("lsn", pa.int64()),
                        pa.field("seq", pa.int32()), pa.field("table", pa.string()),
                        pa.field("key", pa.struct([pa.field("id", pa.int64())])),
                        pa.field("after", pa.struct(list(row))),
                        pa.field("unchanged", pa.list_(pa.string()))])
    return row, staged


def epochs(seed: int = 43) -> Iterator[Any]:
    """The staged change rows of epoch 0 (every key inserted), then of each 1,000-change
    epoch."""
    import pyarrow as pa

    _, staged = _schemas()
    rng = random.Random(seed)
    live = list(range(KEYS))
    where = {k: i for i, k in enumerate(live)}
    next_key, lsn, epoch = KEYS, 0, 0

    def table(ops: list[str], ids: list[int]) -> Any:
        nonlocal lsn
        after = [None if op == "d" else {"id": k, "name": f"n{k % 97}-{epoch}",
                                         "score": k / 3 + epoch, "note": "x" * (k % 40)}
                 for op, k in zip(ops, ids, strict=True)]
        n = len(ops)
        out = pa.table({"op": ops, "lsn": list(range(lsn, lsn + n)), "seq": [0] * n,
                        "table": ["public.t"] * n, "key": [{"id": k} for k in ids],
                        "after": after, "unchanged": [None] * n}, schema=staged)
        lsn += n
        return out

    yield table(["r"] * KEYS, list(live))
    while True:
        epoch += 1
        ops, ids = [], []
        for _ in range(CHANGES - INSERTS - DELETES):
            ops.append("u")
            ids.append(live[rng.randrange(len(live))])
        for _ in range(DELETES):
            i = rng.randrange(len(live))
            k = live[i]
            ops.append("d")
            ids.append(k)
            last = live.pop()  # swap-remove
            if i < len(live):
                live[i] = last
                where[last] = i
            where.pop(k, None)
        for _ in range(INSERTS):
            ops.append("c")
            ids.append(next_key)
            where[next_key] = len(live)
            live.append(next_key)
            next_key += 1
        yield table(ops, ids)


class _PyicebergMerge:
    """The baseline committer for Iceberg: pyiceberg's delete + upsert each epoch."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from sparkcoord.sinks.iceberg import IcebergCommitter

        class Old(IcebergCommitter):
            def merge(self, epoch: int, load: Any, keys: Any) -> Any:
                decision, table = self._decide(epoch)
                return self._merge_by_pyiceberg(epoch, table, load(), keys)

        return Old(*args, **kwargs)


class _DeltaRsMerge:
    """The baseline for Delta: delta-rs's own merge of the reduced rows each epoch."""

    def __init__(self, uri: str, schema: Any) -> None:
        self.uri, self.schema = uri, schema

    def open(self) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, self.schema.empty_table())

    def merge(self, epoch: int, load: Any, keys: Any) -> None:
        from deltalake import DeltaTable

        from sparkcoord.sinks.changes import OP_COLUMN, UNCHANGED_COLUMN

        rows = load().rows.drop_columns([UNCHANGED_COLUMN])
        (DeltaTable(self.uri).merge(rows, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(f"s.{OP_COLUMN} = 'd'")
         .when_matched_update({c: f"s.{c}" for c in self.schema.names},
                              f"s.{OP_COLUMN} <> 'd'")
         .when_not_matched_insert({c: f"s.{c}" for c in self.schema.names},
                                  f"s.{OP_COLUMN} <> 'd'")
         .execute())


def _committer(kind: str, side: str, root: str) -> Any:
    row, _ = _schemas()
    if kind == "delta":
        if side == "baseline":
            return _DeltaRsMerge(f"{root}/table", row)
        from sparkcoord.sinks.delta import DeltaCommitter

        return DeltaCommitter(f"{root}/table", "bench", row)
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db",
                         warehouse=f"file://{root}/warehouse")
    catalog.create_namespace_if_not_exists("lake")
    if side == "baseline":
        return _PyicebergMerge(catalog, "lake.t", "bench", row)
    from sparkcoord.sinks.iceberg import IcebergCommitter

    return IcebergCommitter(catalog, "lake.t", "bench", row)


def commit_times(kind: str, side: str, count: int) -> list[float]:
    """The wall time of each of ``count`` epochs' commits after the initial load (epoch 0),
    ``side`` ours or the baseline."""
    from sparkcoord.sinks.changes import reduce_changes

    root = tempfile.mkdtemp(prefix=f"bench-merge-{kind}-{side}-")
    try:
        committer = _committer(kind, side, root)
        committer.open()
        times = []
        for epoch, staged in enumerate(epochs()):
            if epoch > count:
                break
            started = time.perf_counter()
            committer.merge(epoch, lambda s=staged: reduce_changes(s, "t"), ["id"])
            if epoch:
                times.append(time.perf_counter() - started)
        return times
    finally:
        shutil.rmtree(root, ignore_errors=True)


def lag(times: list[float], interval: float = 1.0) -> dict[str, float]:
    """The simulated commit worker (module doc): per-epoch lag and the catch-up."""
    done, lags = 0.0, []
    for i, took in enumerate(times):
        arrived = i * interval
        done = max(done, arrived) + took
        lags.append(done - arrived)
    # the catch-up: from the last arrival (the writes stop) until its commit ended
    return {"p99": stats(lags)["p99"], "median": stats(lags)["median"],
            "catch_up_s": lags[-1] if lags else 0.0}


def _at(times: list[float], epoch: int) -> float | None:
    """The median commit time of the epochs around ``epoch`` (1-based; None: not reached)."""
    if len(times) < epoch:
        return None
    window = times[max(0, epoch - 3):epoch + 2]
    return sorted(window)[len(window) // 2]


def run(preset: str, spark: Any = None) -> dict[str, Any]:
    count = 3_600 if preset == "full" else 300
    base_count = 100 if preset == "full" else 30
    figures, notes, raw = [], [], {}
    for kind in KINDS:
        ours = commit_times(kind, "ours", count)
        base = commit_times(kind, "baseline", base_count)
        ol, bl = lag(ours), lag(base)
        raw[kind] = {"ours": ours, "baseline": base}
        base_name = "pyiceberg delete+upsert" if kind == "iceberg" else "delta-rs merge"
        figures.append(figure("lake_merge", f"{kind} merge lag p99 after {count} epochs of "
                              f"1,000 changes (baseline: {base_name}, {base_count} epochs)",
                              ol["p99"], "s", bl["p99"], "<= 5 s", ol["p99"] <= 5.0))
        figures.append(figure("lake_merge", f"{kind} merge catch-up after the arrivals stop "
                              f"(baseline: {base_name}, {base_count} epochs)",
                              ol["catch_up_s"], "s", bl["catch_up_s"],
                              "<= 2 batch intervals (2 s)", ol["catch_up_s"] <= 2.0))
        at = {e: (_at(ours, e), _at(base, e)) for e in (10, 100, 1_000)}
        notes.append(f"- {kind}: commit per epoch at epoch "
                     + ", ".join(f"{e:,}: {_ms(o)} (baseline {_ms(b)})"
                                 for e, (o, b) in at.items())
                     + f"; lag median {ol['median']:.2f} s p99 {ol['p99']:.2f} s, catch-up "
                     f"{ol['catch_up_s']:.2f} s over {count} epochs; baseline ({base_name}) "
                     f"lag p99 {bl['p99']:.1f} s, catch-up {bl['catch_up_s']:.1f} s after "
                     f"{base_count} epochs")
    return {"figures": figures, "notes": notes, "raw": raw}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    sides = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ours"]
    kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else list(KINDS)
    for k in kinds:
        for side in sides:
            t = commit_times(k, side, n)
            print(k, side, "at 10/100/1000:", [_ms(_at(t, e)) for e in (10, 100, 1000)],
                  "lag", {a: round(b, 2) for a, b in lag(t).items()}, flush=True)
