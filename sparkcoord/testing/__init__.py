"""Fakes for testing coordinators without Spark, threads or real time.

* :class:`ManualMailbox` and :class:`ManualMailboxes`: mailboxes that run only when the test says.
* :class:`ManualClock`: time that moves only when the test advances it.
* :class:`ManualWorkers`: a coordinator's ``call_async`` works, run when the test says.
* :class:`RecordingGateway`: a gateway that records what a coordinator sends.
* :class:`CoordinatorHarness`: a real coordination service around your coordinator, on manual
  mailboxes, a manual clock and in-memory storage, with one-line checkpoints, commits, subtask
  events and task retries; an input the service refuses raises :class:`InputRefused`.
"""

from sparkcoord.testing.fakes import (
    CoordinatorHarness,
    InputRefused,
    ManualClock,
    ManualLane,
    ManualMailbox,
    ManualMailboxes,
    ManualWorkers,
    RecordingGateway,
)

__all__ = ["CoordinatorHarness", "InputRefused", "ManualClock", "ManualMailbox", "ManualMailboxes",
           "ManualLane", "ManualWorkers", "RecordingGateway"]
