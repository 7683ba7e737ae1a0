"""Mode ``merge`` of :class:`~sparkcoord.sinks.formats.iceberg.commit.IcebergCommitter`
(``commit.py`` rule 5): the epoch's reduced changes applied by key in the epoch's one
transaction, by the copy-on-write of ``rewrite.py`` or, on a snapshot with delete files, by
pyiceberg's delete + upsert; a merge the catalog refused deletes its attempt's files on proof
that it did not land.

:class:`IcebergMerge` holds the committer's merge methods; the committer (``commit.py``) is
made of it and of the append path, the fence and the queries, so the merge path reads apart
from the append path and imports nothing of it (no import circle: ``commit.py`` imports this
module, this module ``names.py``, ``rewrite.py`` and the sink's modules below the formats).
A rule number alone is ``commit.py``'s.

Thread model: as ``commit.py``: the commit worker thread, one command at a time;
:func:`key_filter` is pure.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sparkcoord.sinks.changes import OP_COLUMN, Reduced, fill_unchanged, origin_keys
from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, Decision, EpochFence
from sparkcoord.sinks.formats.iceberg.names import (
    _WRITTEN,
    _WRITTEN_LOCK,
    JOB_KEY,
    RUN_KEY,
    _forget_attempt,
    _written_by,
    with_merge_names,
)

if TYPE_CHECKING:
    from sparkcoord.sinks.formats.iceberg.rewrite import ManifestCache

log = logging.getLogger("sparkcoord.sinks")


class IcebergMerge:
    """The merge methods of :class:`~sparkcoord.sinks.formats.iceberg.commit.IcebergCommitter`
    (``commit.py`` rule 5); not used alone."""

    # what the merge path uses of the committer (``commit.py``), for the type checker
    catalog: Any
    identifier: str | tuple[str, ...]
    job_id: str
    run_id: str
    schema: Any
    _fence: EpochFence | None
    _manifests: ManifestCache

    if TYPE_CHECKING:
        @property
        def name(self) -> str: ...
        def _decide(self, epoch: int) -> tuple[Decision, Any]: ...
        def _summary(self, epoch: int) -> dict[str, str]: ...
        def _mark(self, tx: Any, epoch: int) -> None: ...

    def merge(self, epoch: int, load: Callable[[], Reduced], keys: Sequence[str]
              ) -> Decision:
        """Apply ``epoch``'s reduced changes (``load()``, called only when the epoch is to be
        committed) by ``keys`` in one table transaction (rule 5: mode ``merge``;
        ``changes.py``) unless the table holds the epoch: by copy-on-write of the files that
        may hold a changed key, small files folded in, one overwrite snapshot, the sink's old
        snapshots expired (``rewrite.py``); on a snapshot with delete files, pyiceberg's
        delete + upsert (``rewrite.py`` rule 5). Commit worker thread; idempotent per
        epoch, fenced as :meth:`commit`."""
        from sparkcoord.sinks.formats.iceberg import rewrite as im

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
        """``rewrite.py`` rules 1-4: the live data files the epoch removes and the data
        files it writes (the candidates' kept rows, the small files folded in, the rows
        put), all written already."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from sparkcoord.sinks.formats.iceberg import rewrite as im
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
        """``rewrite.py`` rules 4 and 6: the epoch's one transaction; a commit the
        catalog refused deletes the attempt's files on proof it did not land (rule 5)."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table.update.snapshot import ExpireSnapshots

        from sparkcoord.sinks.formats.iceberg import rewrite as im

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
        """``rewrite.py`` rule 6: the snapshots the epoch's transaction expires."""
        import time

        from sparkcoord.sinks.formats.iceberg import rewrite as im

        protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
        snapshots = [(s.snapshot_id, s.timestamp_ms) for s in table.metadata.snapshots
                     if s.summary is not None and s.summary.get(JOB_KEY) == self.job_id]
        now = int(time.time() * 1000)
        # the epoch's own snapshot is the newest once it lands: one fewer of these is kept
        return im.snapshots_to_expire([*snapshots, (-1, now)], protected,
                                      dict(table.metadata.properties), now)

    def _delete_expired(self, now: Any, gone: Sequence[Any]) -> None:
        """``rewrite.py`` rule 6: once the transaction expiring the snapshots ``gone``
        landed (``now``: the table its commit returned), delete this job's merge files they
        referenced and no live snapshot does.
        Best effort: what is left is the sweep's at the next start (``cleanup.py`` rule 1)."""
        from sparkcoord.sinks.formats.iceberg import rewrite as im
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
        """``rewrite.py`` rule 5: the epoch by pyiceberg's delete (every row after a
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
