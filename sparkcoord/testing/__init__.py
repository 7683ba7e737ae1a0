"""Fakes for testing coordinators without Spark, threads or real time.

* :class:`ManualMailbox` and :class:`ManualMailboxes`: mailboxes that run only when the test says.
* :class:`ManualClock`: time that moves only when the test advances it.
* :class:`ManualWorkers`: a coordinator's ``call_async`` works, run when the test says.
* :class:`RecordingGateway`: a gateway that records what a coordinator sends.
* :class:`SplitReaderContract`: the tests every split reader passes (subclass it as
  ``Test<YourReader>``), with :class:`ScriptedEnumerator` and :func:`read_batch` to drive a
  reader batch by batch (``testing/readers.py``; loaded on first use: it imports the sources).
* :class:`CoordinatorHarness`: a real coordination service around your coordinator, on manual
  mailboxes, a manual clock and in-memory storage, with one-line checkpoints, commits, subtask
  events and task retries; an input the service refuses raises :class:`InputRefused`.

The manual fakes are in ``testing/manual.py``, the harness in ``testing/fakes.py``.
"""

from sparkcoord.core.lazy import names_on_first_use
from sparkcoord.testing.fakes import CoordinatorHarness, InputRefused
from sparkcoord.testing.manual import (
    ManualClock,
    ManualLane,
    ManualMailbox,
    ManualMailboxes,
    ManualWorkers,
    RecordingGateway,
)

#: the reader test base imports the sources, which this package's other users need not load
__getattr__ = names_on_first_use(__name__, {
    "SplitReaderContract": "sparkcoord.testing.readers",
    "ScriptedEnumerator": "sparkcoord.testing.readers",
    "read_batch": "sparkcoord.testing.readers",
})

__all__ = ["CoordinatorHarness", "InputRefused", "ManualClock", "ManualLane", "ManualMailbox",
           "ManualMailboxes", "ManualWorkers", "RecordingGateway", "ScriptedEnumerator",
           "SplitReaderContract", "read_batch"]
