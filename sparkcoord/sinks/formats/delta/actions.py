"""What the sink writes into a Delta table's log and reads back from it, shared by the
committer's append path (``commit.py``) and its merge path (``merge.py``): the add action of
a reported file with Delta's statistics built from the task's (``files.py`` rule 3), the
application transaction id of a run (``commit.py`` rule 1), and a path as the log stores it.

Thread model: pure functions (the commit worker thread calls them).
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

from sparkcoord.sinks.files import DataFile


def run_app_id(job_id: str, run_id: str) -> str:
    """The application transaction id that records which epochs ``run_id`` committed."""
    return f"{job_id}/run/{run_id}"



def _unquote(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)  # the log stores paths URL-encoded


def add_action(file: DataFile, *, data_change: bool = True) -> Any:
    """The Delta add action of a reported file: its stats JSON from the task's statistics
    (``data_change`` false: a compaction's output, rule 5)."""
    from deltalake.transaction import AddAction

    return AddAction(file.path, file.bytes, {}, int(time.time() * 1000), data_change,
                     json.dumps(delta_stats(file), separators=(",", ":")))


def delta_stats(file: DataFile) -> dict[str, Any]:
    """Delta's ``stats`` of ``file``: numRecords, minValues, maxValues, nullCount. A bound
    JSON cannot carry exactly (a decimal, bytes) is left out, as the task left out the ones it
    could not know (``files.py`` rule 3)."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, stats in file.columns:
        if stats.null_count is not None:
            nulls[name] = stats.null_count
        if stats.min is not None and stats.max is not None:
            try:
                lo, hi = _json_bound(stats.min, up=False), _json_bound(stats.max, up=True)
            except (OverflowError, ValueError, TypeError):
                continue  # a bound JSON cannot carry is left out (files.py rule 3)
            if lo is not None and hi is not None:
                low[name], high[name] = lo, hi
    return {"numRecords": file.rows, "minValues": low, "maxValues": high, "nullCount": nulls}


_MILLISECOND = datetime.timedelta(milliseconds=1)


def _json_bound(value: Any, *, up: bool) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime):
        # Delta keeps timestamps to the millisecond: a max is rounded up, a min down, so the
        # bounds still contain every value (a truncated max would let readers skip matches)
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc)
        extra = value.microsecond % 1000
        value = value - datetime.timedelta(microseconds=extra)
        if up and extra:
            if value > datetime.datetime.max.replace(tzinfo=value.tzinfo) - _MILLISECOND:
                return None  # no millisecond above it to round to: left out (files.py rule 3)
            value += _MILLISECOND
        text = value.replace(tzinfo=None).isoformat(timespec="milliseconds")
        return f"{text}Z" if value.tzinfo is not None else text
    if isinstance(value, datetime.date):
        return value.isoformat()
    return None
