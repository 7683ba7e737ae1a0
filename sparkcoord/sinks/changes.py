"""A change stream's rows reduced to what one merge applies to a table by key (issue 28 item 6).

A lake sink in ``merge`` mode takes the PostgreSQL source's rows (docs/cdc.md, "Applying the
changes": ``op``, ``lsn``, ``seq``, a ``key`` struct, ``after`` struct, ``unchanged``) of one
captured table. Its tasks stage each epoch's rows as parquet files; its coordinator reduces
them here and merges the result into the table in one transaction (``formats/``: Delta's
``merge.py``, Iceberg's ``merge.py``).

Rules:
  1. The changes of one epoch apply in ``(lsn, seq)`` order, a snapshot row (``seq`` null)
     before any change of the same ``lsn``; per key only the last one counts: ``r``, ``c``
     and ``u`` put ``after``, ``d`` removes the key.
  2. A truncate (``t``) removes every row whose last change is before it: the changes before
     the epoch's last truncate are dropped, and the merge deletes every row of the table the
     remaining changes do not touch (:attr:`Reduced.truncated`).
  3. An update whose ``unchanged`` lists columns (large TOASTed values PostgreSQL did not
     send, holding null in ``after``) sets only the columns it carries, and so does the
     insert of a key change (a ``d`` of the old key and a ``c`` of the new at one position,
     whose ``unchanged`` lists them too): the row it replaces gives the others, that is the
     key's earlier change in the epoch (the old key's, for a key change), or else the row the
     table holds for that key (:func:`fill_unchanged`, by the committer, from the rows it
     reads anyway). A key not in the table then is refused naming the PostgreSQL table, the
     key and the columns: its values are nowhere (``REPLICA IDENTITY FULL`` sends them).
  4. The result has the table's columns (the fields of ``after``), the key's columns taken
     from ``key`` (a delete has no ``after``), :data:`OP_COLUMN` and
     :data:`UNCHANGED_COLUMN` (rule 3's columns still to take from the table; null: none)
     with :data:`UNCHANGED_FROM` (the key whose row in the table gives them).

Thread model: none (functions of Arrow tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The reduced rows' operation column: ``d`` deletes the key, anything else puts the row.
OP_COLUMN = "_sparkcoord_op"
#: The reduced rows' columns to keep from the table's row of the key (rule 3)
UNCHANGED_COLUMN = "_sparkcoord_unchanged"
#: The key (a struct of the key's columns) whose row in the table gives those columns: the
#: row's own key, or the old key of a key change (rule 3); null when none are to be taken
UNCHANGED_FROM = "_sparkcoord_unchanged_from"


class ChangeStreamError(ValueError):
    """The staged rows cannot be merged (rule 3), or are not a change stream."""


@dataclass(frozen=True)
class Reduced:
    """What one merge applies."""

    #: the table's columns, the key's filled for deletes too, and :data:`OP_COLUMN`
    rows: Any
    #: an epoch's truncate: delete every row of the table ``rows`` does not touch (rule 2)
    truncated: bool
    #: the PostgreSQL table the changes are of (its ``table`` column), for errors
    source: str = ""

    @property
    def partial(self) -> bool:
        """Whether a row put takes columns from the table's row (rule 3)."""
        import pyarrow.compute as pc

        if UNCHANGED_COLUMN not in self.rows.schema.names:
            return False
        lengths = pc.list_value_length(self.rows.column(UNCHANGED_COLUMN))
        return bool(pc.any(pc.fill_null(pc.greater(lengths, 0), False)).as_py())


def table_schema(input_schema: Any) -> Any:
    """The table's ``pyarrow.Schema``: the ``after`` struct's fields of a change stream's
    schema; ChangeStreamError if ``input_schema`` is not one."""
    import pyarrow as pa

    names = set(input_schema.names)
    missing = {"op", "lsn", "seq", "key", "after"} - names
    if missing:
        raise ChangeStreamError(
            f"mode 'merge' takes a change stream (the PostgreSQL source's rows: op, lsn, seq, "
            f"key, after); this DataFrame has no {', '.join(sorted(missing))}")
    after = input_schema.field("after").type
    if not pa.types.is_struct(after):
        raise ChangeStreamError(f"column 'after' is a {after}, not a struct")
    return pa.schema(list(after))


def key_names(input_schema: Any) -> list[str]:
    """The key's column names: the fields of the ``key`` struct."""
    return [f.name for f in input_schema.field("key").type]


