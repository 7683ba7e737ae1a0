"""Which data files a lake sink deletes: never a committed one, never another writer's.

Tasks write files before the coordinator knows of them, so files nobody will commit are left
behind: by task attempts that failed or were speculated away, by a batch replayed after a
driver restart (its first run's files are not reported again), and by epochs whose batch
reported nothing. :func:`files_to_delete` decides which to delete from facts alone; the two
functions at the end list and delete (the only I/O here), run by the sink's coordinator on
its commit worker thread, after an epoch's commit and once at start (the orphan sweep).

Rules:
  1. Only ours: a file is a candidate only if its name parses as one of our data files
     (``files.py`` rule 1) or as a file one of our ``merge`` commits wrote
     (``mergefiles.py`` rule 1), *with this job's id*. Anything else in the table's location
     (the table's own metadata, another writer's or another job's files) is never touched.
     A merge file is seen only by the sweep at start (rule 4: the listing after a commit
     asks for the tasks' prefix), which holds every file the table references: one the
     table does not is what a commit killed before its transaction landed left behind.
  2. Only final epochs: a file of epoch E is a candidate only once the batch of E committed in
     Spark (E <= ``final_through``). Until then its batch may still report it (a running
     attempt, or a restore replaying the batch's logged reports), and a reported file may be
     committed.
  3. Never a held file: a candidate is kept if the table references it (any version the table
     still keeps: Delta's current files and tombstones, Iceberg's files of every live
     snapshot) or an epoch not yet committed holds it (the ledger's pending commits). What is
     left is garbage: a file of a final epoch that no commit holds now can never be committed,
     because an epoch's file set is fixed when its batch commits (the commit ledger's rule 2).
  4. The sweep at start is the same decision over the whole data directory, with
     ``final_through`` the newest epoch the restored checkpoint saw committed in Spark; after
     an epoch's commit, over that epoch's files (a prefix listing).

Thread model: none for :func:`files_to_delete`; the I/O helpers run on any one thread.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from sparkcoord.sinks.files import DATA_DIR, check_job_id, parse_file_name
from sparkcoord.sinks.mergefiles import parse_merge_name


def files_to_delete(job_id: str, listed: Iterable[str], *, final_through: int,
                    held: Iterable[str]) -> list[str]:
    """Of ``listed`` (paths relative to the table), the ones to delete (rules 1-3), sorted."""
    check_job_id(job_id)
    keep = set(held)
    out = []
    for path in listed:
        base = posixpath.basename(path)
        name = parse_file_name(base) or parse_merge_name(base)
        if name is None or name.job_id != job_id:
            continue  # rule 1
        if name.epoch > final_through:
            continue  # rule 2
        if path in keep:
            continue  # rule 3
        out.append(path)
    return sorted(out)


def epoch_prefix(job_id: str, epoch: int) -> str:
    """The name prefix of every file of ``epoch`` (for the listing after its commit, rule 4)."""
    return f"sc-{check_job_id(job_id)}.e{epoch}."


# ---------------------------------------------------------------------- I/O (the only here)
def list_data_files(location: str, *, prefix: str = "",
                    storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The files in the table's data directory whose names start with ``prefix``, relative to
    the table (``data/<name>``). Empty if the directory does not exist."""
    fs, root = _filesystem(location, storage_options)
    directory = f"{root}/{DATA_DIR}"
    # an object store's filesystem keeps listings (s3fs: for good) and is shared in this
    # process: the tasks wrote since, in other processes
    fs.invalidate_cache(directory)
    try:
        # a prefix goes to the store (an object store lists only the names under it)
        names = (fs.glob(f"{directory}/{prefix}*") if prefix
                 else fs.ls(directory, detail=False))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        base = str(name).rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(prefix):
            out.append(f"{DATA_DIR}/{base}")
    return out


def delete_files(location: str, paths: Iterable[str], *,
                 storage_options: Mapping[str, Any] | None = None) -> int:
    """Delete ``paths`` (relative to the table); one already gone is fine (a cleanup retried
    after a crash half way). How many were deleted."""
    fs, root = _filesystem(location, storage_options)
    count = 0
    for path in paths:
        try:
            fs.rm_file(f"{root}/{path}")
            count += 1
        except FileNotFoundError:
            pass
    return count


def _filesystem(location: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    from sparkcoord.sinks.tables import storage_options_for

    # in fsspec's names (target.py): a sink's options may be named for delta-rs
    fs, root = url_to_fs(location, **storage_options_for("fsspec", storage_options or {}))
    return fs, str(root).rstrip("/")
