"""A change stream's rows reduced to what one merge applies to a table by key (issue 28 item 6).

A lake sink in ``merge`` mode takes the PostgreSQL source's rows (docs/cdc.md, "Applying the
changes": ``op``, ``lsn``, ``seq``, a ``key`` struct, ``after`` struct, ``unchanged``) of one
captured table. Its tasks stage each epoch's rows as parquet files; its coordinator reduces
them here and merges the result into the table in one transaction (``delta.py``).

Rules:
  1. The changes of one epoch apply in ``(lsn, seq)`` order, a snapshot row (``seq`` null)
     before any change of the same ``lsn``; per key only the last one counts: ``r``, ``c``
     and ``u`` put ``after``, ``d`` removes the key.
  2. A truncate (``t``) removes every row whose last change is before it: the changes before
     the epoch's last truncate are dropped, and the merge deletes every row of the table the
     remaining changes do not touch (:attr:`Reduced.truncated`).
  3. An update whose ``unchanged`` lists columns (TOASTed values PostgreSQL did not send) is
     refused, naming the table and the columns: its ``after`` holds null for them, and a
     merge would write that null over the value the table has. ``REPLICA IDENTITY FULL`` on
     the source table sends them.
  4. The result has the table's columns (the fields of ``after``), the key's columns taken
     from ``key`` (a delete has no ``after``), and :data:`OP_COLUMN`.

Thread model: none (functions of Arrow tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The reduced rows' operation column: ``d`` deletes the key, anything else puts the row.
OP_COLUMN = "_sparkcoord_op"


class ChangeStreamError(ValueError):
    """The staged rows cannot be merged (rule 3), or are not a change stream."""


@dataclass(frozen=True)
class Reduced:
    """What one merge applies."""

    #: the table's columns, the key's filled for deletes too, and :data:`OP_COLUMN`
    rows: Any
    #: an epoch's truncate: delete every row of the table ``rows`` does not touch (rule 2)
    truncated: bool


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
    unchanged = ordered.column("unchanged") if "unchanged" in ordered.schema.names else None
    if unchanged is not None and ordered.num_rows:
        updates = pc.and_(pc.equal(ops, "u"), pc.greater(pc.list_value_length(unchanged), 0))
        hit = ordered.filter(pc.fill_null(updates, False))
        if hit.num_rows:
            names = sorted({c for cs in hit.column("unchanged").to_pylist() for c in cs or ()})
            raise ChangeStreamError(
                f"table {table}: an update did not send column(s) {', '.join(names)} (large "
                f"values PostgreSQL keeps out of line and did not change); a merge would write "
                f"null over them. Set REPLICA IDENTITY FULL on the source table, or use mode "
                f"'append' and apply the changes yourself (docs/cdc.md)")
    ordered = ordered.filter(pc.not_equal(ops, "t"))
    key = ordered.column("key").combine_chunks()
    after = ordered.column("after").combine_chunks()
    arrays = {}
    for field in columns:
        # struct_field, not .field(): a delete's null ``after`` must give nulls, not the
        # child array's placeholder values
        source = key if field.name in keys else after
        arrays[field.name] = pc.struct_field(source, field.name)
    flat = pa.table({**arrays, OP_COLUMN: ordered.column("op"),
                     "_rank": pa.array(range(ordered.num_rows), pa.int64())})
    # rule 1: per key, the last change
    last = flat.group_by(keys, use_threads=False).aggregate([("_rank", "max")])
    wanted = pc.is_in(flat.column("_rank"), value_set=last.column("_rank_max"))
    rows = flat.filter(wanted).drop_columns(["_rank"])
    return Reduced(rows.cast(pa.schema([*columns, pa.field(OP_COLUMN, pa.string())])),
                   truncated)

