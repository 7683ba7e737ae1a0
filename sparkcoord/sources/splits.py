"""What flows between a split enumerator and its readers: splits, the reader's request, and the
per-batch read limit.

A *split* is a unit of work a reader reads from start to end (a parquet row group, a byte range
of a text file, a table range). The enumerator hands out each split once; the reader that got it
reads it, in one batch or (if its own per-batch limit stops it) over several, keeping its
position in its checkpointed state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkcoord.core.encoding import encoded


class PicklesLikeBefore:
    """Fields a class gained after sparkcoord first logged it are left out of its pickle while
    they hold their default: a re-sent request and a replayed answer are compared byte for
    byte with what was logged (docs/protocol.md [pickles-stay-byte-stable]), possibly by an
    older sparkcoord before an upgrade, and must not differ for a field nobody set. Unpickling
    an object without such a field gives the field's default (the dataclass's class
    attribute)."""

    #: the fields added later, in the class that added them
    added_fields: ClassVar[tuple[str, ...]] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self.added_fields:
            if name in state and state[name] == getattr(type(self), name):
                del state[name]
        return state


@encoded("sources.Split")
@dataclass(frozen=True)
class Split(PicklesLikeBefore):
    """Base class of a split. Subclasses add what the reader needs (a path, a range).

    ``split_id`` names it uniquely within its source; ``size`` (bytes, an estimate is fine)
    feeds ``maxBytesPerTrigger``; ``unit`` groups splits for ``maxFilesPerTrigger`` (a file's
    splits share their unit: its path; a split packing several files has one per file,
    ``units``).
    """

    split_id: str
    size: int = 0

    @property
    def unit(self) -> str:
        return self.split_id

    @property
    def units(self) -> tuple[str, ...]:
        """Every unit the split reads: its :attr:`unit`, or several for a split that packs
        several files (each counts against ``maxFilesPerTrigger``). Enumerator (mailbox
        thread), when it admits the split to a batch."""
        return (self.unit,)

    @property
    def alignment_key(self) -> str:
        """What watermark alignment keeps a watermark for (docs/alignment.md): the split itself
        by default; a *lane* (a file's directory) when splits of one lane follow each other
        in event time, so the lane's watermark outlives its splits
        (docs/decisions/043-watermark-alignment.md)."""
        return self.split_id


def _no_reports(fields: dict[str, Any]) -> dict[str, Any]:
    """NextSplit version 1 -> 2: a request of version 1 carried no finished reports."""
    return {**fields, "reports": ()}


@encoded("sources.NextSplit", version=2, upgrades={1: _no_reports},
         first_fields=("finished", "watermarks"))
@dataclass(frozen=True)
class NextSplit(PicklesLikeBefore):
    """A reader's request: the splits it finished since it last asked, and "give me another".

    Sent with ``SubtaskContext.request`` from the Spark task; logged, so a retried task asks
    the same and gets the same answer from the log.

    ``watermarks``: with watermark alignment on, the reader's
    :class:`~sparkcoord.sources.alignment.WatermarkReport` since its last report (``None``
    otherwise, so an unaligned source's requests are what they were).

    ``reports`` (version 2): ``(split_id, report)`` for those of ``finished`` whose reader
    said something about how they ended (``SplitReader.finished_report``: the offset a
    split ended at, a snapshot chunk's high watermark); the enumerator gets each in
    ``split_finished``. Logged with the request, so a replay reports the same.
    """

    finished: tuple[str, ...] = ()
    watermarks: Any = None
    reports: tuple[tuple[str, Any], ...] = ()

    added_fields: ClassVar[tuple[str, ...]] = ("watermarks", "reports")

    def report_of(self, split_id: str) -> Any:
        """The report that came with ``split_id`` finished (``None``: none). Called by the
        enumerator on the coordinator's mailbox."""
        for reported, report in self.reports:
            if reported == split_id:
                return report
        return None


@encoded("sources.NoSplitNow")
@dataclass(frozen=True)
class NoSplitNow:
    """The enumerator's answer when it has nothing more for this batch: ``done`` is true when
    the source is bounded and every split was handed out (nothing will ever come)."""

    done: bool = False


@dataclass
class ReadLimit:
    """How much new work one batch may take (Spark's ``maxFilesPerTrigger`` and
    ``maxBytesPerTrigger``: soft limits, the batch's first split is always admitted)."""

    max_units: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_units", "max_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")


@dataclass
class BatchBudget:
    """What the running batch took so far, checked against a :class:`ReadLimit`."""

    limit: ReadLimit
    #: unit -> splits of it taken in this batch
    units: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    splits: int = 0

    def admits(self, split: Split) -> bool:
        """Whether ``split`` may still go out in this batch (the first always does)."""
        if self.splits == 0:
            return True
        if self.limit.max_units is not None:
            new = sum(1 for unit in split.units if unit not in self.units)
            if new and len(self.units) + new > self.limit.max_units:
                return False
        return self.limit.max_bytes is None or self.bytes < self.limit.max_bytes

    def took(self, split: Split) -> None:
        for unit in split.units:
            self.units[unit] = self.units.get(unit, 0) + 1
        self.bytes += split.size
        self.splits += 1

    def gave_back(self, split: Split) -> None:
        """``split``, taken in this batch, was put back (a withdrawn answer): it no longer
        counts against the limit."""
        for unit in split.units:
            left = self.units.get(unit, 0) - 1
            if left > 0:
                self.units[unit] = left
            else:
                self.units.pop(unit, None)
        self.bytes = max(0, self.bytes - split.size)
        self.splits = max(0, self.splits - 1)
