"""A test base for split readers, without Spark: a scripted enumerator and the contract every
reader keeps (Flink's ``TestingReaderContext`` and ``SourceReaderTestBase`` are the models).

Use it from a test module::

    from sparkcoord.testing import SplitReaderContract

    class TestMyReader(SplitReaderContract):
        def make_reader(self):            # a fresh reader, as each Spark task makes one
            return MyReader(options)

        def splits(self):                 # two or more, one with more rows than stop_after_rows
            return [MySplit("a"), MySplit("b")]

        def expected_rows(self, split):   # the rows the split holds, in read order
            return pyarrow.table(...)

pytest then runs the contract's tests for that reader (``docs/sources.md``, "Testing a
source").

Rules the contract checks (``sources/reader.py`` rules 1-3):
  1. Every split handed out is read to its end once and reported finished once, in the
     reader's next request. A reader that reads a split in one batch and emits it in the
     next (the PostgreSQL source's snapshot chunks: it keeps them in its state meanwhile and
     asks for that batch) is read batch after batch until it keeps nothing.
  2. A batch stopped in the middle of a split (``max_rows_per_batch``) keeps the split and its
     position in its state, asks for another batch, and the next batch, restored from that
     state through the checkpoint's encoding, goes on from there: no row lost or repeated.
  3. A batch run again from the same state with the same answers (a task retry, a restore
     that runs the batch again) emits the same rows and asks the same requests.
  4. Every record batch has the reader's Arrow schema.

Thread model: the test's thread.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.control import BatchRequested
from sparkcoord.core.encoding import loads
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources.reader import SplitReader
from sparkcoord.sources.splits import NextSplit, NoSplitNow, Split


class ScriptedEnumerator:
    """The enumerator side of a reader test: answers each :class:`NextSplit` with the next of
    ``splits`` (then :class:`NoSplitNow`) and records what the reader reported finished."""

    def __init__(self, splits: Sequence[Split]) -> None:
        self.remaining = list(splits)
        self.asked: list[Any] = []
        self.finished: list[str] = []

    def answer(self, request: Any) -> Any:
        """The answer to a reader's request (the reader's task thread)."""
        self.asked.append(request)
        if not isinstance(request, NextSplit):
            raise TypeError(f"a split reader asked {request!r}, not a NextSplit")
        self.finished.extend(request.finished)
        return self.remaining.pop(0) if self.remaining else NoSplitNow()


@dataclass
class BatchRead:
    """What one batch of a reader did."""

    batches: list[Any]
    asked: list[Any]
    sent: list[Any]
    #: the state the reader snapshot at the batch's end, as the checkpoint gives it back
    state: Any
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def batch_requested(self) -> bool:
        return any(isinstance(e, BatchRequested) for e in self.sent)


def reader_context(answer: Callable[[Any], Any], sent: list[Any], *, operator_id: str = "source",
                   subtask: int = 0, parallelism: int = 1, epoch: int = 0,
                   spark_attempt: int = 0) -> SubtaskContext:
    """A subtask context whose requests ``answer`` answers and whose events go to ``sent``."""
    return SubtaskContext(operator_id, subtask, parallelism, epoch, 0, spark_attempt,
                          sent.append, lambda request, timeout_s: answer(request))


def read_batch(reader: SplitReader, state: Any, answer: Callable[[Any], Any], *,
               epoch: int = 0, spark_attempt: int = 0) -> BatchRead:
    """Run one batch of ``reader`` from ``state`` (``open``, ``process``, ``snapshot_state``,
    ``close``) as a Spark task does, its state then through the checkpoint's encoding."""
    asked: list[Any] = []
    sent: list[Any] = []

    def recorded(request: Any) -> Any:
        asked.append(request)
        return answer(request)

    reader.open(reader_context(recorded, sent, epoch=epoch, spark_attempt=spark_attempt), state)
    try:
        batches = list(reader.process())
        after = reader.snapshot_state()
    finally:
        reader.close()
    after = None if after is None else loads(pickle.dumps(after))
    rows = [row for batch in batches for row in batch.to_pylist()]
    return BatchRead(batches, asked, sent, after, rows)


