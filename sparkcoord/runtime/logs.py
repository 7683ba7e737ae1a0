"""Where sparkcoord's log lines go when nobody configured Python logging.

Spark's source runner is a Python process Spark starts; its stderr reaches the Spark driver's
stderr (the console of a local job, the driver's log on a cluster), beside log4j's lines. With
no handler configured Python prints only WARNING and above, without the logger's name, through
its last-resort handler, and drops the INFO lines (restores, seals, completions, task
retries). :func:`install_log_handler` gives the ``sparkcoord`` logger one stderr handler in
log4j's shape (``25/11/24 12:00:01 INFO sparkcoord.runtime.service: sealed epoch 3: ...``),
unless the process already configured logging: then its configuration wins. Thread model: any
thread; idempotent.
"""

from __future__ import annotations

import logging
import sys
import threading

#: the levels a job's ``log_level`` may name
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_DATE = "%y/%m/%d %H:%M:%S"
_lock = threading.Lock()


class _SparkcoordHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler installed here (so a second call changes only the level)."""


def check_level(level: str) -> str:
    """``level`` in upper case, or a ValueError naming the levels there are."""
    name = str(level).strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log_level {level!r}: use one of {', '.join(LEVELS)}")
    return name


def install_log_handler(level: str = "INFO") -> bool:
    """Send the ``sparkcoord`` logger's lines of ``level`` and above to stderr, unless this
    process configured logging itself (a handler on the root or the ``sparkcoord`` logger);
    whether the handler is (now) installed."""
    name = check_level(level)
    logger = logging.getLogger("sparkcoord")
    with _lock:
        ours = [h for h in logger.handlers if isinstance(h, _SparkcoordHandler)]
        if not ours and (logger.handlers or logging.getLogger().handlers):
            return False  # the program's own logging configuration decides
        if not ours:
            handler = _SparkcoordHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_FORMAT, _DATE))
            logger.addHandler(handler)
            logger.propagate = False  # one line, not one more through the root
        logger.setLevel(name)
        return True
