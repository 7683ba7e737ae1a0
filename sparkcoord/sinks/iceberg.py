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

Thread model: as ``delta.py``: commands on the commit worker thread, one at a time.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyiceberg.table.locations import LocationProvider

from sparkcoord.sinks.changes import OP_COLUMN, Reduced, fill_unchanged, origin_keys
from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, NO_EPOCH, Decision, EpochFence
from sparkcoord.sinks.files import DATA_DIR, DataFile, check_job_id
from sparkcoord.sinks.icebergmerge import key_value
from sparkcoord.sinks.mergefiles import merge_file_name
from sparkcoord.sinks.tables import check_table_schema

log = logging.getLogger("sparkcoord.sinks")

#: Keys of a snapshot's summary (rule 1).
JOB_KEY, EPOCH_KEY, RUN_KEY = "sparkcoord.job-id", "sparkcoord.epoch", "sparkcoord.run-id"


def epoch_property(job_id: str) -> str:
    return f"sparkcoord.{job_id}.epoch"


def run_property(job_id: str) -> str:
    return f"sparkcoord.{job_id}.run"


class IcebergCommitter:
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
        from sparkcoord.sinks.icebergmerge import ManifestCache

        #: manifest entries read by merges (``icebergmerge.py`` rule 1)
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

    def merge(self, epoch: int, load: Callable[[], Reduced], keys: Sequence[str]
              ) -> Decision:
        """Apply ``epoch``'s reduced changes (``load()``, called only when the epoch is to be
        committed) by ``keys`` in one table transaction (rule 5: mode ``merge``;
        ``changes.py``) unless the table holds the epoch: by copy-on-write of the files that
        may hold a changed key, small files folded in, one overwrite snapshot, the sink's old
        snapshots expired (``icebergmerge.py``); on a snapshot with delete files, pyiceberg's
        delete + upsert (``icebergmerge.py`` rule 5). Commit worker thread; idempotent per
        epoch, fenced as :meth:`commit`."""
        from sparkcoord.sinks import icebergmerge as im

        decision, table = self._decide(epoch)
        if decision == ALREADY_COMMITTED:
            return decision  # ``load`` not called: the staged files may be gone already
        changes = load()
        base = table.current_snapshot()
        if base is not None and im.has_delete_files(base, table.io, self._manifests):
            return self._merge_by_pyiceberg(epoch, table, changes, keys)
        attempt = uuid.uuid4().hex
        table = with_merge_names(table, self.job_id, epoch, attempt)
        with _WRITTEN_LOCK:
            _WRITTEN[attempt] = []
        try:
            removed, added = self._copy_on_write(table, changes, keys)
            expired = self._expiring(table)
            gone = [s for s in (table.snapshot_by_id(i) for i in expired) if s is not None]
            self._commit_merge(table, epoch, removed, added, expired, base, attempt)
        finally:
            _forget_attempt(attempt)
        assert self._fence is not None
        self._fence.committed(epoch)
        self._delete_expired(table, gone)
        return COMMIT

    def _copy_on_write(self, table: Any, changes: Reduced, keys: Sequence[str]
                       ) -> tuple[list[Any], list[Any]]:
        """``icebergmerge.py`` rules 1-4: the live data files the epoch removes and the data
        files it writes (the candidates' kept rows, the small files folded in, the rows
        put), all written already."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from sparkcoord.sinks import icebergmerge as im
        from sparkcoord.sinks.mergefiles import files_to_rewrite
        from sparkcoord.sinks.mergefold import small_files

        live = im.live_files(table, keys, self._manifests)
        ops = changes.rows.column(OP_COLUMN)
        changed = changes.rows.select(list(keys))
        by_path = {f.range.path: f for f in live}
        candidates = files_to_rewrite(
            [f.range for f in live],
            [tuple(im.key_value(v) for v in key)
             for key in zip(*(changed.column(k).to_pylist() for k in keys), strict=True)],
            truncated=changes.truncated)
        removed: list[Any] = []
        kept: list[Any] = []
        stored: list[Any] = []  # the changed keys' current rows, for changes.py rule 3
        for candidate in candidates:
            data_file = by_path[candidate.path].data_file
            if not changes.truncated:
                rows = im.read_file(table, data_file, self.schema)
                marked = rows.select(list(keys)).append_column(
                    "__row", pa.array(range(rows.num_rows), pa.int64()))
                hit = marked.join(changed.cast(marked.select(list(keys)).schema), list(keys),
                                  join_type="left semi")
                if hit.num_rows == 0:
                    continue  # its bounds overlap the changed keys, its rows do not
                drop = pc.is_in(marked.column("__row"), value_set=hit.column("__row"))
                stored.append(rows.filter(drop))
                kept.append(rows.filter(pc.invert(drop)))
            removed.append(data_file)
        taken = {str(f.file_path) for f in removed}
        folded = [] if changes.truncated else small_files([f.range for f in live], taken)
        for small in folded:  # rule 3: small files rewritten with the epoch's output
            data_file = by_path[small.path].data_file
            kept.append(im.read_file(table, data_file, self.schema))
            removed.append(data_file)
        puts = fill_unchanged(
            changes.rows.filter(pc.not_equal(ops, "d")).drop_columns([OP_COLUMN]),
            pa.concat_tables(stored) if stored else self.schema.empty_table(), keys,
            changes.source, self.name)
        out = pa.concat_tables([*kept, puts.select(self.schema.names).cast(self.schema)])
        if out.num_rows:
            out = out.sort_by([(k, "ascending") for k in keys])
        return removed, im.write_files(table, out)

    def _commit_merge(self, table: Any, epoch: int, removed: Sequence[Any],
                      added: Sequence[Any], expired: Sequence[int], base: Any,
                      attempt: str) -> None:
        """``icebergmerge.py`` rules 4 and 6: the epoch's one transaction; a commit the
        catalog refused deletes the attempt's files on proof it did not land (rule 5)."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table.update.snapshot import ExpireSnapshots

        from sparkcoord.sinks import icebergmerge as im

        try:
            with table.transaction() as tx:
                self._mark(tx, epoch)
                if removed or added:
                    update = tx.update_snapshot(snapshot_properties=self._summary(epoch))
                    with (im.overwrite(update) if removed else update.fast_append()
                          ) as producer:
                        for data_file in removed:
                            producer.delete_data_file(data_file)
                        for data_file in added:
                            producer.append_data_file(data_file)
                if expired:
                    ExpireSnapshots(tx).by_ids(list(expired)).commit()
        except CommitFailedException:
            self._discard_lost_merge(table, epoch, None if base is None else base.snapshot_id,
                                     _written_by(attempt))
            raise

    def _expiring(self, table: Any) -> list[int]:
        """``icebergmerge.py`` rule 6: the snapshots the epoch's transaction expires."""
        import time

        from sparkcoord.sinks import icebergmerge as im

        protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
        snapshots = [(s.snapshot_id, s.timestamp_ms) for s in table.metadata.snapshots
                     if s.summary is not None and s.summary.get(JOB_KEY) == self.job_id]
        now = int(time.time() * 1000)
        # the epoch's own snapshot is the newest once it lands: one fewer of these is kept
        return im.snapshots_to_expire([*snapshots, (-1, now)], protected,
                                      dict(table.metadata.properties), now)

    def _delete_expired(self, now: Any, gone: Sequence[Any]) -> None:
        """``icebergmerge.py`` rule 6: once the transaction expiring the snapshots ``gone``
        landed (``now``: the table its commit returned), delete this job's merge files they
        referenced and no live snapshot does.
        Best effort: what is left is the sweep's at the next start (``cleanup.py`` rule 1)."""
        from sparkcoord.sinks import icebergmerge as im
        from sparkcoord.sinks.mergefiles import parse_merge_name

        if not gone:
            return
        try:
            was, _, _ = im.referenced_by(gone, now.io, self._manifests)
            live, manifests, lists = im.referenced_by(now.snapshots(), now.io, self._manifests)
            self._manifests.retain(manifests, lists)
            for path in sorted(was - live):
                name = parse_merge_name(path.rsplit("/", 1)[-1])
                if name is not None and name.job_id == self.job_id:
                    now.io.delete(path)
        except Exception:  # noqa: BLE001 - the epoch is committed; the sweep deletes the rest
            log.warning("Iceberg table %s: the merge files of expired snapshots stay for the "
                        "next start's sweep", self.identifier, exc_info=True)

    def _merge_by_pyiceberg(self, epoch: int, table: Any, changes: Reduced,
                            keys: Sequence[str]) -> Decision:
        """``icebergmerge.py`` rule 5: the epoch by pyiceberg's delete (every row after a
        truncate) and upsert, which apply the snapshot's delete files (commit worker
        thread)."""
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue

        ops = changes.rows.column(OP_COLUMN)
        puts = changes.rows.filter(pc.not_equal(ops, "d")).drop_columns([OP_COLUMN])
        stored = None
        if changes.partial and not changes.truncated:
            stored = table.scan(row_filter=key_filter(origin_keys(puts, keys), keys)).to_arrow()
        # changes.py rule 3, from the snapshot the transaction below asserts as its base
        puts = fill_unchanged(puts, self.schema.empty_table() if stored is None else stored,
                              keys, changes.source, self.name)
        deleted = changes.rows.filter(pc.equal(ops, "d"))
        from pyiceberg.exceptions import CommitFailedException

        summary = self._summary(epoch)
        attempt = uuid.uuid4().hex
        base = table.current_snapshot()
        table = with_merge_names(table, self.job_id, epoch, attempt)
        with _WRITTEN_LOCK:
            _WRITTEN[attempt] = []
        try:
            with table.transaction() as tx:
                self._mark(tx, epoch)
                if changes.truncated:
                    tx.delete(AlwaysTrue(), snapshot_properties=summary)
                elif deleted.num_rows:
                    tx.delete(key_filter(deleted, keys), snapshot_properties=summary)
                if puts.num_rows and changes.truncated:
                    tx.append(puts, snapshot_properties=summary)  # nothing left to match
                elif puts.num_rows:
                    tx.upsert(puts, join_cols=list(keys), snapshot_properties=summary)
        except CommitFailedException:
            self._discard_lost_merge(table, epoch, None if base is None else base.snapshot_id,
                                     _written_by(attempt))
            raise
        finally:
            _forget_attempt(attempt)
        assert self._fence is not None
        self._fence.committed(epoch)
        return COMMIT

    def _discard_lost_merge(self, table: Any, epoch: int, base: int | None,
                            written: Sequence[str]) -> None:
        """Rule 5: a merge whose commit the catalog refused deletes the data files its attempt
        wrote (``written``, their locations), so that a job that keeps losing to another
        writer does not pile them up until the next start's sweep; only on proof that the
        attempt did not land. The transaction asserted that the branch's head was ``base``
        (the snapshot it read; None: none), so the proof is the branch's history loaded
        again: the snapshot that followed ``base`` is another writer's (not this run's), and
        then no snapshot can hold the files (their names are this attempt's own). Anything
        else (nothing after ``base`` yet: a stale catalog read; this run's snapshot; an
        error) keeps them for the sweep, as does a kill. Commit worker thread."""
        try:
            now = self.catalog.load_table(self.identifier)
            snapshot, winner = now.current_snapshot(), None
            while snapshot is not None:
                if snapshot.parent_snapshot_id == base:
                    winner = snapshot
                    break
                if snapshot.parent_snapshot_id is None:
                    break
                snapshot = now.snapshot_by_id(snapshot.parent_snapshot_id)
            if winner is None or (winner.summary is not None
                                  and winner.summary.get(RUN_KEY) == self.run_id):
                return  # no proof that another writer took the branch: keep them
        except Exception:  # noqa: BLE001 - the commit's own error is what the worker reports
            log.warning("Iceberg table %s: the files of epoch %d's failed merge attempt stay "
                        "for the next start's sweep", self.identifier, epoch, exc_info=True)
            return
        for path in written:
            try:
                table.io.delete(path)
            except Exception:  # noqa: BLE001 - one left is the sweep's; the others still go
                log.warning("Iceberg table %s: cannot delete %s of a failed merge attempt; the "
                            "next start's sweep will", self.identifier, path, exc_info=True)

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


