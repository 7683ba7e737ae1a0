"""The split reader: the subtask side of a source, pulling splits inside the running batch.

Rules:
  1. A reader first resumes the splits its state holds (unfinished ones, with positions), then
     asks the enumerator for more with :class:`NextSplit` until the answer is
     :class:`NoSplitNow`. The finished splits travel with the next request, so the enumerator
     learns of them in the log, in order.
  2. Output is ``pyarrow.RecordBatch`` objects with exactly the source's Arrow schema (Spark
     takes them without converting rows).
  3. A reader that stops in the middle of a split (its own ``max_rows_per_batch``) keeps the
     split and its position in its state and asks for another batch; its next batch resumes
     there. The state is stored with the epoch, so a task retry or a restore reads from the
     same position again: the batch's output is the same, exactly once.
"""

from __future__ import annotations

import abc
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.sources.splits import NextSplit, NoSplitNow, Split
from sparkcoord.spark.operator import SubtaskContext, SubtaskOperator


@dataclass
class ReaderState:
    """A reader's checkpointed state: splits it has not finished, with their positions, and
    finished splits it has not reported yet (reported with its next request)."""

    unfinished: list[tuple[Split, Any]] = field(default_factory=list)
    unreported: list[str] = field(default_factory=list)


class SplitReader(SubtaskOperator):
    """Base class of a reader. Implement :meth:`read_split`.

    Thread model: one instance per subtask per batch, used from the Spark task's thread only.
    """

    #: stop reading in a batch after this many rows (``None``: read every split to its end)
    max_rows_per_batch: int | None = None
    #: record batches smaller than this are joined before they go to Spark
    coalesce_rows: int = 1 << 16

    def open(self, context: SubtaskContext, state: Any) -> None:
        super().open(context, state)
        if state is not None and not isinstance(state, ReaderState):
            raise TypeError(f"reader {context.operator_id}[{context.subtask}]: restored state is "
                            f"a {type(state).__name__}, not a ReaderState")
        self.state = state if state is not None else ReaderState()
        self.rows = 0

    @abc.abstractmethod
    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        """Read ``split`` from ``position`` (``None``: its start). Task thread.

        Yields ``(record_batch, position_after_it)``; the position must let a later call
        continue right after that batch. Deterministic: the same split and position give the
        same batches.
        """

    def process(self) -> Iterator[Any]:
        # small batches (many small files) are joined: Spark pays per record batch, not per row
        pending: list[Any] = []
        rows = 0
        for batch in self._produce():
            pending.append(batch)
            rows += batch.num_rows
            if rows >= self.coalesce_rows:
                yield _joined(pending)
                pending, rows = [], 0
        if pending:
            yield _joined(pending)

    def _produce(self) -> Iterator[Any]:
        unfinished = list(self.state.unfinished)
        self.state.unfinished = []
        for index, (split, position) in enumerate(unfinished):
            if not (yield from self._read(split, position)):
                self.state.unfinished.extend(unfinished[index + 1:])
                return
        while True:
            answer = self.context.request(NextSplit(tuple(self.state.unreported)))
            self.state.unreported = []
            if isinstance(answer, NoSplitNow) or answer is None:
                return
            if not (yield from self._read(answer, None)):
                return

    def _read(self, split: Split, position: Any) -> Generator[Any, None, bool]:
        """Read one split; returns False if the per-batch row limit stopped it (the split is
        kept, with its position, and another batch is asked for)."""
        for batch, after in self.read_split(split, position):
            self.rows += batch.num_rows
            position = after
            if batch.num_rows:
                yield batch
            if self.max_rows_per_batch is not None and self.rows >= self.max_rows_per_batch:
                self.state.unfinished.append((split, position))
                self.context.request_batch()
                return False
        self.state.unreported.append(split.split_id)
        return True

    def snapshot_state(self) -> Any:
        if not self.state.unfinished and not self.state.unreported:
            return None  # nothing to carry: a reader that read whole splits writes no state
        return self.state


def _joined(batches: list[Any]) -> Any:
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
