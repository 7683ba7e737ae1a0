"""Commit a lake sink's epochs to a Delta table with ``deltalake`` (delta-rs), once each.

Rules:
  1. One epoch, one Delta transaction: the add actions of every file the epoch's tasks
     reported (``files.DataFile``, stats carried over, the files not opened again) and two
     application transactions: ``(job id, epoch)`` and ``(job id/run/run id, epoch)``. The
     first says which epochs the table holds for the job (``transaction_version``, fencing
     rules 1-4 in ``fencing.py``); the second which of them this run committed (fencing
     rule 3). The commit's info carries the job id, the epoch and the run id for people
     reading the table's history.
  2. Before each commit the table is read again and the fence decides: commit, skip an epoch
     the table holds (reported as :data:`~sparkcoord.sinks.fencing.ALREADY_COMMITTED`), or
     refuse. A second writer racing us for the same epoch loses at the table: delta-rs fails a
     commit whose application transaction's app id a concurrent winning commit also carries
     (``ConcurrentTransaction``), and the commit worker's retry then meets the fence.
  3. The table is created by the first commit if it does not exist (version 0 holds that
     epoch's files and transactions), from the sink's Arrow schema, so a job whose first epochs
     are empty leaves no table behind.
  4. Mode ``append`` adds the reported files; mode ``merge`` (a change stream, issue 28 item
     6) applies the epoch's reduced changes by key (``changes.py``) by copy-on-write
     (``mergefiles.py`` rule 3): the current files holding a changed key (pruned by their
     add actions' key statistics, then read) are removed and rewritten without those rows,
     the rows put are added as new files, in the epoch's one transaction with the same
     application transactions, so it is fenced and idempotent per epoch alike; small current
     files are folded into the epoch's output (``mergefold.py``; their rows are in the same
     new files as the changed ones, so their removes are data changes like the others). Not
     delta-rs's merge: it names the files it writes its own way, and a driver killed before
     its commit would leave them where no sweep may tell them from another writer's; ours
     are named ``sc-<job>.m<epoch>...`` and the sweep at the next start deletes them
     (``cleanup.py`` rule 1). Not retried by delta-rs over a commit that landed meanwhile
     (``max_commit_retries=0``, as rule 5: a removed file may have changed); an attempt
     that so fails deletes the files it wrote, only on proof that it did not land: the log
     entry of the one version it could have written is another writer's (the commit worker
     retries with new files; what a kill or an error leaves is the sweep's); a table whose
     protocol allows deletion vectors is refused (``ChangeStreamError``, the job fails
     naming it): a rewrite of the raw files would bring deleted rows back. A partitioned
     table is refused in both modes (``TableShapeError`` at open and at a commit): the
     sink's files hold every column and its add actions no partition values. So is a table
     with column mapping (``delta.columnMapping.mode`` ``name`` or ``id``): its readers look
     columns up in the files by physical names, which the sink's files do not use, and would
     read nulls. The reported
     files are staging files the table never references (cleanup deletes them after the
     commit).
  5. Compaction (``compaction.py`` rule 4, mode ``append``): an epoch's commit carries its
     swaps too, a remove action per input and an add action per output, both with
     ``dataChange`` false (the table's rows do not change: a streaming reader of the table
     skips them). A swap one of whose inputs is not among the table's current files is left
     out (:attr:`DeltaCommitter.left_out`), and so is every swap of a table whose protocol
     allows deletion vectors. A commit with swaps is not retried by delta-rs over a commit
     that landed since the table was read (``max_commit_retries=0``): delta-rs would rebase
     the blind append over another writer's OPTIMIZE or DELETE of an input and the rows
     would be in the table twice (a review found it); the commit worker's retry reads the
     table again and leaves such a swap out.

Where: this module holds the committer with its append path (rules 1-3 and 5), the fence
and the queries; the merge path (rule 4) is :class:`~sparkcoord.sinks.formats.delta.merge.
DeltaMerge` in ``merge.py``, which the committer is made of; what both write into the log
(add actions and their statistics, the run's application transaction id) is ``actions.py``.
``sparkcoord.sinks.delta``, the committer's path before issue 44, is this module (an alias).

Thread model: :meth:`DeltaCommitter.open` and :meth:`DeltaCommitter.commit` run on the sink
coordinator's commit worker thread (``sparkcoord.committer.worker``), one at a time; the
queries (:meth:`DeltaCommitter.table_epoch`, :meth:`DeltaCommitter.referenced_paths`) on any
thread that does not race them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, NO_EPOCH, Decision, EpochFence
from sparkcoord.sinks.files import DataFile, check_job_id
from sparkcoord.sinks.formats.delta.actions import _unquote, add_action, delta_stats, run_app_id
from sparkcoord.sinks.formats.delta.merge import DeltaMerge
from sparkcoord.sinks.tables import TableShapeError, check_table_schema, storage_options_for

#: the old path's (``sinks/delta.py``) public names: the ones that moved to ``actions.py`` are
#: still importable from here
__all__ = ["EPOCH_KEY", "JOB_KEY", "RUN_KEY", "DeltaCommitter", "add_action", "delta_stats",
           "run_app_id"]
#: Keys of the commit info (rule 1).
JOB_KEY, EPOCH_KEY, RUN_KEY = "sparkcoord.job-id", "sparkcoord.epoch", "sparkcoord.run-id"


class DeltaCommitter(DeltaMerge):
    """Commits the epochs of job ``job_id`` to the Delta table at ``table_uri`` (rules 1-4)."""

    def __init__(self, table_uri: str, job_id: str, schema: Any, *,
                 storage_options: Mapping[str, str] | None = None,
                 run_id: str | None = None,
                 configuration: Mapping[str, str | None] | None = None,
                 fsspec_options: Mapping[str, Any] | None = None) -> None:
        """``schema``: the sink's ``pyarrow.Schema`` (the table's, when rule 3 creates it);
        ``run_id``: this coordinator start's id (a fresh one by default); ``configuration``:
        Delta table properties for a table rule 3 creates; ``storage_options``: delta-rs's
        names; ``fsspec_options``: the same store in fsspec's names, for reading the log
        directly (default: translated from ``storage_options``, which loses fsspec-only
        settings such as ``client_kwargs``)."""
        self.table_uri = table_uri.rstrip("/")
        self.job_id = check_job_id(job_id)
        self.schema = schema
        self.storage_options = dict(storage_options or {})
        self.fsspec_options = (dict(fsspec_options) if fsspec_options is not None else
                               None)
        self.run_id = run_id or uuid.uuid4().hex
        self.configuration = dict(configuration or {})
        self._fence: EpochFence | None = None
        self._table: Any = None
        #: the swaps the last :meth:`commit` left out (rule 5)
        self.left_out: list[Any] = []

    # ------------------------------------------------------------------ commands
    def prepare_table(self) -> str:
        """The table's location, where the tasks write (the driver program, when a sink is
        built). Nothing is made here: the first commit creates the table (rule 3)."""
        return self.table_uri

    def open(self, last_committed: int = NO_EPOCH, pending: Iterable[int] = ()) -> int:
        """Check the table against the restored checkpoint (commit worker thread, at the
        coordinator's start, before any commit): ``last_committed`` and ``pending`` are the
        epochs it saw reported done and not reported done. Returns the table's newest epoch
        for the job; raises per fencing rule 2."""
        table = self._load()
        if table is not None:
            self._check_shape(table)
        fence = EpochFence(self.table_uri, self.job_id, last_committed, pending)
        fence.opened(self.table_epoch())
        self._fence = fence
        return fence.known

    def _check_shape(self, table: Any) -> None:
        """Raise :class:`~sparkcoord.sinks.tables.TableShapeError` naming the table when it
        is not one the sink can write: other columns or types, or partitioned (the sink's
        files hold every column and its add actions carry no partition values; delta-rs
        would take them and the partition column would read back null: a review finding)."""
        import pyarrow as pa

        check_table_schema(self.table_uri, self.schema, pa.schema(table.schema().to_arrow()))
        partitioned = list(table.metadata().partition_columns)
        if partitioned:
            raise TableShapeError(
                f"Delta table {self.table_uri} is partitioned by {', '.join(partitioned)}; the "
                "sink writes unpartitioned Delta tables only: write to another table (or "
                "rewrite this one without partitions)")
        mapping = _column_mapping(table)
        if mapping != "none":
            raise TableShapeError(
                f"Delta table {self.table_uri} uses column mapping (delta.columnMapping.mode "
                f"{mapping!r}): its readers look columns up by physical names that the sink's "
                "files do not use, so they would read nulls; write to a table without column "
                "mapping")

    def _check_shape_since_open(self, table: Any) -> None:
        """At a commit (commit worker thread): :meth:`_check_shape` again if the table was
        made partitioned or column-mapped since :meth:`open` (cheap to tell; the full check
        reads the schema)."""
        if table.metadata().partition_columns or _column_mapping(table) != "none":
            self._check_shape(table)

    def commit(self, epoch: int, files: Sequence[DataFile],
               swaps: Sequence[Any] = ()) -> Decision:
        """Commit ``epoch``'s reported ``files`` and compaction ``swaps``
        (``compaction.FilesCompacted``, rule 5) in one transaction, unless the table holds it
        (commit worker thread, once the batch of ``epoch`` committed in Spark; again after a
        failure or a restore: idempotent per epoch). Raises
        :class:`~sparkcoord.sinks.fencing.SecondWriter` per fencing rules 3 and 4."""
        self.left_out = []
        decision, table, properties = self._decide(epoch)
        if decision == ALREADY_COMMITTED:
            return decision
        actions: list[Any] = [add_action(f) for f in files]
        if swaps:
            swapping = self._swap_actions(table, swaps)
            if swapping:
                actions += swapping
                properties.max_commit_retries = 0  # rule 5: fail, never rebase a swap
        if table is None:
            self._create(actions, properties)  # rule 3
        else:
            self._check_shape_since_open(table)
            table.create_write_transaction(actions, "append", table.schema(),
                                           commit_properties=properties)
        assert self._fence is not None
        self._fence.committed(epoch)
        return COMMIT

    def _swap_actions(self, table: Any, swaps: Sequence[Any]) -> list[Any]:
        """Rule 5: the actions of the swaps whose inputs are all current files."""
        from deltalake.transaction import RemoveAction

        features = (table.protocol().reader_features or []) if table is not None else []
        if "deletionVectors" in features:
            self.left_out.extend(swaps)  # a rewrite of the raw files would undo deletes
            return []
        current = self._current_sizes(table)
        now = int(time.time() * 1000)
        actions: list[Any] = []
        for swap in swaps:
            if any(p not in current for p in swap.inputs):
                self.left_out.append(swap)
                continue
            actions += [RemoveAction(p, False, now, current[p]) for p in swap.inputs]
            actions += [add_action(f, data_change=False) for f in swap.outputs]
        return actions

    @staticmethod
    def _current_sizes(table: Any) -> dict[str, int]:
        """The table's current data files (relative paths) and their sizes."""
        if table is None:
            return {}
        import pyarrow as pa

        adds = pa.table(table.get_add_actions())  # an arro3 batch: through the C stream
        return dict(zip((str(p) for p in adds.column("path").to_pylist()),
                        (int(b) for b in adds.column("size_bytes").to_pylist()), strict=True))

    def _decide(self, epoch: int) -> tuple[Decision, Any, Any]:
        """Rule 2: the fence's decision for ``epoch`` on the table as it is now, the table
        (None: not created yet), and the commit's properties (rule 1)."""
        from deltalake import CommitProperties, Transaction

        if self._fence is None:
            raise RuntimeError("DeltaCommitter.commit before open()")
        table = self._load()
        table_epoch = self._version(table, self.job_id)
        run_epoch = self._version(table, run_app_id(self.job_id, self.run_id))
        decision = self._fence.decide(epoch, table_epoch, run_epoch)
        if decision == ALREADY_COMMITTED:
            self._fence.committed(epoch)
        properties = CommitProperties(
            custom_metadata={JOB_KEY: self.job_id, EPOCH_KEY: str(epoch), RUN_KEY: self.run_id},
            app_transactions=[Transaction(self.job_id, epoch),
                              Transaction(run_app_id(self.job_id, self.run_id), epoch)])
        return decision, table, properties

    # ------------------------------------------------------------------ queries
    def table_epoch(self) -> int:
        """The newest epoch the table holds for the job (``NO_EPOCH``: none, or no table)."""
        return self._version(self._load(), self.job_id)

    def referenced_paths(self) -> set[str]:
        """Every data file path (relative to the table) the table references: in its current
        version, and as a removed file whose tombstone the log still keeps (a time-travel read
        of an older version still needs it; VACUUM, not us, deletes those). Read by the orphan
        sweep (``cleanup.py``)."""
        table = self._load()
        if table is None:
            return set()
        return set(self._current_sizes(table)) | self._removed_paths()

    # ------------------------------------------------------------------ internals
    def _fsspec_options(self) -> dict[str, Any]:
        return (dict(self.fsspec_options) if self.fsspec_options is not None else
                storage_options_for("fsspec", self.storage_options))

    def _files(self) -> tuple[Any, str]:
        """The table's store (fsspec) and its root there, without a trailing slash: where a
        merge reads and writes data files."""
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.table_uri, **self._fsspec_options())
        return fs, str(root).rstrip("/")

    def _load(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            # in delta-rs's names: the options may be a sink's, named for any library
            self._table = DeltaTable(self.table_uri, storage_options=storage_options_for(
                "delta", self.storage_options) or None)
        except TableNotFoundError:
            return None
        return self._table

    @staticmethod
    def _version(table: Any, app_id: str) -> int:
        if table is None:
            return NO_EPOCH
        version = table.transaction_version(app_id)
        return NO_EPOCH if version is None else int(version)

    def _create(self, actions: list[Any], properties: Any) -> None:
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions

        # mode "error": a table created meanwhile (a racing writer) fails this attempt; the
        # commit worker's retry finds the table and meets the fence (rule 2)
        create_table_with_add_actions(
            self.table_uri, Schema.from_arrow(self.schema), actions, mode="error",
            configuration=self.configuration or None,
            storage_options=storage_options_for("delta", self.storage_options) or None,
            commit_properties=properties)

    def _removed_paths(self) -> set[str]:
        from fsspec.core import url_to_fs

        # the log read directly, with fsspec: delta-rs's names would be lost on s3fs (which
        # ignores names it does not know, and would then reach AWS instead of the endpoint)
        fs, root = url_to_fs(f"{self.table_uri}/_delta_log", **self._fsspec_options())
        fs.invalidate_cache(root)  # s3fs keeps listings for good: commits came since
        removed: set[str] = set()
        for name in fs.ls(root, detail=False):
            base = str(name).rsplit("/", 1)[-1]
            if base.endswith(".json") and base[:-5].isdigit():
                for line in fs.cat_file(name).decode().splitlines():
                    action = json.loads(line) if line.strip() else {}
                    if "remove" in action:
                        removed.add(_unquote(action["remove"]["path"]))
            elif ".checkpoint" in base and base.endswith(".parquet"):
                import pyarrow.parquet as pq

                with fs.open(name, "rb") as f:
                    column = pq.read_table(f, columns=["remove"]).column("remove")
                for row in column.to_pylist():
                    if row and row.get("path"):
                        removed.add(_unquote(row["path"]))
        return removed


def _column_mapping(table: Any) -> str:
    """A Delta table's column mapping mode: ``none``, ``name`` or ``id``."""
    return str(table.metadata().configuration.get("delta.columnMapping.mode") or "none").lower()
