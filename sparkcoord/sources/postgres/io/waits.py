"""What a read of the slot waits for: the WAL flushed to where it reads (a peek reads flushed
WAL only: replication.py rule 3), and the slot free of another session (a peek or an advance
holds it for its duration).

Rules:
  1. A peek or an advance that finds the slot held by another session (several readers peek
     it at once during the snapshot; the enumerator advances it while the stream reader
     peeks) is made again after a short random pause, the pause doubling up to 0.2 s, until
     the caller's timeout; any other error, and the last one after the timeout, is raised.
  2. A read up to a position first waits until the WAL is flushed to it, polling, until the
     caller's timeout (then an error).

Thread model: the calling thread (a reader's task, the enumerator's slot lane); the
connection is the caller's. psycopg is not imported here (the reader imports this module at
its top).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text
from sparkcoord.sources.postgres.errors import PostgresSourceError, SlotProblem

log = logging.getLogger("sparkcoord.sources.postgres")


def slot_in_use(error: BaseException) -> bool:
    """Whether ``error`` says another session holds the slot right now (a peek or an advance
    acquires it for its duration: PostgreSQL's "replication slot ... is active for PID")."""
    return isinstance(error, SlotProblem) and "in use by another process" in str(error)


def while_slot_busy(action: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``action()``, again after a short random pause while another session holds the slot
    (several readers peek it at once during the snapshot, and the enumerator advances it
    while the stream reader peeks), until ``timeout_s`` (rule 1). Called by the reader's chunk
    and stream reads (the Spark task's thread) and the enumerator's advance (its slot lane)."""
    import random

    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            return action()
        except SlotProblem as e:
            if not slot_in_use(e) or time.monotonic() > deadline:
                raise
            log.debug("%s: the slot is busy, trying again", what)
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.2)


def wait_for_flush(conn: Any, lsn: int, timeout_s: float) -> None:
    """Until the WAL is flushed to ``lsn`` (rule 2: a peek reads flushed WAL only). Called by
    the reader's chunk and stream reads, in the Spark task's thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        if row is not None and lsn_from_text(row[0]) >= lsn:
            return
        if time.monotonic() > deadline:
            raise PostgresSourceError(f"the WAL was not flushed to the chunk's high watermark "
                                      f"within {timeout_s} s")
        time.sleep(0.01)
