"""Test-only process kills at named points of the protocol (the driver-kill scenarios).

Switched on only by the environment variable ``SPARKCOORD_TEST_KILL=<point>:<min epoch>:<dir>``,
read once at import; otherwise :func:`kill_point` is one ``is None`` check. At the first time
``point`` is reached with an epoch >= ``min epoch`` (remembered across restarts by a marker
file in ``dir``), every process of the caller's *session* is killed with SIGKILL: the driver
program, Spark's JVM, the source runner and the Python workers (which PySpark puts in process
groups of their own), as when a driver machine dies. So the job must run in a session of its
own (``subprocess.run(..., start_new_session=True)``); Linux only (reads /proc).

Points: ``sealing`` (every coordinator completed, record not written), ``sealed`` (record
durable, offset not yet returned to Spark), ``mid-batch`` (a task sent its events, before it
finished), ``answered`` (a task got the logged answer to a request, mid-batch),
``sink-committed`` (the sink committed, Spark's commit log not written); the lake sink's
``lake-written`` (a task closed a data file, not reported yet), ``lake-committing`` (the
batch committed in Spark, the table commit not made), ``lake-committed`` (the table commit
made, not reported done), ``lake-cleaning`` (a cleanup deleted one file of several) and
``lake-compacted`` (a task rewrote a compaction bin, not reported yet).
"""

from __future__ import annotations

import os
import signal

_PLAN = os.environ.get("SPARKCOORD_TEST_KILL")
#: whether a kill is planned in this process: hot paths (a task's request) test this constant
#: before calling :func:`kill_point`, so that a switch that is off costs them nothing
KILLS_PLANNED = _PLAN is not None
POINTS = ("sealing", "sealed", "mid-batch", "answered", "sink-committed", "lake-written",
          "lake-committing", "lake-committed", "lake-cleaning", "lake-compacted")


def kill_point(point: str, epoch: int) -> None:
    """Kill the process group here if the test plan says so (any process, any thread)."""
    if _PLAN is None:
        return
    name, min_epoch, marker_dir = _PLAN.split(":", 2)
    if name != point or epoch < int(min_epoch):
        return
    os.makedirs(marker_dir, exist_ok=True)
    try:
        fd = os.open(os.path.join(marker_dir, f"killed-{point}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(epoch).encode())
    os.fsync(fd)
    os.close(fd)
    kill_session(os.getsid(0))
    os.kill(os.getpid(), signal.SIGKILL)


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` but the caller: a driver program, its JVM, the
    source runner and the Python workers (in process groups of their own, in its session), as
    when the driver's machine dies. Also ``sparkcoord demo pipeline``'s kill of its job, a
    process it started with ``start_new_session=True`` (whose pid is the session's id)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getsid(int(entry)) == session:
                    os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