def reduce_changes(staged: Any, table: str) -> Reduced:
    """Rules 1-4 over ``staged`` (a ``pyarrow.Table`` of change rows of one epoch); ``table``
    names the target in errors."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = table_schema(staged.schema)
    keys = key_names(staged.schema)
    staged = staged.append_column("_order", pa.array(range(staged.num_rows), pa.int64()))
    ordered = staged.sort_by([("lsn", "ascending", "at_start"),
                              ("seq", "ascending", "at_start")])
    ops = ordered.column("op")
    truncates = pc.equal(ops, "t")
    truncated = bool(pc.any(truncates).as_py())
    if truncated:  # rule 2: what came before the last truncate is gone with it
        last = max(i for i, t in enumerate(truncates.to_pylist()) if t)
        ordered = ordered.slice(last + 1)
        ops = ordered.column("op")
    ordered = ordered.filter(pc.not_equal(ops, "t"))
    key = ordered.column("key").combine_chunks()
    after = ordered.column("after").combine_chunks()
    arrays = {}
    for field in columns:
        # struct_field, not .field(): a delete's null ``after`` must give nulls, not the
        # child array's placeholder values
        source = key if field.name in keys else after
        arrays[field.name] = pc.struct_field(source, field.name)
    unchanged = (ordered.column("unchanged") if "unchanged" in ordered.schema.names
                 else pa.nulls(ordered.num_rows, pa.list_(pa.string())))
    flat = pa.table({**arrays, OP_COLUMN: ordered.column("op"), UNCHANGED_COLUMN: unchanged,
                     "_rank": pa.array(range(ordered.num_rows), pa.int64())})
    if _any_partial(flat):
        rows = _reduce_partial(flat, keys, ordered.column("lsn"))  # rules 1 and 3
    else:  # rule 1: per key, the last change
        last = flat.group_by(keys, use_threads=False).aggregate([("_rank", "max")])
        wanted = pc.is_in(flat.column("_rank"), value_set=last.column("_rank_max"))
        rows = flat.filter(wanted).drop_columns(["_rank"]).append_column(
            UNCHANGED_FROM, pa.nulls(int(pc.sum(wanted).as_py() or 0), _key_type(flat, keys)))
        rows = rows.set_column(rows.schema.get_field_index(UNCHANGED_COLUMN), UNCHANGED_COLUMN,
                               pa.nulls(rows.num_rows, pa.list_(pa.string())))
    sources = (pc.unique(staged.column("table")).to_pylist()
               if "table" in staged.schema.names else [])
    schema = pa.schema([*columns, pa.field(OP_COLUMN, pa.string()),
                        pa.field(UNCHANGED_COLUMN, pa.list_(pa.string())),
                        pa.field(UNCHANGED_FROM, _key_type(flat, keys))])
    return Reduced(rows.cast(schema), truncated, ", ".join(str(t) for t in sources) or table)


def _key_type(flat: Any, keys: list[str]) -> Any:
    import pyarrow as pa

    return pa.struct([flat.schema.field(k) for k in keys])


def _any_partial(flat: Any) -> bool:
    """Whether an update or a key change's insert of the epoch left columns out (rule 3)."""
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(flat.column(UNCHANGED_COLUMN)), 0)
    ops = flat.column(OP_COLUMN)
    puts = pc.or_(pc.equal(ops, "u"), pc.equal(ops, "c"))
    return bool(pc.any(pc.and_(puts, pc.greater(lengths, 0))).as_py())


_UNSEEN = object()  # a key the epoch had not touched before: the table's row is its state


