"""Looking into a checkpoint directory: what ``sparkcoord inspect`` reports.

A checkpoint directory is either a :class:`~sparkcoord.spark.CoordinatedJob`'s
``checkpoint_dir`` (``spark/``: Spark's checkpoint location; ``coordination/<source>/``: one
directory per coordinated source) or one coordinated source's directory (``records/``,
``inbound/``, ``state/``; see :mod:`sparkcoord.runtime.storage` for the layout). For each
source the report holds:

* the restore point the next run would compute from Spark's logs (the newest batch in
  ``spark/offsets``, committed iff ``spark/commits`` has it, its epoch from our offset line) and
  the Spark batch -> epoch mapping;
* every checkpoint record: the coordinators' snapshots (size and first bytes; with ``decode``
  the state itself as JSON-able data, and its ``repr``) and the number of events each subtask
  receives in the epoch's batch;
* every inbound log: registrations, events per task attempt, its seal and whether it matches;
* every subtask's state files, its lineage marker and (with ``decode``) its newest state;
* the run in ``channel.json`` (never the channel secret) and the cause in
  ``last-failure.json``;
* the lease (``lease/``): which driver program holds it (host, pid, run, since, last
  renewal) and whether a run started now would be refused or take it over;
* ``problems``: every file that fails to decode or to verify, named, with the reason; the
  inspection goes on with the other files.

Rules:
  1. Read only: nothing is created, repaired or deleted (``CheckpointStorage`` creates its
     directories, so the files are read here through :mod:`sparkcoord.runtime.files`).
  2. Nothing is unpickled unless ``decode`` is true: unpickling runs code named in the file.
  3. The report is plain data (dicts, lists, strings, numbers, booleans, None), serialisable
     with :func:`json.dumps`; bytes appear only as sizes and hex prefixes. A decoded state
     (``decode``) is plain data too: :func:`plain_value` turns the unpickled object into it.
  4. A log whose last frame is cut short is damage when its batch committed (it has a seal,
     or Spark's commit log has a batch of its epoch) or when Spark's logs are not at hand to
     tell; it is expected of the running batch's log after a crash (a restore cuts the torn
     frame off, which no task was ever acknowledged).

Thread model: no state; any thread of any process (the ``sparkcoord inspect`` command calls it
from its main thread). Inspecting a directory a job is writing shows a moment's view; files
that change under the reader may be reported as problems.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sparkcoord.inspection.checkpoint import _inspect_source
from sparkcoord.inspection.common import NotACheckpoint, _problem, _visible, plain_value
from sparkcoord.inspection.spark_log import _SparkLog
from sparkcoord.inspection.text import render_text
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import files_for

__all__ = ["NotACheckpoint", "inspect_checkpoint", "plain_value", "render_text"]


def inspect_checkpoint(path: str, decode: bool = False) -> dict[str, Any]:
    """Everything stored under checkpoint directory ``path``, as JSON-serialisable data.

    ``path``: a ``CoordinatedJob``'s checkpoint_dir or one coordinated source's directory (a
    local path or any fsspec URL). ``decode``: unpickle coordinator snapshots and the newest
    subtask states; each then has ``"value"``, the state as plain data (:func:`plain_value`),
    and ``"repr"``, its ``repr()`` (this runs code from the files: only for checkpoints you
    trust, with the job's classes importable). Raises :class:`NotACheckpoint` when
    ``path`` is neither. Damaged files do not raise: they are listed under ``"problems"``.

    Called by the ``sparkcoord inspect`` command (its main thread) and by tools and tests (any
    thread, any process); it only reads.
    """
    files, root = files_for(path)
    names = _visible(files.names(root))
    problems: list[dict[str, Any]] = []
    spark_root: str | None = None
    if "coordination" in names or "spark" in names:
        kind = "job"
        coordination = posixpath.join(root, "coordination")
        source_roots = [(n, posixpath.join(coordination, n))
                        for n in sorted(_visible(files.names(coordination)))]
        if "spark" in names:
            spark_root = posixpath.join(root, "spark")
    elif names & {layout.RECORDS, layout.INBOUND, layout.STATE, layout.CHANNEL_INFO}:
        kind = "source"
        source_roots = [(posixpath.basename(root), root)]
        parent = posixpath.dirname(root)
        if posixpath.basename(parent) == "coordination":  # inside a job's checkpoint_dir
            candidate = posixpath.join(posixpath.dirname(parent), "spark")
            if files.names(candidate):
                spark_root = candidate
    else:
        raise NotACheckpoint(_not_a_checkpoint(path, names))

    spark = _SparkLog.read(files, spark_root, problems) if spark_root is not None else None
    sources = [_inspect_source(files, name, source_root, spark, decode, problems)
               for name, source_root in source_roots]
    if spark is not None and kind == "job":
        known = {name for name, _ in source_roots}
        for name in sorted(spark.source_names() - known):
            problems.append(_problem(name, posixpath.join(root, "coordination", name),
                                     f"Spark's offset log ({spark.root}/offsets) holds offsets of "
                                     f"coordinated source {name!r}, but its coordination "
                                     f"directory is missing"))
    return {
        "url": path,
        "path": root,
        "kind": kind,
        "spark_checkpoint": spark_root,
        "decoded": decode,
        "sources": sources,
        "problems": problems,
    }


def _not_a_checkpoint(path: str, names: set[str]) -> str:
    expected = ("expected a CoordinatedJob's checkpoint_dir (with coordination/ and spark/) or "
                "one coordinated source's directory (with records/, inbound/ and state/)")
    if not names:
        return f"{path}: no such directory, or an empty one; {expected}"
    shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
    return f"{path} is not a sparkcoord checkpoint directory (it holds {shown}); {expected}"
