"""Where sparkcoord's log lines go when nobody configured Python logging.

Spark's source runner is a Python process Spark starts; its stderr reaches the Spark driver's
stderr (the console of a local job, the driver's log on a cluster), beside log4j's lines. With
no handler configured Python prints only WARNING and above, without the logger's name, through
its last-resort handler. :func:`install_log_handler` gives the ``sparkcoord`` logger one stderr
handler in log4j's shape (``25/11/24 12:00:01 INFO sparkcoord.runtime.service: sealed epoch 3:
...``) at the job's ``log_level`` (WARNING by default, as Spark's console; INFO shows restores,
seals, completions, task retries and query starts). The handler stands aside as soon as the
process configures logging itself (a handler on the root logger, even one added later): the
records then propagate to the program's own handlers, once. Thread model: any thread;
idempotent.
"""

from __future__ import annotations

import logging
import sys
import threading

#: the levels a job's ``log_level`` may name (WARN is log4j's name for WARNING)
LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_DATE = "%y/%m/%d %H:%M:%S"
_lock = threading.Lock()
#: whether the ``sparkcoord`` logger's level is ours to set (it was unset, or we set it)
_level_is_ours = False


class _SparkcoordHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the current ``sys.stderr`` (looked up per line, so a redirect made later,
    e.g. by a progress display, applies) while the root logger has no handler."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(_FORMAT, _DATE))

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:  # StreamHandler.__init__ assigns it
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers and super().filter(record) is not False


def check_level(level: str) -> str:
    """``level`` in upper case (WARN read as WARNING), or a ValueError naming the levels."""
    name = str(level).strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log_level {level!r}: use one of {', '.join(LEVELS)}")
    return "WARNING" if name == "WARN" else name


def install_log_handler(level: str = "WARNING") -> bool:
    """Give the ``sparkcoord`` logger its stderr handler at ``level``, unless this process
    configured logging itself (a handler on the root or the ``sparkcoord`` logger, or a level
    it set on ``sparkcoord``); whether sparkcoord's handler is (now) in place."""
    global _level_is_ours
    name = check_level(level)
    logger = logging.getLogger("sparkcoord")
    with _lock:
        ours = [h for h in logger.handlers if isinstance(h, _SparkcoordHandler)]
        if not ours and (logger.handlers or logging.getLogger().handlers):
            return False  # the program's own logging configuration decides
        if not ours:
            logger.addHandler(_SparkcoordHandler())
            _level_is_ours = _level_is_ours or logger.level == logging.NOTSET
        if _level_is_ours:
            logger.setLevel(name)
        return True
