"""A source of id ranges: the "writing your own source" example of docs/sources.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkcoord.sources import Split, SplitDiscovery, SplitReader


@dataclass(frozen=True)
class Range(Split):
    first: int = 0
    last: int = 0


class Ranges(SplitDiscovery):          # runs on the discovery thread: I/O is fine here
    def initial_state(self) -> int:
        return 0                       # next range to hand out: small, picklable

    def discover(self, state: Any) -> tuple[list[Split], int]:
        splits: list[Split] = [Range(f"r{i}", 0, i * 1000, i * 1000 + 999)
                               for i in range(state, state + 4)]
        return splits, state + 4


class RangeReader(SplitReader):        # in Spark tasks
    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, int]]:
        assert isinstance(split, Range)
        start = split.first if position is None else position
        for low in range(start, split.last + 1, 500):
            ids = pa.array(range(low, min(low + 500, split.last + 1)), pa.int64())
            yield pa.RecordBatch.from_arrays([ids], names=["id"]), low + 500
