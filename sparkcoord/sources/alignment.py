"""Watermark alignment, sans-IO: splits that run ahead in event time wait for the slow ones.

Rules:
  1. Times are integers in milliseconds, passed in: event times and watermarks (epoch ms, the
     reader's event-time column) and ``now_ms`` (the enumerator's clock at a batch boundary).
     Nothing here reads a clock, starts a thread or opens a socket.
  2. A split's watermark is the greatest event time its reader has read minus the
     out-of-orderness; it never goes back. The group *minimum* is the least watermark over the
     splits that have one and are not idle; the *allowed maximum* is minimum + max drift. With
     no such split (nothing reported yet, every split idle) there is no allowed maximum and
     nothing pauses: a split that never reported holds nobody back (FLINK-32414), and no
     "idle = +infinity" sentinel exists to overflow or to pause anyone (FLINK-31632, -32496).
  3. A reader checks a split before each record batch: it may read while the split has no
     watermark yet or its watermark is at most its allowed maximum. So a split ends a batch at
     most one record batch's span past it. The allowed maximum of the split that alone holds
     the minimum is not its own watermark + max drift but the next-lowest watermark + max
     drift (none at all when no other split counts): the split that holds the minimum is
     never paused, not even by its own progress inside a batch, and a single split is never
     paused; some split can always read, with one split or a thousand (FLINK-36751). It
     still stops once it is max drift past the others, so the spread keeps its bound.
  4. A split is idle once its reader tried it and found nothing for ``idle_timeout_ms``,
     counted between decisions. A paused split is not tried, so waiting for alignment never
     counts as idleness (FLINK-35886, -36751). An idle split leaves the minimum but keeps its
     watermark: rule 3 pauses and resumes it like any other (a paused split that went idle is
     resumed once the others catch up, FLINK-40093), and its first data puts it back in the
     minimum. A finished split is forgotten (FLINK-35157).
  5. The enumerator's state changes only in :meth:`WatermarkAlignment.observe` (a reader's
     report, which arrives through the logged request path) and in
     :meth:`WatermarkAlignment.decide` (at the checkpoint boundary, inside the snapshot). Both
     are deterministic: the same state and inputs give the same state and an equal decision,
     byte for byte when pickled (tuples sorted by split id, never sets: ``str`` hashes are
     salted per process). So a restore that replays a batch's reports against the snapshot
     arrives where the live run did (docs/protocol.md [state-changes-only-through-logged-inputs]
     [answers-never-change]).

What this module calls a *split* is an alignment key (``Split.alignment_key``): a split's id,
or the *lane* its splits share (a file source's directory), whose watermark outlives each of
its splits; the enumerator forgets a lane itself (docs/decisions/043-watermark-alignment.md).

Theory of operation: at each batch boundary the enumerator calls ``decide(now_ms)``, which
turns the reports of the last batch into idle flags and computes an :class:`AlignmentDecision`
(minimum, allowed maximum, paused and idle splits); it is snapshotted with the enumerator and
sent to every reader before the batch's data. In the batch a reader keeps a
:class:`SplitWatermarks`: it asks ``may_read(split_id, decision)`` before each record batch,
feeds the record batch's greatest event time to ``observe``, ``observe_empty`` when a split had
nothing to read, ``finished`` at a split's end, and sends ``take_report()`` (a
:class:`WatermarkReport`) to the enumerator, which hands it to ``observe``. A split that must
pause is kept, with its position, in the reader's state and read again once a later decision
allows it. While a split waits, ``next_check_ms`` says when the enumerator should ask for
another batch, so a stalled group is decided again every update interval even when no data
flows (and the empty split holding it back can go idle).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.encoding import encoded

#: the PySpark-style option names of alignment (lower case: Spark's options ignore case) and
#: the spelling the docs and errors use
OPTION_NAMES: dict[str, str] = {
    "alignmentgroup": "alignmentGroup",
    "maxdrift": "maxDrift",
    "alignmentupdateinterval": "alignmentUpdateInterval",
    "idletimeout": "idleTimeout",
    "outoforderness": "outOfOrderness",
    "eventtimecolumn": "eventTimeColumn",
}
#: idleTimeout values that turn idleness off (a split with no data then holds the group forever)
_NO_TIMEOUT = ("none", "off", "never")


@dataclass(frozen=True)
class AlignmentOptions:
    """How a source aligns its splits (Flink's ``WatermarkStrategy.withWatermarkAlignment``,
    ``withIdleness`` and ``forBoundedOutOfOrderness`` in one place).

    Built by the user's driver program (directly or with :meth:`from_options`) and passed to
    both sides: the enumerator's :class:`WatermarkAlignment` and the readers'
    :class:`SplitWatermarks`.
    """

    #: the alignment group (one source for now; a group across sources is future work)
    group: str
    #: how far a split's watermark may run ahead of the group minimum
    max_drift_ms: int
    #: while a split waits, how often a batch is asked for to decide again (Flink's: 1s)
    update_interval_ms: int = 1000
    #: a split tried and found empty this long is idle; ``None``: never idle
    idle_timeout_ms: int | None = 60_000
    #: watermark = greatest event time read - this (Spark's ``withWatermark`` delay, per split)
    out_of_orderness_ms: int = 0
    #: the reader's event-time column; ``None`` when a reader computes event times itself
    event_time_column: str | None = None

    def __post_init__(self) -> None:
        if not self.group:
            raise ValueError("alignment group must be a non-empty name")
        if self.max_drift_ms < 0:
            raise ValueError(f"max_drift_ms must be >= 0, got {self.max_drift_ms}")
        if self.update_interval_ms <= 0:
            raise ValueError(f"update_interval_ms must be > 0, got {self.update_interval_ms}")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms <= 0:
            raise ValueError(f"idle_timeout_ms must be > 0 or None, got {self.idle_timeout_ms}")
        if self.out_of_orderness_ms < 0:
            raise ValueError(f"out_of_orderness_ms must be >= 0, got {self.out_of_orderness_ms}")

    @classmethod
    def from_options(cls, options: Mapping[str, str], *,
                     default_group: str) -> AlignmentOptions | None:
        """The alignment options among a source's string options (names ignore case; options
        that are not alignment's are left alone), or ``None`` when alignment is off (no
        ``maxDrift``). ``default_group`` names the group when ``alignmentGroup`` is not set
        (the source's name). Driver program thread, when the source is built.

        A bad value, or an alignment option without ``maxDrift``, is an error naming it.
        """
        given = {key.lower(): (key, value) for key, value in options.items()
                 if key.lower() in OPTION_NAMES}
        if "maxdrift" not in given:
            if given:
                names = ", ".join(repr(key) for key, _ in sorted(given.values()))
                raise ValueError(f"option(s) {names} need 'maxDrift' (how far a split may run "
                                 "ahead of the slowest one); alignment is off without it")
            return None
        fields: dict[str, Any] = {"group": default_group}
        for lower, (name, value) in given.items():
            if lower == "alignmentgroup":
                fields["group"] = str(value).strip()
            elif lower == "eventtimecolumn":
                fields["event_time_column"] = str(value).strip()
            elif lower == "maxdrift":
                fields["max_drift_ms"] = _milliseconds(name, value)
            elif lower == "alignmentupdateinterval":
                fields["update_interval_ms"] = _milliseconds(name, value, positive=True)
            elif lower == "idletimeout":
                fields["idle_timeout_ms"] = (None if str(value).strip().lower() in _NO_TIMEOUT
                                             else _milliseconds(name, value, positive=True))
            elif lower == "outoforderness":
                fields["out_of_orderness_ms"] = _milliseconds(name, value)
        if not fields["group"]:
            raise ValueError("option 'alignmentGroup': must not be empty")
        return cls(**fields)


def _milliseconds(name: str, value: str, *, positive: bool = False) -> int:
    from sparkcoord.sources.values import parse_seconds  # the module's top imports nothing

    millis = round(parse_seconds(name, value) * 1000)
    if positive and millis <= 0:
        raise ValueError(f"option {name!r}: must be more than 0, got {value!r}")
    return millis


# ------------------------------------------------------------------ what flows between the sides
@encoded("sources.WatermarkReport")
@dataclass(frozen=True)
class WatermarkReport:
    """A reader's report on its splits since its last report. Built by
    :meth:`SplitWatermarks.take_report` in the Spark task; travels through the logged request
    path (with a ``NextSplit`` request or as an event) to :meth:`WatermarkAlignment.observe`.

    Every field is a tuple sorted by split id, so equal reports pickle to equal bytes.
    """

    #: splits that read rows: (split id, watermark or None when no row carried an event time)
    read: tuple[tuple[str, int | None], ...] = ()
    #: splits the reader tried that had nothing to read (and read no rows since the last report)
    empty: tuple[str, ...] = ()
    #: splits read to their end: the enumerator forgets them
    finished: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.read or self.empty or self.finished)


@encoded("sources.AlignmentDecision")
@dataclass(frozen=True)
class AlignmentDecision:
    """What a batch's readers may read. Made by :meth:`WatermarkAlignment.decide` on the
    enumerator's mailbox at a batch boundary; sent to every reader before the batch's data;
    read by :meth:`SplitWatermarks.may_read` in the Spark task.

    Tuples sorted by split id (rule 5), so a decision pickles the same in every process.
    """

    group: str
    #: decisions made so far in this group, this one included (1 for the first)
    number: int
    #: the least watermark over splits that have one and are not idle (None: no such split)
    minimum: int | None
    #: minimum + max drift; None: nothing pauses
    allowed_maximum: int | None
    #: splits whose reported watermark is past the allowed maximum
    paused: tuple[str, ...] = ()
    #: splits idle at this decision (left out of the minimum)
    idle: tuple[str, ...] = ()
    #: the split that alone holds the minimum (None: no minimum, or a tie), and its own
    #: allowed maximum: the next-lowest watermark + max drift (None: nothing else counts, so
    #: nothing holds it). Rule 3: it is held by the others, never by its own progress.
    lowest: str | None = None
    lowest_allowed_maximum: int | None = None

    def allowed_maximum_of(self, split_id: str | None) -> int | None:
        """The allowed maximum of ``split_id`` (None: nothing pauses it)."""
        if split_id is not None and split_id == self.lowest:
            return self.lowest_allowed_maximum
        return self.allowed_maximum

    def allows(self, watermark: int | None, split_id: str | None = None) -> bool:
        """Whether ``split_id`` with this watermark may read a record batch (rule 3); without
        ``split_id``, under the allowed maximum of every split but the lowest."""
        bound = self.allowed_maximum_of(split_id)
        return bound is None or watermark is None or watermark <= bound


#: the decision before the first one: nothing pauses
NO_DECISION = AlignmentDecision(group="", number=0, minimum=None, allowed_maximum=None)


# ------------------------------------------------------------------ the reader side
class SplitWatermarks:
    """A reader's watermarks, one per split it reads, and what it has to report.

    Thread model: one instance per reader (Spark task), used from the task's thread only.
    Its :meth:`snapshot` belongs in the reader's checkpointed state beside the split positions,
    so a split resumed in a later batch (or after a restore) keeps its watermark and pauses as
    it did.
    """

    def __init__(self, out_of_orderness_ms: int = 0,
                 restored: Mapping[str, int] | None = None) -> None:
        if out_of_orderness_ms < 0:
            raise ValueError(f"out_of_orderness_ms must be >= 0, got {out_of_orderness_ms}")
        self.out_of_orderness_ms = out_of_orderness_ms
        #: split id -> greatest event time read (ms)
        self._greatest: dict[str, int] = dict(restored or {})
        # what the next report carries
        self._read: set[str] = set()
        self._empty: set[str] = set()
        self._finished: set[str] = set()

    def watermark(self, split_id: str) -> int | None:
        """The split's watermark: greatest event time read minus the out-of-orderness (None:
        no event time read yet)."""
        greatest = self._greatest.get(split_id)
        return None if greatest is None else greatest - self.out_of_orderness_ms

    def may_read(self, split_id: str, decision: AlignmentDecision) -> bool:
        """Whether the reader may read the split's next record batch under ``decision``.
        Called by the reader before each record batch; ``False``: keep the split and its
        position for a later batch.

        Uses this reader's own watermark, which is never behind the one the decision saw, so
        a split the decision paused stays paused, and a split that crossed the allowed
        maximum inside this batch stops at its next record batch.
        """
        return decision.allows(self.watermark(split_id), split_id)

    def observe(self, split_id: str, greatest_event_time_ms: int | None) -> None:
        """A record batch of the split was read; its greatest event time (None: the batch's
        rows carry no event time). Called by the reader after each record batch with rows."""
        self._read.add(split_id)
        self._empty.discard(split_id)
        if greatest_event_time_ms is not None:
            previous = self._greatest.get(split_id)
            if previous is None or greatest_event_time_ms > previous:
                self._greatest[split_id] = greatest_event_time_ms

    def observe_empty(self, split_id: str) -> None:
        """The reader tried the split and it had nothing to read now (a live split caught up).
        Not for a split it did not try: a paused split must not drift towards idle."""
        if split_id not in self._read:
            self._empty.add(split_id)

    def finished(self, split_id: str) -> None:
        """The split was read to its end; its watermark is no longer kept."""
        self._greatest.pop(split_id, None)
        self._read.discard(split_id)
        self._empty.discard(split_id)
        self._finished.add(split_id)

    def take_report(self) -> WatermarkReport:
        """What happened since the last report (sorted: rule 5), and start a new one. Called by
        the reader when it sends a request or at the end of its batch."""
        report = WatermarkReport(
            read=tuple((split_id, self.watermark(split_id)) for split_id in sorted(self._read)),
            empty=tuple(sorted(self._empty)),
            finished=tuple(sorted(self._finished)))
        self._read, self._empty, self._finished = set(), set(), set()
        return report

    def snapshot(self) -> dict[str, int]:
        """The greatest event time of every split not finished (small, picklable)."""
        return dict(sorted(self._greatest.items()))


# ------------------------------------------------------------------ the enumerator side
@encoded("sources.SplitAlignmentState")
@dataclass
class SplitAlignmentState:
    """What the enumerator knows of one split."""

    #: the greatest watermark reported (None: no event time yet, so not in the minimum)
    watermark: int | None = None
    idle: bool = False
    #: time the split was tried and found empty since it last read rows (ms)
    quiet_ms: int = 0
    # since the last decision: the split read rows / was tried and found empty
    read_since_decision: bool = False
    empty_since_decision: bool = False


@encoded("sources.AlignmentState")
@dataclass
class AlignmentState:
    """The enumerator's alignment state: picklable and small (an entry per split not finished);
    part of the enumerator's checkpoint."""

    splits: dict[str, SplitAlignmentState] = field(default_factory=dict)
    #: ``now_ms`` of the last decision (None: none yet)
    last_decision_ms: int | None = None
    decision: AlignmentDecision = NO_DECISION


