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

Thread model: :meth:`DeltaCommitter.open` and :meth:`DeltaCommitter.commit` run on the sink
coordinator's commit worker thread (``sparkcoord.committer.worker``), one at a time; the
queries (:meth:`DeltaCommitter.table_epoch`, :meth:`DeltaCommitter.referenced_paths`) on any
thread that does not race them.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sparkcoord.sinks.changes import OP_COLUMN, ChangeStreamError, Reduced, fill_unchanged
from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, NO_EPOCH, Decision, EpochFence
from sparkcoord.sinks.files import DataFile, check_job_id
from sparkcoord.sinks.mergefiles import KeyRange, MergeFileWriter, files_to_rewrite
from sparkcoord.sinks.mergefold import small_files
from sparkcoord.sinks.tables import TableShapeError, check_table_schema, storage_options_for

#: Keys of the commit info (rule 1).
JOB_KEY, EPOCH_KEY, RUN_KEY = "sparkcoord.job-id", "sparkcoord.epoch", "sparkcoord.run-id"


log = logging.getLogger("sparkcoord.sinks")


def run_app_id(job_id: str, run_id: str) -> str:
    """The application transaction id that records which epochs ``run_id`` committed."""
    return f"{job_id}/run/{run_id}"


class DeltaCommitter:
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

    def merge(self, epoch: int, load: Callable[[], Reduced], keys: Sequence[str]
              ) -> Decision:
        """Apply ``epoch``'s reduced changes (``load()``, called only when the epoch is to be
        committed) to the table by ``keys`` in one copy-on-write transaction
        (rule 4: mode ``merge``; ``changes.py``), unless the table holds the epoch (commit
        worker thread; idempotent per epoch, fenced as :meth:`commit`). A missing table is
        created empty first (a commit of its own, carrying no epoch)."""
        decision, table, properties = self._decide(epoch)
        if decision == ALREADY_COMMITTED:
            return decision  # ``load`` not called: the staged files may be gone already
        if table is None:
            try:
                self._create([], None)
            except Exception:  # noqa: BLE001 - created meanwhile: the fence below decides
                pass
            # the fence again, on the table as it is now: another instance of the job may
            # have created it and committed this epoch meanwhile (a review finding: the epoch
            # then went in twice), and a table someone else made must have the sink's shape
            decision, table, properties = self._decide(epoch)
            if table is None:
                raise RuntimeError(f"Delta table {self.table_uri}: not there after creating it")
            self._check_shape(table)
            if decision == ALREADY_COMMITTED:
                return decision
        changes = load()
        features = table.protocol().reader_features or []
        if "deletionVectors" in features:
            # a rewrite of the raw files would bring back the rows their vectors delete
            raise ChangeStreamError(
                f"Delta table {self.table_uri}: mode 'merge' rewrites data files and cannot work "
                "on a table whose protocol allows deletion vectors (delta.enableDeletionVectors)")
        self._check_shape_since_open(table)
        actions = self._merge_actions(table, epoch, changes, keys)
        properties.max_commit_retries = 0  # rule 4: fail, never rebase a rewrite
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        base = table.version()
        try:
            table.create_write_transaction(actions, "append", table.schema(),
                                           commit_properties=properties)
        except CommitFailedError:
            self._discard_lost_merge(epoch, base, [a.path for a in actions
                                                   if isinstance(a, AddAction)])
            raise
        assert self._fence is not None
        self._fence.committed(epoch)
        return COMMIT

    def _discard_lost_merge(self, epoch: int, base: int, written: Sequence[str]) -> None:
        """Rule 4: a merge attempt whose commit failed deletes the files it wrote (``written``,
        relative to the table), so that a job that keeps losing to another writer does not
        pile them up until the next start's sweep; only on proof that the attempt did not
        land. Without retries delta-rs writes exactly version ``base + 1`` or nothing, so the
        proof is that version's log entry, read directly: it exists and is another writer's
        (it carries neither this run's transaction for ``epoch`` nor any of the files, whose
        names are this attempt's own, so no version can reference them). Anything else (no
        entry yet: a stale store, a log store that publishes later; the entry is ours; it
        cannot be read) keeps them for the sweep, as does a kill. Commit worker thread."""
        try:
            fs, root = self._files()
            try:
                entry = fs.cat_file(f"{root}/_delta_log/{base + 1:020d}.json")
            except FileNotFoundError:
                return  # no proof either way
            ours, mine = run_app_id(self.job_id, self.run_id), set(written)
            for line in entry.decode().splitlines():
                action = json.loads(line) if line.strip() else {}
                txn, add = action.get("txn") or {}, action.get("add") or {}
                if ((txn.get("appId") == ours and txn.get("version") == epoch)
                        or _unquote(str(add.get("path", ""))) in mine):
                    return  # it landed: the files are the table's
            for path in written:
                try:
                    fs.rm_file(f"{root}/{path}")
                except FileNotFoundError:
                    pass
        except Exception:  # noqa: BLE001 - the commit's own error is what the worker reports
            log.warning("Delta table %s: the files of epoch %d's failed merge attempt stay for "
                        "the next start's sweep", self.table_uri, epoch, exc_info=True)

    def _merge_actions(self, table: Any, epoch: int, changes: Reduced,
                       keys: Sequence[str]) -> list[Any]:
        """Rule 4's copy-on-write (``mergefiles.py`` rule 3): the remove actions of the
        current files holding a changed key (every file after a truncate) and the add actions
        of their rewrites without those rows and of the rows put, written as merge files."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from deltalake.transaction import RemoveAction

        writer = MergeFileWriter(self.table_uri, self.job_id, epoch, self.schema,
                                 storage_options=self._fsspec_options())
        ops = changes.rows.column(OP_COLUMN)
        changed = changes.rows.select(list(keys))
        ranges = _key_ranges(table, keys)
        candidates = files_to_rewrite(
            ranges,
            [tuple(_comparable(v) for v in key)
             for key in zip(*(changed.column(k).to_pylist() for k in keys), strict=True)],
            truncated=changes.truncated)
        fs, root = self._files()
        now = int(time.time() * 1000)
        removes: list[Any] = []
        stored: list[Any] = []  # the changed keys' current rows, for changes.py rule 3
        try:
            for f in candidates:
                if not changes.truncated:
                    with fs.open(f"{root}/{f.path}", "rb") as handle:
                        rows = pq.read_table(handle).select(self.schema.names).cast(
                            self.schema)
                    marked = rows.select(list(keys)).append_column(
                        "__row", pa.array(range(rows.num_rows), pa.int64()))
                    hit = marked.join(changed, list(keys), join_type="left semi")
                    if hit.num_rows == 0:
                        continue  # its bounds overlap the changed keys, its rows do not
                    drop = pc.is_in(marked.column("__row"), value_set=hit.column("__row"))
                    stored.append(rows.filter(drop))
                    kept = rows.filter(pc.invert(drop))
                    if kept.num_rows:
                        writer.write(kept)
                removes.append(RemoveAction(f.path, True, now, f.size))
            taken = {r.path for r in removes}
            for f in [] if changes.truncated else small_files(ranges, taken):
                # mergefold.py: a small file's rows written again as they are
                with fs.open(f"{root}/{f.path}", "rb") as handle:
                    writer.write(pq.read_table(handle).select(self.schema.names).cast(
                        self.schema))
                removes.append(RemoveAction(f.path, True, now, f.size))
            puts = fill_unchanged(
                changes.rows.filter(pc.not_equal(ops, "d")).drop_columns([OP_COLUMN]),
                pa.concat_tables(stored) if stored else self.schema.empty_table(), keys,
                changes.source, self.table_uri)
            if puts.num_rows:
                writer.write(puts.select(self.schema.names).cast(self.schema))
            written = writer.close()
        except BaseException:
            writer.abort()  # best effort; a kill leaves them to the sweep (merge names)
            raise
        return removes + [add_action(f) for f in written]

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


def _key_ranges(table: Any, keys: Sequence[str]) -> list[KeyRange]:
    """The table's current files with the bounds of the key columns their add actions'
    statistics carry, as far as they can be trusted (:func:`_trusted_bounds`; ``None``: the
    file may hold any key)."""
    import pyarrow as pa

    adds = pa.table(table.get_add_actions(flatten=True))
    names = set(adds.column_names)
    paths = [str(p) for p in adds.column("path").to_pylist()]
    sizes = [int(b) for b in adds.column("size_bytes").to_pylist()]
    if not all(f"min.{k}" in names and f"max.{k}" in names for k in keys):
        return [KeyRange(p, b, None, None) for p, b in zip(paths, sizes, strict=True)]
    kinds = [adds.schema.field(f"max.{k}").type for k in keys]
    lows = list(zip(*(adds.column(f"min.{k}").to_pylist() for k in keys), strict=True))
    highs = list(zip(*(adds.column(f"max.{k}").to_pylist() for k in keys), strict=True))
    out = []
    for path, size, low, high in zip(paths, sizes, lows, highs, strict=True):
        bounds = _trusted_bounds(path, kinds, low, high)
        out.append(KeyRange(path, size, *bounds) if bounds else KeyRange(path, size, None, None))
    return out


#: Writers may cut a string statistic to a prefix (Delta's writers keep 32 characters); a
#: prefix is still a lower bound, but as an upper bound it may exclude keys the file holds.
#: Counted in UTF-16 code units, as Spark's (Java's) writer counts them: a character outside
#: the BMP is two there, so a cut bound may be shorter than 32 Python characters.
_STATS_PREFIX = 32


def _column_mapping(table: Any) -> str:
    """A Delta table's column mapping mode: ``none``, ``name`` or ``id``."""
    return str(table.metadata().configuration.get("delta.columnMapping.mode") or "none").lower()


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _trusted_bounds(path: str, kinds: Sequence[Any], low: tuple[Any, ...],
                    high: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """A file's key bounds if a merge may prune by them, widened where a writer rounds them
    (``None``: read the file). The sink's own files (``sc-`` names, any job's) carry exact
    bounds or none (``files.py`` rule 3: timestamps rounded outwards, strings up to
    ``MAX_BOUND_CHARS``, no decimal). Another writer's are trusted for integers, dates and
    booleans; a string's upper bound only below 32 UTF-16 code units (a longer one may be a
    cut prefix); a timestamp's upper bound plus a millisecond (delta-rs and Spark cut it to the
    millisecond); nothing else (a decimal's bound may be clamped to 64 bits, a float's may
    hide a NaN), found by the session-13 review: a pruned file kept a changed key's old row."""
    import pyarrow as pa

    from sparkcoord.sinks.files import MAX_BOUND_CHARS, parse_file_name
    from sparkcoord.sinks.mergefiles import parse_merge_name

    if any(v is None for v in (*low, *high)):
        return None
    base = path.rsplit("/", 1)[-1]
    ours = parse_file_name(base) is not None or parse_merge_name(base) is not None
    widened = []
    for kind, hi in zip(kinds, high, strict=True):
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            if (len(hi) >= MAX_BOUND_CHARS if ours else _utf16_units(hi) >= _STATS_PREFIX):
                return None
        elif pa.types.is_timestamp(kind):
            if not ours:
                if hi > datetime.datetime.max.replace(tzinfo=hi.tzinfo) - _MILLISECOND:
                    return None  # a cut bound in the range's last millisecond: read the file
                hi = hi + _MILLISECOND
        elif not (pa.types.is_integer(kind) or pa.types.is_date(kind)
                  or pa.types.is_boolean(kind)):
            if not ours:
                return None
        widened.append(hi)
    return tuple(_comparable(v) for v in low), tuple(_comparable(v) for v in widened)


def _comparable(value: Any) -> Any:
    """A key value as the merge compares it: a timestamp with a time zone as the naive UTC
    instant (a table written with one and a sink without, or the reverse, must not make the
    comparison fail; pyarrow's cast between them keeps the instant as UTC too)."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return value


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
