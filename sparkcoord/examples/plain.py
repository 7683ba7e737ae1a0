"""A plain (uncoordinated) Python streaming source, the baseline of the Spark benchmarks: each
batch has ``parallelism`` partitions of ``rows`` rows, like a coordinated source delivering
``rows`` events per subtask. With option ``carry=true`` each partition carries its rows as
pickled values that ``read`` unpickles, as a coordinated partition carries its events."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class _Part(InputPartition):
    def __init__(self, index: int, batch: int, rows: int, carried: list[bytes] | None) -> None:
        super().__init__(index)
        self.index, self.batch, self.rows, self.carried = index, batch, rows, carried


class PlainReader(DataSourceStreamReader):
    def __init__(self, parallelism: int, rows: int, carry: bool = False) -> None:
        self.parallelism, self.rows, self.carry = parallelism, rows, carry

    def initialOffset(self) -> dict[str, int]:
        return {"batch": -1}

    def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
        return {"batch": start["batch"] + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Part]:
        return [_Part(i, end["batch"], self.rows,
                      [pickle.dumps(k, protocol=pickle.HIGHEST_PROTOCOL) for k in range(self.rows)]
                      if self.carry else None)
                for i in range(self.parallelism)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Part)
        if partition.carried is not None:
            for blob in partition.carried:
                k = pickle.loads(blob)
                yield ("plain", partition.index, k, k, partition.batch)
            return
        for k in range(partition.rows):
            yield ("plain", partition.index, k, k, partition.batch)

    def commit(self, end: dict[str, int]) -> None:
        pass


class PlainSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sparkcoord-plain"

    def schema(self) -> str:
        return "operator string, subtask int, value int, position int, epoch int"

    def streamReader(self, schema: Any) -> PlainReader:
        return PlainReader(int(self.options.get("parallelism", 2)), int(self.options.get("rows", 0)),
                           self.options.get("carry", "false").lower() == "true")