class WatermarkAlignment:
    """The enumerator side: reported watermarks and idleness in, a decision per batch out.

    Thread model: the enumerator's mailbox only. :meth:`observe` is called for each reader's
    report as its logged request or event is handled (also when a restore replays it);
    :meth:`decide` at each batch boundary (in ``checkpoint_coordinator``, before the state is
    snapshotted); :meth:`state` is what the snapshot holds, and what a restore passes back.
    """

    def __init__(self, options: AlignmentOptions, state: AlignmentState | None = None) -> None:
        self.options = options
        if state is not None and not isinstance(state, AlignmentState):
            raise TypeError(f"alignment group {options.group!r}: restored state is a "
                            f"{type(state).__name__}, not an AlignmentState")
        self.state = state if state is not None else AlignmentState()

    @property
    def decision(self) -> AlignmentDecision:
        """The decision in force (the last one made; nothing pauses before the first)."""
        return self.state.decision

    def observe(self, report: WatermarkReport) -> None:
        """A reader's report. Mailbox thread, in log order; reads no clock (rule 5): what the
        report means for idleness is settled by the next :meth:`decide`."""
        splits = self.state.splits
        for split_id, watermark in report.read:
            entry = splits.setdefault(split_id, SplitAlignmentState())
            entry.read_since_decision = True
            if watermark is not None and (entry.watermark is None
                                          or watermark > entry.watermark):
                entry.watermark = watermark
        for split_id in report.empty:
            splits.setdefault(split_id, SplitAlignmentState()).empty_since_decision = True
        for split_id in report.finished:
            splits.pop(split_id, None)

    def forget(self, split_ids: Iterable[str]) -> None:
        """Splits the enumerator knows are gone (read to the end, reported in ``NextSplit``).
        Mailbox thread."""
        for split_id in split_ids:
            self.state.splits.pop(split_id, None)

    def decide(self, now_ms: int) -> AlignmentDecision:
        """Settle idleness and decide what the next batch may read. Mailbox thread, at a batch
        boundary; ``now_ms`` is the enumerator's clock then.

        A split that read rows since the last decision is active; one that was only tried and
        found empty adds the time since the last decision to its quiet time and is idle once
        that reaches the idle timeout; one that was not tried (paused, not handed out, no
        batch ran) keeps its quiet time as it was (rule 4).
        """
        last = self.state.last_decision_ms
        # a clock that went back (another driver host after a restart) counts no time
        elapsed = 0 if last is None else max(0, now_ms - last)
        timeout = self.options.idle_timeout_ms
        counted: list[tuple[int, str]] = []  # (watermark, split) of the splits in the minimum
        for split_id in sorted(self.state.splits):
            entry = self.state.splits[split_id]
            if entry.read_since_decision:
                entry.quiet_ms, entry.idle = 0, False
            elif entry.empty_since_decision and timeout is not None:
                # capped: the state stays the same size however long a split stays idle
                entry.quiet_ms = min(entry.quiet_ms + elapsed, timeout)
                entry.idle = entry.quiet_ms >= timeout
            entry.read_since_decision = entry.empty_since_decision = False
            if not entry.idle and entry.watermark is not None:
                counted.append((entry.watermark, split_id))
        counted.sort()
        drift = self.options.max_drift_ms
        minimum = counted[0][0] if counted else None
        allowed = None if minimum is None else minimum + drift
        lowest: str | None = None
        lowest_allowed: int | None = None
        if len(counted) == 1 or (len(counted) > 1 and counted[0][0] < counted[1][0]):
            # rule 3: the split alone at the minimum is held only by the next-lowest one
            lowest = counted[0][1]
            lowest_allowed = counted[1][0] + drift if len(counted) > 1 else None
        ordered = sorted(self.state.splits.items(), key=lambda item: item[0])
        decision = AlignmentDecision(
            group=self.options.group,
            number=self.state.decision.number + 1,
            minimum=minimum,
            allowed_maximum=allowed,
            paused=tuple(split_id for split_id, entry in ordered
                         if allowed is not None and entry.watermark is not None
                         and split_id != lowest and entry.watermark > allowed),
            idle=tuple(split_id for split_id, entry in ordered if entry.idle),
            lowest=lowest,
            lowest_allowed_maximum=lowest_allowed)
        self.state.last_decision_ms = now_ms
        self.state.decision = decision
        return decision

    def next_check_ms(self) -> int | None:
        """When the enumerator should ask for another batch although nothing else asks (None:
        no need): one update interval after the last decision while a split waits, i.e. its
        latest reported watermark is past the allowed maximum in force. Such a split resumes
        only through a later decision, and the split that holds it back may be empty and go
        idle only through decisions too; without this a group whose only readable split was
        read to its end would wait for a batch that nothing asks for. Mailbox thread, after
        :meth:`decide` and after :meth:`observe` (a reader may pause a split inside a batch)."""
        last = self.state.last_decision_ms
        if last is None:
            return None
        decision = self.state.decision
        waiting = any(entry.watermark is not None
                      and not decision.allows(entry.watermark, split_id)
                      for split_id, entry in self.state.splits.items())
        return last + self.options.update_interval_ms if waiting else None

    def status(self) -> dict[str, Any]:
        """For the enumerator's ``"status"`` client request. Mailbox thread."""
        decision = self.state.decision
        watermarks = [entry.watermark for entry in self.state.splits.values()
                      if not entry.idle and entry.watermark is not None]
        return {"group": self.options.group, "decisions": decision.number,
                "minimum": decision.minimum, "allowed_maximum": decision.allowed_maximum,
                "paused": list(decision.paused), "idle": list(decision.idle),
                "splits": len(self.state.splits),
                "spread_ms": max(watermarks) - min(watermarks) if watermarks else 0}
