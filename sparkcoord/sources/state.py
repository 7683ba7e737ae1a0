"""The checkpointed state of the split enumerator (:class:`~sparkcoord.sources.enumerator.
SplitEnumerator`; its rules in sources/enumerator.py and sources/handout.py). Its own module so
that the enumerator and its request path (handout.py) both name it without importing each
other; the encoding's home (core/encoding.py ``HOMES``), importable from sources/enumerator.py
as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkcoord.committer import LedgerState
from sparkcoord.core.encoding import encoded
from sparkcoord.sources.alignment import AlignmentState
from sparkcoord.sources.backlog import BacklogState
from sparkcoord.sources.splits import Split


@encoded("sources.EnumeratorState")
@dataclass
class EnumeratorState:
    """The enumerator's checkpointed state."""

    #: splits discovered and not yet handed out, in hand-out order, as chunks written once
    #: (sources/backlog.py; a list of splits in snapshots taken before backlogs had chunks)
    pending: BacklogState | list[Split] = field(default_factory=BacklogState)
    #: split id -> subtask that got it, until that reader reports it finished
    in_flight: dict[str, int] = field(default_factory=dict)
    discovery: Any = None
    #: a bounded source's one discovery has been applied
    discovered_once: bool = False
    handed_out: int = 0
    finished: int = 0
    #: with alignment: the reported watermarks, idleness and the decision in force
    alignment: AlignmentState | None = None
    #: with alignment: split id -> alignment key (its lane) of every split in flight
    in_flight_keys: dict[str, str] = field(default_factory=dict)
    #: with a committer or ``keeps_splits_in_flight``: every split in flight (enumerator
    #: rules 6, 7), and with a committer the commits not reported done (enumerator rule 6)
    in_flight_splits: dict[str, Split] | None = None
    commits: LedgerState | None = None
