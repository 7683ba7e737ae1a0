"""A plain (uncoordinated) Python streaming source, the baseline of the Spark benchmarks: each
batch has ``parallelism`` partitions of ``rows`` rows, like a coordinated source delivering
``rows`` events per subtask."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class _Part(InputPartition):
    def __init__(self, index: int, batch: int, rows: int) -> None:
        super().__init__(index)
        self.index, self.batch, self.rows = index, batch, rows


class PlainReader(DataSourceStreamReader):
    def __init__(self, parallelism: int, rows: int) -> None:
        self.parallelism, self.rows = parallelism, rows

    def initialOffset(self) -> dict[str, int]:
        return {"batch": -1}

    def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
        return {"batch": start["batch"] + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Part]:
        return [_Part(i, end["batch"], self.rows) for i in range(self.parallelism)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Part)
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
        return PlainReader(int(self.options.get("parallelism", 2)), int(self.options.get("rows", 0)))
