"""Our offsets in Spark's offset log: what a coordinated source returns, and how the log is read.

Rules:
  1. An offset is ``{"sparkcoord": <source name>, "epoch": N}`` (``MARKER``); ``initialOffset``
     is epoch -1. An offset of anything else is a clear error naming the source.
  2. Spark's offset log holds one file per batch, ``offsets/<batch>``: a version line ``v1``,
     a metadata line, then one line per source of the query (a JSON offset, or ``-`` for a
     source without one). A batch carries a new epoch of a source iff its epoch differs from
     the one of the batch before.

Imports nothing of pyspark (``inspect`` and the tasks of a downstream operator read the log).
Thread model: none (pure functions).
"""

from __future__ import annotations

import json
from typing import Any

from sparkcoord.core.errors import SparkCoordError

MARKER = "sparkcoord"


def offset(name: str, epoch: int) -> dict[str, Any]:
    return {MARKER: name, "epoch": epoch}


def epoch_of(name: str, value: dict[str, Any]) -> int:
    """The epoch in one of our offsets; a clear error for anything else."""
    if not isinstance(value, dict) or value.get(MARKER) != name or "epoch" not in value:
        raise ValueError(f"offset {value!r} does not belong to coordinated source {name!r} "
                         "(was the checkpoint location reused for another query?)")
    return int(value["epoch"])


def offset_values(data: bytes, path: str) -> list[Any]:
    """The offset of each source in one offset log file (``None`` for ``-``), rule 2; a
    :class:`SparkCoordError` naming ``path`` for a file that is not one."""
    try:
        lines = data.decode().splitlines()
    except UnicodeDecodeError as exc:
        raise SparkCoordError(f"{path}: not text ({exc})") from None
    if not lines or lines[0] != "v1":
        raise SparkCoordError(f"{path}: unknown offset log version {lines[:1]}, expected ['v1']")
    values: list[Any] = []
    for line in lines[2:]:
        try:
            values.append(json.loads(line))
        except ValueError:
            values.append(None)  # "-": a source without an offset in this batch
    return values


def source_epoch(values: list[Any], source: str) -> int | None:
    """The epoch of coordinated source ``source`` among one batch's offsets; None if the batch
    holds no offset of it (or an unreadable one)."""
    for value in values:
        if isinstance(value, dict) and value.get(MARKER) == source and "epoch" in value:
            try:
                return int(value["epoch"])
            except (TypeError, ValueError):
                return None
    return None
