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
  4. A split that has nothing to read now but is not at its end (a live partition that caught
     up) is kept the same way: ``read_split`` yields ``(None, position)`` for it, and the
     reader goes on with its other splits.
  5. With watermark alignment (``alignment`` set; docs/alignment.md), the batch's
     :class:`AlignmentDecision` arrives as an operator event before any data; before each
     record batch the reader asks ``may_read`` and keeps a split that must wait (with its
     position and watermark, rule 3) without asking for a batch: the enumerator asks for one
     when it decides again. The greatest event time of each record batch moves the split's
     watermark; what the reader saw travels with its next ``NextSplit`` request, and what is
     left at the end of ``process`` as an event. Both are logged, so a retry or a replay
     reports the same.
  6. What a reader says about a split it finished (:meth:`SplitReader.finished_report`:
     where it ended, a high watermark) is kept in its state with the split's id until the
     next request carries both (``NextSplit.reports``), so the enumerator learns it in the
     log, in order, with the finished report itself (rule 1); a retry or a replay reports
     the same.
"""

from __future__ import annotations

import abc
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkcoord.core.encoding import encoded
from sparkcoord.operator import SubtaskContext, SubtaskOperator
from sparkcoord.sources.alignment import (
    NO_DECISION,
    AlignmentDecision,
    AlignmentOptions,
    SplitWatermarks,
)
from sparkcoord.sources.splits import NextSplit, NoSplitNow, Split

# what reading one split in a batch came to
_FINISHED, _KEPT, _STOPPED = "finished", "kept", "stopped"


def _no_reports(fields: dict[str, Any]) -> dict[str, Any]:
    """ReaderState version 1 -> 2: a state of version 1 holds no finished reports."""
    return {**fields, "reports": {}}


@encoded("sources.ReaderState", version=2, upgrades={1: _no_reports},
         first_fields=("unfinished", "unreported", "event_times"))
@dataclass
class ReaderState:
    """A reader's checkpointed state: splits it has not finished, with their positions, and
    finished splits it has not reported yet (reported with its next request) with what the
    reader says about them (rule 6); with alignment, the greatest event time read of each
    unfinished split (so a resumed split keeps its watermark and pauses as it did)."""

    unfinished: list[tuple[Split, Any]] = field(default_factory=list)
    unreported: list[str] = field(default_factory=list)
    event_times: dict[str, int] = field(default_factory=dict)
    #: version 2: split id -> its finished report, for those of ``unreported`` that have one
    reports: dict[str, Any] = field(default_factory=dict)


class SplitReader(SubtaskOperator):
    """Base class of a reader. Implement :meth:`read_split`.

    Thread model: one instance per subtask per batch, used from the Spark task's thread only.
    """

    #: stop reading in a batch after this many rows (``None``: read every split to its end)
    max_rows_per_batch: int | None = None
    #: ask for no more new splits in a batch once this many were taken (``None``: until
    #: told none): the batch ends there and asks for the next (rule 1)
    max_splits_per_batch: int | None = None
    #: record batches smaller than this are joined before they go to Spark
    coalesce_rows: int = 1 << 16
    #: watermark alignment (``None``: off); the same options as the enumerator's
    alignment: AlignmentOptions | None = None
    #: the request the reader asks with: ``NextSplit``, or a subclass a source names (one a
    #: released version logged under a name of its own: the PostgreSQL source's ``NextChunk``)
    request_class: ClassVar[type[NextSplit]] = NextSplit

    def open(self, context: SubtaskContext, state: Any) -> None:
        super().open(context, state)
        if state is not None and not isinstance(state, ReaderState):
            raise TypeError(f"reader {context.operator_id}[{context.subtask}]: restored state is "
                            f"a {type(state).__name__}, not a ReaderState")
        self.state = state if state is not None else ReaderState()
        self.rows = 0
        #: the decision in force in this batch: nothing pauses until the epoch's one arrives
        self.decision: AlignmentDecision = NO_DECISION
        self.watermarks: SplitWatermarks | None = None
        if self.alignment is not None:
            # a state pickled before alignment existed has no event_times attribute
            self.watermarks = SplitWatermarks(self.alignment.out_of_orderness_ms,
                                              getattr(self.state, "event_times", None))

    def handle_operator_event(self, event: Any) -> Any:
        """The epoch's alignment decision (Spark task thread, after ``open``, before
        ``process``). A subclass that has events of its own calls ``super()`` for the rest."""
        if isinstance(event, AlignmentDecision):
            self.decision = event
        return None

    @abc.abstractmethod
    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        """Read ``split`` from ``position`` (``None``: its start). Task thread.

        Yields ``(record_batch, position_after_it)``; the position must let a later call
        continue right after that batch. Deterministic: the same split and position give the
        same batches. A split with nothing to read now that is not at its end yields
        ``(None, position)`` and stops (rule 4); returning means the split is finished.
        """

    def finished_report(self, split: Split, position: Any) -> Any:
        """What the enumerator should learn about ``split``, just read to its end at
        ``position`` (the last position ``read_split`` yielded with a record batch, or the
        one it was resumed from when it yielded none; ``None`` for a fresh split that
        yielded nothing): rule 6. ``None`` (the default) reports nothing but that it finished. Task
        thread, once per split, right after its last record batch; the value is pickled into
        the reader's state and the next request, so keep it small and deterministic (an
        offset, a log position)."""
        return None

    def event_time_ms(self, split: Split, batch: Any) -> int | None:
        """The greatest event time in ``batch`` (epoch ms; ``None``: no row has one). Called
        with alignment on, after each record batch with rows (task thread). The default reads
        the ``eventTimeColumn`` option's column; override to compute event times otherwise."""
        column = self.alignment.event_time_column if self.alignment is not None else None
        if column is None:
            return None
        return greatest_event_time_ms(batch, column)

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
        if self.watermarks is not None:
            # what no request carried (a reader that only resumed its splits asks nothing)
            report = self.watermarks.take_report()
            if report:
                self.context.send_event(report)

    def _produce(self) -> Iterator[Any]:
        unfinished = list(self.state.unfinished)
        self.state.unfinished = []
        for index, (split, position) in enumerate(unfinished):
            if (yield from self._read(split, position)) == _STOPPED:
                self.state.unfinished.extend(unfinished[index + 1:])
                return
        taken = 0
        while True:
            report = self.watermarks.take_report() if self.watermarks is not None else None
            answer = self.context.request(self._next_split(report or None))
            self.state.unreported = []
            self.state.reports = {}
            if isinstance(answer, NoSplitNow) or answer is None:
                return
            if (yield from self._read(answer, None)) == _STOPPED:
                return
            taken += 1
            if self.max_splits_per_batch is not None and taken >= self.max_splits_per_batch:
                self.context.request_batch()  # what is left goes to the next batch
                return

    def _read(self, split: Split, position: Any) -> Generator[Any, None, str]:
        """Read one split as far as this batch may: ``_FINISHED`` at its end, ``_KEPT`` when
        it waits (paused by alignment, or nothing to read now; kept with its position),
        ``_STOPPED`` when the per-batch row limit stopped the reader (the split is kept and
        another batch is asked for)."""
        marks = self.watermarks
        # the split, or its lane (docs/decisions/043-watermark-alignment.md)
        key = split.alignment_key
        batches = iter(self.read_split(split, position))
        try:
            while True:
                if marks is not None and not marks.may_read(key, self.decision):
                    self.state.unfinished.append((split, position))
                    return _KEPT
                try:
                    batch, after = next(batches)
                except StopIteration:
                    break
                if batch is None:  # rule 4: nothing now, more later
                    if marks is not None:
                        marks.observe_empty(key)
                    self.state.unfinished.append((split, after))
                    return _KEPT
                self.rows += batch.num_rows
                position = after
                if batch.num_rows:
                    if marks is not None:
                        marks.observe(key, self.event_time_ms(split, batch))
                    yield batch
                if self.max_rows_per_batch is not None and self.rows >= self.max_rows_per_batch:
                    self.state.unfinished.append((split, position))
                    self.context.request_batch()
                    return _STOPPED
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # a split left in the middle releases its file now
        if marks is not None and key == split.split_id:
            # a lane goes on with its next split: its watermark stays (the enumerator
            # forgets a lane itself, docs/decisions/043-watermark-alignment.md)
            marks.finished(key)
        self.state.unreported.append(split.split_id)
        finished = self.finished_report(split, position)
        if finished is not None:
            self.state.reports[split.split_id] = finished  # rule 6
        return _FINISHED

    def _next_split(self, watermarks: Any) -> NextSplit:
        """The next request (rule 1): the finished splits, their reports (rule 6) and the
        watermarks. Task thread."""
        reports = self.state.reports
        return self.request_class(tuple(self.state.unreported), watermarks,
                         tuple((split_id, reports[split_id]) for split_id in self.state.unreported
                               if split_id in reports))

    def snapshot_state(self) -> Any:
        if self.watermarks is not None:
            self.state.event_times = self.watermarks.snapshot()
        if not self.state.unfinished and not self.state.unreported:
            return None  # nothing to carry: a reader that read whole splits writes no state
        return self.state


