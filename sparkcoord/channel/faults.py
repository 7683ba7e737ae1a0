"""Channel fault plans for tests (issue: channel faults must not cost the normal path).

A plan is a function the channel server calls with each authenticated message when (and only
when) ``ChannelServer.fault`` is set; it answers what to do to that message. The messages it
does not hit go the production way: batched per read, as without a plan; the frames before a
hit one go as one batch first, then the fault happens (so fault tests run the path a job
runs). The Spark adapter sets one from ``CoordinatedJob(channel_fault_plan=...)``; nothing
else does.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkcoord.channel.frames import Event, Events

FaultPlan = Callable[[object], "str | None"]


def _every(n: int, action: str) -> FaultPlan:
    """Hit the frame that carries every ``n``-th new event. A burst frame counts all its new
    events; resent events do not count, so a resent burst is not hit again and again."""
    counted = [0]
    newest: dict[object, int] = {}  # attempt -> highest event number seen

    def plan(message: object) -> str | None:
        if isinstance(message, Event):
            attempt, last = message.attempt, message.seq
        elif isinstance(message, Events):
            attempt, last = message.attempt, message.first_seq + len(message.payloads) - 1
        else:
            return None
        seen = newest.get(attempt, -1)
        if last <= seen:
            return None
        newest[attempt] = last
        before = counted[0]
        counted[0] = before + (last - seen)
        return action if counted[0] // n > before // n else None

    return plan


PLANS: dict[str, Callable[[], FaultPlan]] = {
    # a subtask's connection dropped in the middle of sending (before the event is handled)
    "drop-mid-send": lambda: _every(5, "drop-before"),
    # an acknowledgement lost (the event is handled, the connection closes without a reply)
    "lose-ack": lambda: _every(4, "drop-after"),
    # an acknowledgement delayed by 1.5 s (several checkpoint intervals of the tests)
    "delay-ack": lambda: _every(6, "delay:1.5"),
}


def fault_plan(name: str) -> FaultPlan:
    """A fresh plan by name; a clear error for an unknown one."""
    try:
        return PLANS[name]()
    except KeyError:
        raise ValueError(f"unknown channel fault plan {name!r}; known: {sorted(PLANS)}") from None
