"""Checks for every test: no thread that talks to a coordination service outlives its test.

A client left retrying a channel after its test ended reconnects (and sleeps) on its own in
every later test of the process, which those tests then see (a record of the client's sleeps,
a connection count). The guard fails the test that left one, after a generous join, naming
the thread with its stack. Ours, and only ours, are:

  * a thread running the channel client's code (``sparkcoord/channel/client.py``: a task's
    ``ChannelClient``, a driver program's ``JobClient``) or ``CoordinatedJob.request``,
    whatever its name: the client starts no thread of its own, so it is the test's thread, or
    the library's that uses it;
  * a thread of the names in :data:`GUARDED_NAMES`: a channel server's accept thread (a server
    never closed still accepts: its clients retry instead of being refused) and a job handle's
    thread (it asks the coordinators through a ``JobClient`` from ``until``).

Threads alive before the test started (a module's or the session's fixtures, sparkcoord's one
timer thread, py4j's and Spark's threads) are not looked at.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator

import pytest

#: sparkcoord's thread names checked (exact names: ``sparkcoord-channel-io``, the server's I/O
#: loop, serves an open connection until its peer closes it, and is not one of them)
GUARDED_NAMES = frozenset({"sparkcoord-channel", "sparkcoord-job"})
#: how long the guard waits for such a thread to end after its test (a client refused by a
#: closed service gives up within about 1.3 s; a server's accept thread ends at close())
JOIN_S = 15.0
_CLIENT_FILE = os.path.join("sparkcoord", "channel", "client.py")
#: where ``CoordinatedJob.request`` runs: its public face, and the client side that waits
_REQUEST_FILES = (os.path.join("sparkcoord", "spark", "job.py"),
                  os.path.join("sparkcoord", "spark", "requests.py"))


def in_channel_client(thread: threading.Thread) -> bool:
    """Whether ``thread`` is running the channel client's code now, or a driver program's
    ``CoordinatedJob.request`` (which waits for the next run between its client's tries)."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_CLIENT_FILE) or (
                code.co_filename.endswith(_REQUEST_FILES) and code.co_name == "request"):
            return True
        frame = frame.f_back
    return False


def ours(thread: threading.Thread) -> bool:
    return thread.name in GUARDED_NAMES or in_channel_client(thread)


def lingering(started: Iterable[threading.Thread], join_s: float = JOIN_S
              ) -> list[threading.Thread]:
    """Of the threads ``started`` (during a test), those of ours still alive after waiting up
    to ``join_s`` in all for them to end."""
    me = threading.current_thread()
    suspects = [t for t in started if t is not me and t is not threading.main_thread()
                and t.is_alive() and ours(t)]
    deadline = time.monotonic() + join_s
    for thread in suspects:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in suspects if t.is_alive() and ours(t)]


def describe(threads: Iterable[threading.Thread]) -> str:
    frames = sys._current_frames()
    parts = []
    for thread in threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (no stack)\n"
        parts.append(f"thread {thread.name!r} (daemon={thread.daemon}):\n{stack}")
    return "\n".join(parts)


@pytest.fixture(autouse=True)
def no_channel_thread_outlives_its_test() -> Iterator[None]:
    """Autouse, so set up before and torn down after the test's other function fixtures (a
    ``running`` service and server are closed by then)."""
    before = set(threading.enumerate())
    yield
    left = lingering([t for t in threading.enumerate() if t not in before])
    if left:
        pytest.fail(f"{len(left)} thread(s) talking to a coordination service outlived the test "
                    f"(still alive {JOIN_S:.0f} s after it ended; close the client, the server, "
                    f"stop the job handle):\n{describe(left)}", pytrace=False)