_MS_PER_UNIT = {"s": 1000, "ms": 1, "us": 1, "ns": 1}
_DIVISOR = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}
_MS_PER_DAY = 86_400_000


def greatest_event_time_ms(batch: Any, column: str) -> int | None:
    """The greatest value of ``column`` in ``batch`` as epoch milliseconds: a timestamp (any
    unit, any time zone: its value is UTC), a date, or an integer taken as epoch ms; nulls are
    ignored (``None`` when every value is null). Task thread."""
    import pyarrow as pa
    import pyarrow.compute as pc

    index = batch.schema.get_field_index(column)
    if index < 0:
        raise ValueError(f"event-time column {column!r} is not in the source's schema "
                         f"({', '.join(batch.schema.names)})")
    values = batch.column(index)
    kind = values.type
    greatest = pc.max(values)
    if not greatest.is_valid:
        return None
    if pa.types.is_timestamp(kind):
        raw = greatest.cast(pa.int64()).as_py()
        return int(raw * _MS_PER_UNIT[kind.unit] // _DIVISOR[kind.unit])
    if pa.types.is_date32(kind):
        return int(greatest.cast(pa.int32()).as_py()) * _MS_PER_DAY
    if pa.types.is_date64(kind):
        return int(greatest.cast(pa.int64()).as_py())
    if pa.types.is_integer(kind):
        return int(greatest.as_py())
    raise TypeError(f"event-time column {column!r} is a {kind}; use a timestamp, a date or an "
                    f"integer of epoch milliseconds")


def _joined(batches: list[Any]) -> Any:
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