#: In-memory table properties (``mergefiles.py`` rule 2): who names the files pyiceberg writes.
WRITING_JOB, WRITING_EPOCH = "sparkcoord.writing.job-id", "sparkcoord.writing.epoch"
#: the in-memory property naming one merge attempt, whose file locations the provider keeps
WRITING_ATTEMPT = "sparkcoord.writing.attempt"
#: the locations each live merge attempt's provider handed out, by attempt (rule 5: a lost
#: attempt deletes them); pyiceberg may write on threads of its own, hence the lock
_WRITTEN: dict[str, list[str]] = {}
_WRITTEN_LOCK = threading.Lock()


def _written_by(attempt: str) -> list[str]:
    with _WRITTEN_LOCK:
        return list(_WRITTEN.get(attempt, ()))


def _forget_attempt(attempt: str) -> None:
    with _WRITTEN_LOCK:
        _WRITTEN.pop(attempt, None)


_PROVIDER = "write.py-location-provider.impl"


class MergeLocationProvider(LocationProvider):
    """pyiceberg's location provider while a merge commit writes (rule 5, ``mergefiles.py``
    rule 2): every data file in ``data/`` under a merge file's name. Made by pyiceberg
    (``load_location_provider``, once per write) on the commit worker thread, from the
    properties :func:`with_merge_names` put in memory."""

    def __init__(self, table_location: str, table_properties: dict[str, str]) -> None:
        super().__init__(table_location, table_properties)
        self._job = check_job_id(table_properties[WRITING_JOB])
        self._epoch = int(table_properties[WRITING_EPOCH])
        self._attempt = table_properties.get(WRITING_ATTEMPT)

    def new_data_location(self, data_file_name: str, partition_key: Any = None) -> str:
        """Where pyiceberg writes its next data file (pyiceberg, on the commit worker thread or
        a writing thread of its own)."""
        # always data/ (not write.data.path): the sweep lists the table's data/ directory;
        # a token per file: pyiceberg's own name is not ours to parse
        name = merge_file_name(self._job, self._epoch, uuid.uuid4().hex[:12], 0)
        location = f"{self.table_location.rstrip('/')}/{DATA_DIR}/{name}"
        if self._attempt is not None:
            with _WRITTEN_LOCK:
                # only while its merge runs (a write still going after it ended adds nothing)
                if self._attempt in _WRITTEN:
                    _WRITTEN[self._attempt].append(location)
        return location


