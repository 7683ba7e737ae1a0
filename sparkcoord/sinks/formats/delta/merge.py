"""Mode ``merge`` of :class:`~sparkcoord.sinks.formats.delta.commit.DeltaCommitter`: the
epoch's reduced changes applied by key by copy-on-write (``commit.py`` rule 4), the current
files pruned by their add actions' key statistics as far as those can be trusted.

:class:`DeltaMerge` holds the committer's merge methods; the committer (``commit.py``) is
made of it and of the append path, the fence and the queries, so the merge path reads apart
from the append path and imports nothing of it (no import circle: ``commit.py`` imports this
module, this module only the shared ``actions.py`` and the sink's modules below the formats).
A rule number alone is ``commit.py``'s.

Thread model: as ``commit.py``: the commit worker thread, one command at a time;
:func:`_trusted_bounds` and :func:`_comparable` are pure.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sparkcoord.sinks.changes import OP_COLUMN, ChangeStreamError, Reduced, fill_unchanged
from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, Decision, EpochFence
from sparkcoord.sinks.formats.delta.actions import _MILLISECOND, _unquote, add_action, run_app_id
from sparkcoord.sinks.mergefiles import KeyRange, MergeFileWriter, files_to_rewrite
from sparkcoord.sinks.mergefold import small_files

log = logging.getLogger("sparkcoord.sinks")


class DeltaMerge:
    """The merge methods of :class:`~sparkcoord.sinks.formats.delta.commit.DeltaCommitter`
    (``commit.py`` rule 4); not used alone."""

    # what the merge path uses of the committer (``commit.py``), for the type checker
    table_uri: str
    job_id: str
    run_id: str
    schema: Any
    _fence: EpochFence | None

    if TYPE_CHECKING:
        def _decide(self, epoch: int) -> tuple[Decision, Any, Any]: ...
        def _create(self, actions: list[Any], properties: Any) -> None: ...
        def _check_shape(self, table: Any) -> None: ...
        def _check_shape_since_open(self, table: Any) -> None: ...
        def _fsspec_options(self) -> dict[str, Any]: ...
        def _files(self) -> tuple[Any, str]: ...

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
