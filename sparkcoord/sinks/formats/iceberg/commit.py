"""Commit a lake sink's epochs to an Iceberg table with ``pyiceberg``, once each.

Any catalog pyiceberg can configure works (``load_catalog``; the tests use its SQL catalog on
sqlite); the committer is handed the catalog object.

Rules:
  1. One epoch, one snapshot: a fast append of a ``DataFile`` per file the epoch's tasks
     reported, built from the task's statistics (bounds keyed by the table's field ids; the
     files are not opened again), whose summary carries the job id, the epoch and the run id.
     In the same table transaction the table properties ``sparkcoord.<job>.epoch`` and
     ``sparkcoord.<job>.run`` are set: a summary disappears when its snapshot expires, the
     property does not, so the newest epoch survives snapshot expiry.
  2. Which epochs the table holds for the job: the newest of the property and of the
     snapshot summaries walked for the job id (fencing rule 1); which of them this run
     committed: the summaries walked for the run id. Before each commit the table is loaded
     again and the fence decides (``fencing.py``).
  3. A second writer racing us is serialized by the catalog: a transaction commits only if
     the branch's snapshot is still the one it read (pyiceberg's ``AssertRefSnapshotId``),
     so the loser's commit fails and the commit worker's retry meets the fence. pyiceberg
     itself would retry a lost race by rebasing the append onto the winner's snapshot
     (``commit.retry.num-retries``, 4 by default): for us that lands the epoch twice (found by
     the racing test). So the committer's copy of the table's metadata says 0 retries; the
     table's stored properties are untouched (the catalog applies our updates to the metadata
     it holds, not to our copy).
  4. The table is created at :meth:`IcebergCommitter.open` if missing (not at the first
     commit, unlike Delta): the tasks need the table's location, which the catalog decides.
     The parquet files carry no Iceberg field ids; the table's default name mapping (set at
     creation if missing) maps their columns by name, as pyiceberg's own ``add_files`` does.
  5. Mode ``append`` adds the reported files; mode ``merge`` (a change stream, issue 28 item
     6) applies the epoch's reduced changes by key (``changes.py``) in the epoch's one
     transaction: by copy-on-write of the files that may hold a changed key, one overwrite
     snapshot, small files folded in, the sink's old snapshots expired
     (``icebergmerge.py``, issue 43 finding 4); on a snapshot with delete files, a delete by
     key filter (every row after a truncate) and pyiceberg's upsert of the rows put; the same
     summary and properties fence it. The data files pyiceberg
     writes for it are named ``sc-<job>.m<epoch>...`` by :class:`MergeLocationProvider`
     (``mergefiles.py`` rules 1-2), so a driver killed before the snapshot landed leaves
     files the sweep at the next start deletes (``cleanup.py`` rule 1). A merge whose commit
     the catalog refused (another writer committed since it read the table) deletes the
     files its attempt wrote (the provider keeps their locations), only on proof that it
     did not land: the snapshot that followed the one it read is another writer's; the
     commit worker retries with new ones.
  6. Compaction (``compaction.py`` rule 4, mode ``append``): an epoch with swaps commits one
     overwrite snapshot instead of the fast append: the inputs' entries of the current
     snapshot deleted, the outputs and the epoch's files added (pyiceberg has no "replace"
     operation: a reader of the table's appends only sees an overwrite whose rows are the
     epoch's plus the rewritten ones). A swap one of whose inputs is not in the current
     snapshot is left out (:attr:`IcebergCommitter.left_out`), and so is every swap while
     the snapshot has delete files (a rewrite of the raw data files would undo them). A
     concurrent commit fails ours (rule 3), and the retry reads the table again.

Where: this module holds the committer with its append path (rules 1-4 and 6), the fence
and the queries; the merge path (rule 5) is :class:`~sparkcoord.sinks.formats.iceberg.merge.
IcebergMerge` in ``merge.py``, which the committer is made of, its copy-on-write pieces
``rewrite.py``; the names the sink gives in the table (summary keys, properties, merge
files) are ``names.py``. ``sparkcoord.sinks.iceberg``, the committer's path before issue 44,
is this module (an alias), and ``sparkcoord.sinks.icebergmerge`` is ``rewrite.py``.

Thread model: as ``formats/delta/commit.py``: commands on the commit worker thread, one at a
time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, NO_EPOCH, Decision, EpochFence
from sparkcoord.sinks.files import DataFile, check_job_id
from sparkcoord.sinks.formats.iceberg.merge import IcebergMerge, key_filter
from sparkcoord.sinks.formats.iceberg.names import (
    EPOCH_KEY,
    JOB_KEY,
    RUN_KEY,
    WRITING_ATTEMPT,
    WRITING_EPOCH,
    WRITING_JOB,
    MergeLocationProvider,
    epoch_property,
    run_property,
    with_merge_names,
)
from sparkcoord.sinks.formats.iceberg.rewrite import key_value
from sparkcoord.sinks.tables import check_table_schema

#: the old path's (``sinks/iceberg.py``) public names: the ones that moved to ``merge.py``
#: and ``names.py`` are still importable from here
__all__ = ["EPOCH_KEY", "JOB_KEY", "RUN_KEY", "WRITING_ATTEMPT", "WRITING_EPOCH", "WRITING_JOB",
           "IcebergCommitter", "MergeLocationProvider", "epoch_property", "iceberg_data_file",
           "key_filter", "run_property", "with_merge_names"]

class IcebergCommitter(IcebergMerge):
    """Commits the epochs of job ``job_id`` to the Iceberg table ``identifier`` of
    ``catalog`` (rules 1-5)."""

    def __init__(self, catalog: Any, identifier: str | tuple[str, ...], job_id: str,
                 schema: Any, *, run_id: str | None = None,
                 location: str | None = None) -> None:
        """``schema``: the sink's ``pyarrow.Schema``; ``location``: where rule 4 creates the
        table (``None``: where the catalog puts it)."""
        self.catalog = catalog
        self.identifier = identifier
        self.job_id = check_job_id(job_id)
        self.schema = schema
        self.run_id = run_id or uuid.uuid4().hex
        self.location = location
        self._fence: EpochFence | None = None
        self._table: Any = None
        from sparkcoord.sinks.formats.iceberg.rewrite import ManifestCache

        #: manifest entries read by merges (``rewrite.py`` rule 1)
        self._manifests = ManifestCache()
        #: the swaps the last :meth:`commit` left out (rule 6)
        self.left_out: list[Any] = []

    @property
    def name(self) -> str:
        ident = self.identifier
        return ident if isinstance(ident, str) else ".".join(ident)

    # ------------------------------------------------------------------ commands
    def open(self, last_committed: int = NO_EPOCH, pending: Iterable[int] = ()) -> int:
        """Create the table if missing (rule 4) and check it against the restored checkpoint
        (commit worker thread, at the coordinator's start, before any commit). Returns the
        table's newest epoch for the job; raises per fencing rule 2."""
        self._table = self._load_or_create()
        check_table_schema(self.name, self.schema, self._table.schema().as_arrow())
        fence = EpochFence(self.name, self.job_id, last_committed, pending)
        fence.opened(self._epochs(self._table)[0])
        self._fence = fence
        return fence.known

    def prepare_table(self) -> str:
        """Create the table if missing (rule 4) and return its location, where the tasks
        write (the driver program, when a sink is built: the tasks are told the location
        before the query starts). Checks nothing against a checkpoint: :meth:`open` does."""
        self._table = self._load_or_create()
        return self.table_location

    @property
    def table_location(self) -> str:
        """Where the tasks write (the table's location): known once :meth:`open` ran."""
        if self._table is None:
            raise RuntimeError("IcebergCommitter.table_location before open()")
        return str(self._table.location()).rstrip("/")

    def commit(self, epoch: int, files: Sequence[DataFile],
               swaps: Sequence[Any] = ()) -> Decision:
        """Commit ``epoch``'s reported ``files`` and compaction ``swaps``
        (``compaction.FilesCompacted``, rule 6) in one snapshot unless the table holds it
        (commit worker thread; idempotent per epoch). Raises
        :class:`~sparkcoord.sinks.fencing.SecondWriter` per fencing rules 3 and 4."""
        self.left_out = []
        decision, table = self._decide(epoch)
        if decision == ALREADY_COMMITTED:
            return decision
        location = self.table_location
        removed = self._swapped_entries(table, swaps) if swaps else []
        added = list(files) + [o for s in swaps if s not in self.left_out for o in s.outputs]
        with table.transaction() as tx:
            self._mark(tx, epoch)
            update = tx.update_snapshot(snapshot_properties=self._summary(epoch))
            with (update.overwrite() if removed else update.fast_append()) as producer:
                for entry in removed:
                    producer.delete_data_file(entry)
                for f in added:
                    producer.append_data_file(iceberg_data_file(table, location, f))
        assert self._fence is not None
        self._fence.committed(epoch)
        return COMMIT

    def _swapped_entries(self, table: Any, swaps: Sequence[Any]) -> list[Any]:
        """Rule 6: the current snapshot's data files the swaps remove, leaving out (into
        :attr:`left_out`) a swap one of whose inputs the snapshot does not hold."""
        from pyiceberg.manifest import ManifestContent

        snapshot = table.current_snapshot()
        current: dict[str, Any] = {}
        if snapshot is not None:
            location = self.table_location + "/"
            for manifest in snapshot.manifests(io=table.io):
                entries = manifest.fetch_manifest_entry(io=table.io, discard_deleted=True)
                if manifest.content == ManifestContent.DELETES:
                    if entries:  # deletes outside data files: no swap is safe
                        self.left_out.extend(swaps)
                        return []
                    continue
                for entry in entries:
                    path = str(entry.data_file.file_path)
                    for prefix in (location, _strip_scheme(location)):
                        if path.startswith(prefix):
                            current[path[len(prefix):]] = entry.data_file
                            break
        removed: list[Any] = []
        for swap in swaps:
            if any(p not in current for p in swap.inputs):
                self.left_out.append(swap)
                continue
            removed += [current[p] for p in swap.inputs]
        return removed

    def _decide(self, epoch: int) -> tuple[Decision, Any]:
        """Rule 2: the fence's decision for ``epoch`` on the table as it is now, and the
        table (its metadata without pyiceberg's commit retries: rule 3)."""
        if self._fence is None:
            raise RuntimeError("IcebergCommitter.commit before open()")
        table = self._table = _without_commit_retries(self.catalog.load_table(self.identifier))
        table_epoch, run_epoch = self._epochs(table)
        decision = self._fence.decide(epoch, table_epoch, run_epoch)
        if decision == ALREADY_COMMITTED:
            self._fence.committed(epoch)
        return decision, table

    def _summary(self, epoch: int) -> dict[str, str]:
        return {JOB_KEY: self.job_id, EPOCH_KEY: str(epoch), RUN_KEY: self.run_id}

    def _mark(self, tx: Any, epoch: int) -> None:
        """Rule 1's table properties, in the epoch's transaction."""
        tx.set_properties({epoch_property(self.job_id): str(epoch),
                           run_property(self.job_id): self.run_id})

    # ------------------------------------------------------------------ queries
    def table_epoch(self) -> int:
        """The newest epoch the table holds for the job (rule 2)."""
        return self._epochs(self.catalog.load_table(self.identifier))[0]

    def referenced_paths(self) -> set[str]:
        """Every data file path, relative to the table's location, that any snapshot the
        table keeps references (a time-travel read still needs those; snapshot expiry, not
        us, deletes them). Read by the orphan sweep (``cleanup.py``)."""
        table = self.catalog.load_table(self.identifier)
        location = str(table.location()).rstrip("/") + "/"
        paths: set[str] = set()
        if table.current_snapshot() is None:
            return paths
        for path in table.inspect.all_data_files().column("file_path").to_pylist():
            path = str(path)
            for prefix in (location, _strip_scheme(location)):
                if path.startswith(prefix):
                    path = path[len(prefix):]
                    break
            paths.add(path)
        return paths

    # ------------------------------------------------------------------ internals
    def _epochs(self, table: Any) -> tuple[int, int]:
        """(newest epoch of the job, newest epoch this run committed) (rule 2)."""
        props = table.properties
        newest = int(props.get(epoch_property(self.job_id), NO_EPOCH))
        ours = newest if props.get(run_property(self.job_id)) == self.run_id else NO_EPOCH
        for snapshot in table.snapshots():
            summary = snapshot.summary
            if summary is None or summary.get(JOB_KEY) != self.job_id:
                continue
            epoch = int(summary.get(EPOCH_KEY) or NO_EPOCH)
            newest = max(newest, epoch)
            if summary.get(RUN_KEY) == self.run_id:
                ours = max(ours, epoch)
        return newest, ours

    def _load_or_create(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
        from pyiceberg.table import TableProperties

        try:
            table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            try:
                table = self.catalog.create_table(self.identifier, schema=self.schema,
                                                  location=self.location)
            except TableAlreadyExistsError:  # created meanwhile by a racing writer
                table = self.catalog.load_table(self.identifier)
        if table.metadata.name_mapping() is None:  # rule 4
            mapping = table.schema().name_mapping.model_dump_json()
            with table.transaction() as tx:
                tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
            table = self.catalog.load_table(self.identifier)
        return table


def _without_commit_retries(table: Any) -> Any:
    """``table`` with pyiceberg's own commit retry off, in memory only (rule 3)."""
    from pyiceberg.table import TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def _strip_scheme(url: str) -> str:
    return url.split("://", 1)[1] if "://" in url else url


def iceberg_data_file(table: Any, location: str, file: DataFile) -> Any:
    """The Iceberg ``DataFile`` of a reported file of ``table`` at ``location``: bounds,
    counts and sizes by the table's field ids (rule 1)."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = table.schema()
    sizes, values, nulls, lower, upper = {}, {}, {}, {}, {}
    for name, stats in file.columns:
        field = schema.find_field(name)
        fid = field.field_id
        sizes[fid] = stats.size
        values[fid] = file.rows
        if stats.null_count is not None:
            nulls[fid] = stats.null_count
        if stats.min is not None and stats.max is not None and field.field_type.is_primitive:
            try:
                lo = to_bytes(field.field_type, key_value(stats.min))
                hi = to_bytes(field.field_type, key_value(stats.max))
            except (TypeError, ValueError, AttributeError, OverflowError):
                continue  # a bound pyiceberg cannot serialize for this type: left out
            lower[fid], upper[fid] = lo, hi
    return IcebergDataFile.from_args(
        content=DataFileContent.DATA, file_path=f"{location}/{file.path}",
        file_format=FileFormat.PARQUET, partition=Record(), record_count=file.rows,
        file_size_in_bytes=file.bytes, column_sizes=sizes, value_counts=values,
        null_value_counts=nulls, nan_value_counts={}, lower_bounds=lower,
        upper_bounds=upper, split_offsets=None, sort_order_id=None)
