"""Spark's offset and commit logs of a query, read for the inspection: the batch -> epoch
mapping and the restore point the next run would compute.

Thread model: none.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.ids import NO_EPOCH
from sparkcoord.core.text import plural
from sparkcoord.inspection.common import _problem, _read
from sparkcoord.runtime.files import Files
from sparkcoord.runtime.layout import epoch_in
from sparkcoord.spark.offsets import MARKER, offset_values, source_epoch


class _SparkLog:
    """Spark's offset and commit logs of the query (read once, shared by the sources)."""

    def __init__(self, root: str, offsets: dict[int, list[Any]], commits: set[int]) -> None:
        self.root = root
        self.offsets = offsets  # batch -> the parsed offset line of each source (None: none)
        self.commits = commits

    @classmethod
    def read(cls, files: Files, root: str, problems: list[dict[str, Any]]) -> _SparkLog:
        def problem(file: str, message: str) -> None:
            problems.append(_problem(None, file, message))

        offsets: dict[int, list[Any]] = {}
        directory = posixpath.join(root, "offsets")
        for name in files.names(directory):
            batch = epoch_in(name, "")
            if batch is None:
                continue  # .crc and temporary files
            path = posixpath.join(directory, name)
            data = _read(files, path, problem)
            if data is None:
                continue  # purged by a running query since the listing, or unreadable
            try:
                values = offset_values(data, path)
            except SparkCoordError as exc:
                problem(path, str(exc))
                continue
            offsets[batch] = values
        commits = {b for b in (epoch_in(n, "") for n in
                               files.names(posixpath.join(root, "commits"))) if b is not None}
        return cls(root, offsets, commits)

    def source_names(self) -> set[str]:
        return {v[MARKER] for values in self.offsets.values() for v in values
                if isinstance(v, dict) and isinstance(v.get(MARKER), str)}

    def epoch(self, source: str, batch: int) -> int | None:
        return source_epoch(self.offsets.get(batch, []), source)

    def batches(self, source: str) -> list[dict[str, Any]]:
        """Each logged batch: its epoch of ``source``, whether it committed, whether the epoch
        is new in it (as a downstream operator decides: sparkcoord.spark.recipient)."""
        out = []
        for batch in sorted(self.offsets):
            epoch = self.epoch(source, batch)
            if batch == 0:
                previous: int | None = NO_EPOCH
            else:
                previous = self.epoch(source, batch - 1) if batch - 1 in self.offsets else None
            new = (None if epoch is None or previous is None
                   else epoch != previous and epoch != NO_EPOCH)
            out.append({"batch": batch, "epoch": epoch, "committed": batch in self.commits,
                        "new_epoch": new})
        return out


def _rerun_action(restore: dict[str, Any]) -> str:
    """What a restore to the uncommitted epoch of ``restore`` does with its inbound log, as
    the restore does it (``kept_at_rerun``; docs/protocol.md [rerun-keeps-answered-histories])."""
    epoch, batch, kept = restore["epoch"], restore["batch"], restore["kept_at_rerun"]
    rerun = f"Spark reruns batch {batch}"
    if kept is None:
        return (f"the next run restores snapshot {epoch}; inbound log {epoch} is missing or "
                f"unreadable, so no logged request is kept; {rerun}")
    if kept["kept_entries"] == 0:
        return (f"the next run restores snapshot {epoch}, truncates inbound log {epoch} "
                f"({plural(kept['logged_entries'], 'entry', 'entries')} dropped: no request "
                f"was answered in it) and {rerun}")
    what = []
    if kept["operators"]:
        what.append(f"every entry of {', '.join(kept['operators'])}, asked requests in it")
    if kept["client_entries"]:
        what.append(f"{kept['client_entries']} client request and answer entries")
    return (f"the next run restores snapshot {epoch}, keeps {kept['kept_entries']} of the "
            f"{kept['logged_entries']} entries of inbound log {epoch} ({' and '.join(what)}) "
            f"and hands them to the coordinators again, truncating the rest; {rerun}, whose "
            f"tasks get the logged answers")


def _restore_point(spark: _SparkLog | None, source: str) -> dict[str, Any]:
    if spark is None:
        return {"status": "unknown", "epoch": None, "batch": None, "committed": None,
                "action": "Spark's checkpoint location (spark/ next to coordination/) was not "
                          "found: the restore point cannot be told"}
    if not spark.offsets:
        return {"status": "fresh", "epoch": NO_EPOCH, "batch": None, "committed": True,
                "action": "Spark logged no batch: the next run starts fresh"}
    batch = max(spark.offsets)
    epoch = spark.epoch(source, batch)
    committed = batch in spark.commits
    if epoch is None:
        return {"status": "unknown", "epoch": None, "batch": batch, "committed": committed,
                "action": f"Spark's newest batch {batch} holds no offset of this source"}
    if epoch == NO_EPOCH:
        return {"status": "fresh", "epoch": NO_EPOCH, "batch": batch, "committed": committed,
                "action": "no epoch of this source was logged: the next run starts fresh"}
    if committed:
        return {"status": "committed", "epoch": epoch, "batch": batch, "committed": True,
                "action": f"the next run restores snapshot {epoch} and replays inbound log "
                          f"{epoch}"}
    # the action is completed from the inbound log: what the rerun keeps of it
    return {"status": "uncommitted", "epoch": epoch, "batch": batch, "committed": False,
            "action": f"the next run restores snapshot {epoch} and Spark reruns batch {batch}"}