def _reduce_partial(flat: Any, keys: list[str], lsns: Any) -> Any:
    """Rules 1 and 3 over ``flat`` (in order) in Python, for an epoch where a change left
    columns out: per key its last change, a left-out column taken from the row it replaces
    in the epoch (the key's earlier change; for a key change's insert, the old key's row
    before its delete at the same position), and what no change of the epoch gives listed
    in :data:`UNCHANGED_COLUMN` with the key whose stored row gives it in
    :data:`UNCHANGED_FROM`."""
    import pyarrow as pa

    state: dict[tuple[Any, ...], Any] = {}
    before_delete: dict[tuple[Any, ...], Any] = {}
    previous: tuple[tuple[Any, ...], str, Any] | None = None
    for row, lsn in zip(flat.drop_columns(["_rank"]).to_pylist(), lsns.to_pylist(),
                        strict=True):
        key, op = tuple(row[k] for k in keys), row[OP_COLUMN]
        row[UNCHANGED_FROM] = None
        if op == "d":
            before_delete[key] = state.get(key, _UNSEEN)
            row[UNCHANGED_COLUMN] = None
            state[key] = row
            previous = (key, op, lsn)
            continue
        missing = ({c for c in row[UNCHANGED_COLUMN] or () if c not in keys}
                   if op in ("u", "c") else set())
        origin, base = key, state.get(key, _UNSEEN)
        if op == "c":
            base = None  # an insert replaces no row of its key
            if missing and previous is not None and previous[1] == "d" and previous[2] == lsn:
                # a key change: a delete of the old key and this insert, at one position
                origin, base = previous[0], before_delete.get(previous[0], _UNSEEN)
        if missing and isinstance(base, dict) and base[OP_COLUMN] != "d":
            for column in missing:
                row[column] = base[column]
            missing &= set(base[UNCHANGED_COLUMN] or ())
            origin = (tuple(base[UNCHANGED_FROM][k] for k in keys)
                      if base[UNCHANGED_FROM] is not None else origin)
        row[UNCHANGED_COLUMN] = sorted(missing) or None
        row[UNCHANGED_FROM] = dict(zip(keys, origin, strict=True)) if missing else None
        state[key] = row
        previous = (key, op, lsn)
    schema = flat.drop_columns(["_rank"]).schema.append(
        pa.field(UNCHANGED_FROM, _key_type(flat, keys)))
    return pa.Table.from_pylist(list(state.values()), schema=schema)


def fill_unchanged(puts: Any, stored: Any, keys: Sequence[str], source: str,
                   table: str) -> Any:
    """``puts`` (rows put, with :data:`UNCHANGED_COLUMN`) without that column, each row's
    listed columns taken from ``stored`` (the table's current rows of at least those keys,
    in any order); ChangeStreamError naming the PostgreSQL table ``source``, the keys and the
    columns when a key with listed columns is not in ``stored`` (rule 3). Called by a
    committer on the commit worker thread."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if UNCHANGED_COLUMN not in puts.schema.names:
        return puts
    lengths = pc.fill_null(pc.list_value_length(puts.column(UNCHANGED_COLUMN)), 0)
    partial = pc.greater(lengths, 0)
    if not pc.any(partial).as_py():
        return puts.drop_columns([c for c in (UNCHANGED_COLUMN, UNCHANGED_FROM)
                                  if c in puts.schema.names])
    extra = [c for c in (UNCHANGED_COLUMN, UNCHANGED_FROM) if c in puts.schema.names]
    full = puts.filter(pc.invert(partial)).drop_columns(extra)
    schema = full.schema
    wanted = puts.filter(partial)
    by_key = {tuple(_plain(r[k]) for k in keys): r
              for r in stored.select(schema.names).cast(schema).to_pylist()}
    rows, absent = [], []
    for row in wanted.to_pylist():
        origin = row.pop(UNCHANGED_FROM, None) or row
        key = tuple(_plain(origin[k]) for k in keys)
        old = by_key.get(key)
        columns = row.pop(UNCHANGED_COLUMN)
        if old is None:
            absent.append((key, columns))
            continue
        rows.append({**row, **{c: old[c] for c in columns}})
    if absent:
        named = sorted({c for _, cs in absent for c in cs})
        shown = ", ".join(str(k[0] if len(k) == 1 else k) for k, _ in absent[:5])
        raise ChangeStreamError(
            f"table {source}: {len(absent)} update(s) (key {', '.join(keys)} = {shown}"
            f"{', ...' if len(absent) > 5 else ''}) did not send column(s) "
            f"{', '.join(named)} (large values PostgreSQL keeps out of line and did not "
            f"change), and the target {table} has no row of that key to keep them from. Set "
            f"REPLICA IDENTITY FULL on {source} and mirror it again from a new checkpoint "
            f"location (docs/cdc.md)")
    return pa.concat_tables([full, pa.Table.from_pylist(rows, schema=schema)])


def _plain(value: Any) -> Any:
    """A key value compared across a table read and the staged rows: a timestamp with a
    zone as its naive UTC instant."""
    import datetime

    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return value


def origin_keys(puts: Any, keys: Sequence[str]) -> Any:
    """The keys whose rows in the table :func:`fill_unchanged` needs for ``puts``: a table of
    the key columns (commit worker thread, before the committer reads them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(puts.column(UNCHANGED_COLUMN)), 0)
    wanted = puts.filter(pc.greater(lengths, 0))
    origins = [row[UNCHANGED_FROM] or {k: row[k] for k in keys} for row in wanted.to_pylist()]
    return pa.Table.from_pylist(origins, schema=pa.schema(
        [puts.schema.field(k) for k in keys]))