def with_merge_names(table: Any, job_id: str, epoch: int, attempt: str | None = None) -> Any:
    """``table`` (a pyiceberg Table) whose in-memory metadata names the data files pyiceberg
    writes for ``epoch``'s merge the sink's way (``mergefiles.py`` rule 2), and with
    ``attempt`` keeps their locations for :func:`_written_by`; the stored table's properties
    are untouched (rule 3's reasoning: the catalog applies our updates only)."""
    properties = {**table.metadata.properties, _PROVIDER: f"{__name__}.MergeLocationProvider",
                  WRITING_JOB: check_job_id(job_id), WRITING_EPOCH: str(epoch)}
    if attempt is not None:
        properties[WRITING_ATTEMPT] = attempt
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


def key_filter(rows: Any, keys: Sequence[str]) -> Any:
    """A pyiceberg filter matching the keys of ``rows``: one key column, an ``In``; several,
    the keys grouped by all columns but the last, each group an ``And`` of ``EqualTo``s and
    an ``In`` of the last column's values, the groups joined by one ``Or`` (pyiceberg builds
    it as a balanced tree: a chain of one ``Or`` per key overflowed the stack binding a few
    hundred keys, a review finding)."""
    from functools import reduce

    from pyiceberg import expressions

    # Any: pyiceberg's own __init__ takes these positionally; its pydantic stubs do not say so
    e: Any = expressions
    And, EqualTo, In, Or = e.And, e.EqualTo, e.In, e.Or
    if len(keys) == 1:
        return In(keys[0], set(rows.column(keys[0]).to_pylist()))
    *prefix, last = keys
    groups: dict[tuple[Any, ...], set[Any]] = {}
    for row in rows.select(list(keys)).to_pylist():
        groups.setdefault(tuple(row[k] for k in prefix), set()).add(row[last])
    terms = [reduce(And, [*(EqualTo(k, v) for k, v in zip(prefix, group, strict=True)),
                          In(last, values)])
             for group, values in groups.items()]
    return terms[0] if len(terms) == 1 else Or(*terms)