class SplitReaderContract:
    """The tests every split reader passes (module rules). Subclass it as ``Test<Reader>`` and
    implement :meth:`make_reader`, :meth:`splits` and :meth:`expected_rows`."""

    #: rule 2: the row limit of the stopped batches (a split of :meth:`splits` holds more)
    stop_after_rows = 5
    #: how many batches the stopped reading may take before the test gives up
    max_batches = 1000

    def make_reader(self) -> SplitReader:
        """A fresh reader, as each Spark task makes one."""
        raise NotImplementedError

    def splits(self) -> list[Split]:
        """Two or more splits to read, one of more than :attr:`stop_after_rows` rows."""
        raise NotImplementedError

    def expected_rows(self, split: Split) -> list[dict[str, Any]]:
        """The rows ``split`` holds, in the order the reader reads them, as
        ``pyarrow.Table.to_pylist`` gives them."""
        raise NotImplementedError

    def comparable(self, row: dict[str, Any]) -> Any:
        """What of an emitted row the contract compares with :meth:`expected_rows` (all of
        it; a reader whose rows carry what only the read knows, a log position, leaves it
        out)."""
        return row

    def _expected(self) -> list[Any]:
        return [self.comparable(row) for split in self.splits()
                for row in self.expected_rows(split)]

    def _rows(self, read: BatchRead) -> list[Any]:
        return [self.comparable(row) for row in read.rows]

    def test_every_split_is_read_once_and_reported_finished_in_the_next_request(self) -> None:
        splits = self.splits()
        assert len(splits) >= 2, "the contract needs two splits or more"
        enumerator = ScriptedEnumerator(splits)
        rows: list[Any] = []
        state: Any = None
        for epoch in range(self.max_batches):
            reader = self.make_reader()
            read = read_batch(reader, state, enumerator.answer, epoch=epoch)
            if epoch == 0:
                assert read.asked[0] == reader.request_class(()), (
                    "a reader with no state asks before reading")
            rows.extend(self._rows(read))
            schema = reader.arrow_schema if hasattr(reader, "arrow_schema") else None
            for batch in read.batches:
                assert schema is None or batch.schema.equals(schema), (
                    f"a record batch's schema {batch.schema} is not the reader's {schema}")
            state = read.state
            if state is None:
                break  # a reader that finished every split keeps no state
            assert read.batch_requested, "a reader that keeps a split asks for another batch"
        assert state is None and not enumerator.remaining
        assert rows == self._expected()
        assert enumerator.finished == [s.split_id for s in splits]

    def test_a_batch_stopped_mid_split_goes_on_from_its_state_with_no_row_lost_or_repeated(
            self) -> None:
        splits = self.splits()
        assert any(len(self.expected_rows(s)) > self.stop_after_rows for s in splits), (
            f"the contract needs a split of more than {self.stop_after_rows} rows")
        enumerator = ScriptedEnumerator(splits)
        rows: list[Any] = []
        state: Any = None
        stopped = 0
        for epoch in range(self.max_batches):
            reader = self.make_reader()
            reader.max_rows_per_batch = self.stop_after_rows
            read = read_batch(reader, state, enumerator.answer, epoch=epoch)
            rows.extend(self._rows(read))
            state = read.state
            if read.batch_requested:
                stopped += 1
                assert state is not None and state.unfinished, (
                    "a batch that asked for another keeps the split it stopped in")
            if state is None and not enumerator.remaining:
                break
        assert stopped >= 1, "no batch stopped at the row limit"
        assert rows == self._expected()
        assert enumerator.finished == [s.split_id for s in splits]

    def test_a_batch_run_again_from_the_same_state_emits_the_same_rows(self) -> None:
        splits = self.splits()
        first = ScriptedEnumerator(splits)
        reader = self.make_reader()
        reader.max_rows_per_batch = self.stop_after_rows
        start = read_batch(reader, None, first.answer)
        assert start.state is not None, "the first batch stops in a split"
        runs = []
        for attempt in range(2):  # the next batch, then its retry from the same state
            again = ScriptedEnumerator(first.remaining)
            reader = self.make_reader()
            reader.max_rows_per_batch = self.stop_after_rows
            state = loads(pickle.dumps(start.state))  # each run restores it from the record
            runs.append(read_batch(reader, state, again.answer, epoch=1,
                                   spark_attempt=attempt))
        assert runs[0].rows == runs[1].rows and runs[0].asked == runs[1].asked
        assert runs[0].state == runs[1].state
