"""A small idempotent Python streaming sink: one JSON file per batch id, replaced atomically,
so that a batch replayed after a crash between the sink commit and Spark's commit log
overwrites itself instead of duplicating (the contract Spark asks of sinks)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from sparkcoord.runtime.kills import kill_point


@dataclass
class _Rows(WriterCommitMessage):
    rows: list[dict[str, Any]]


class BatchFileWriter(DataSourceStreamWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[Any]) -> _Rows:
        return _Rows([row.asDict() for row in iterator])

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = [r for m in messages if isinstance(m, _Rows) for r in m.rows]
        os.makedirs(self.path, exist_ok=True)
        final = os.path.join(self.path, f"{batchId}.json")
        tmp = f"{final}.tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        kill_point("sink-committed", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class BatchFileSink(DataSource):
    """``df.writeStream.format("sparkcoord-batchfiles").option("path", dir)``."""

    @classmethod
    def name(cls) -> str:
        return "sparkcoord-batchfiles"

    def streamWriter(self, schema: Any, overwrite: bool) -> BatchFileWriter:
        return BatchFileWriter(self.options["path"])


def read_batch_files(path: str) -> dict[int, list[dict[str, Any]]]:
    """Every committed batch's rows, by batch id."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not os.path.isdir(path):
        return out
    for name in os.listdir(path):
        if name.endswith(".json"):
            with open(os.path.join(path, name)) as f:
                out[int(name[:-5])] = json.load(f)
    return out
