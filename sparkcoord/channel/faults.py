"""Channel fault plans for tests, and the faults they inject (issue: channel faults must not
cost the normal path).

Rules:
  1. A plan is a function the channel server calls with each authenticated message when (and
     only when) ``ChannelServer.fault`` is set; it answers what to do to that message: None
     (nothing), "drop-before" (close without handling it), "drop-after" (handle it, then close
     without replying: a lost acknowledgement) or "delay:<seconds>" (then handle it).
  2. The messages a plan does not hit go the production way: batched per read, as without a
     plan; the frames before a hit one go as one batch first, then the fault happens to the
     hit one (:func:`inject`), so fault tests run the path a job runs. Without a plan the
     server pays one check per frame.
  3. The Spark adapter sets one from ``CoordinatedJob(channel_fault_plan=...)``; nothing else
     does, outside tests.

Thread model: a plan and :func:`inject` run on the server's I/O loop.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from sparkcoord.channel.connection import Writer
from sparkcoord.channel.frames import Event, Events, Message

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


def inject(action: str, message: Message, sock: socket.socket, writer: Writer,
           dispatch: Callable[[list[Message], Writer], object]) -> bool:
    """Do the plan's ``action`` to ``message`` (rule 1), after the frames before it went the
    production way (rule 2). ``dispatch``: the server's batch dispatch, for the message a lost
    acknowledgement handles. True when the connection ended (the server ends its bookkeeping
    of it); False when the message goes on the production way, after a delay. The I/O loop."""
    if action == "drop-before":
        sock.close()
        return True
    if action == "drop-after":
        writer.closed = True  # a lost answer: nothing more is written to this connection
        dispatch([message], writer)
        sock.close()
        return True
    if action and action.startswith("delay:"):
        threading.Event().wait(float(action.split(":", 1)[1]))
    return False
