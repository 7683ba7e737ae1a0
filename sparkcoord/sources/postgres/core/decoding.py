"""A captured table's rows from their text forms to values (reader.py rules 3 and 4): the rows
of a chunk read and the changes of a pgoutput transaction. Pure functions of their inputs (no
connection, no clock).

Rules:
  1. A column's text form becomes its value by values.py (NULL stays ``None``, a TOASTed
     value not sent is :data:`~sparkcoord.sources.postgres.core.watermarks.UNCHANGED`);
     every conversion error names the table and the column.
  2. A change of a captured table is decoded only when pgoutput's description of the
     relation has the table's columns (names, types and type modifiers, in order); otherwise
     :class:`SchemaChanged` names the table and what changed (added, dropped, retyped or
     reordered columns), and no row of the wrong shape is made (reader.py rule 4).
  3. Changes of tables that are not captured are left out; a TRUNCATE becomes a ``'t'``
     change of each captured table it names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import (
    Delete,
    Insert,
    Relation,
    Row,
    Toast,
    Transaction,
    Truncate,
    Update,
)
from sparkcoord.sources.postgres.core.splits import TableShape
from sparkcoord.sources.postgres.core.watermarks import (
    UNCHANGED,
    Key,
    RowChange,
    RowValues,
    TxChanges,
)
from sparkcoord.sources.postgres.errors import SchemaChanged, ValueConversionError


class RowDecoder:
    """Text forms to values for one table (rules 1 and 2). Any thread."""

    def __init__(self, shape: TableShape) -> None:
        self.shape = shape
        self.names = shape.column_names
        self.converters = [values.converter(c.type_oid, c.type_modifier, c.dimensions)
                           for c in shape.columns]

    def row(self, texts: Sequence[Any]) -> RowValues:
        out: RowValues = {}
        for name, convert, text in zip(self.names, self.converters, texts, strict=True):
            if text is None:
                out[name] = None
            elif isinstance(text, Toast):
                out[name] = UNCHANGED
            else:
                try:
                    out[name] = convert(text)
                except ValueConversionError as e:
                    raise ValueConversionError(
                        f"table {self.shape.table}, column {name!r}: {e}") from None
        return out

    def key(self, row: RowValues) -> Key:
        return tuple(row[k] for k in self.shape.key)

    def convert(self, name: str, text: str) -> Any:
        """Column ``name``'s value from its text form (not NULL, not TOASTed)."""
        index = self.names.index(name)
        try:
            return self.converters[index](text)
        except ValueConversionError as e:
            raise ValueConversionError(f"table {self.shape.table}, column {name!r}: {e}") from None

    def check(self, relation: Relation) -> None:
        """Rule 2: ``relation`` (pgoutput's description) has this table's columns."""
        got = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        want = [(c.name, c.type_oid, c.type_modifier) for c in self.shape.columns]
        if got == want:
            return
        got_names, want_names = [g[0] for g in got], [w[0] for w in want]
        added = [n for n in got_names if n not in want_names]
        dropped = [n for n in want_names if n not in got_names]
        retyped = [g[0] for g in got for w in want if g[0] == w[0] and g[1:] != w[1:]]
        what = "; ".join(part for part in (
            f"column(s) added: {', '.join(added)}" if added else "",
            f"column(s) dropped: {', '.join(dropped)}" if dropped else "",
            f"column(s) retyped: {', '.join(retyped)}" if retyped else "",
            "columns reordered" if not (added or dropped or retyped) else "") if part)
        raise SchemaChanged(
            f"table {self.shape.table} changed while it was captured ({what}): the source "
            "stops rather than emit rows of another shape; every change committed before the "
            "first change of the new shape was delivered. Start it again with a new "
            "checkpoint location (startup mode 'initial' reads the table again with its new "
            "columns; drop the old replication slot): the changes written with the new shape "
            "stay in the stream, so undoing the change now does not let this checkpoint go on")


def decode_transaction(tx: Transaction, decoders: Mapping[TableName, RowDecoder]) -> TxChanges:
    """A pgoutput transaction as values (rules 2 and 3: changes of tables not captured are
    left out). Any thread."""
    changes: list[RowChange] = []
    for index, change in enumerate(tx.changes):
        relations = tx.relations[index]
        if isinstance(change, Truncate):
            for relation in relations:
                table = TableName(relation.namespace or "pg_catalog", relation.name)
                if table in decoders:
                    changes.append(RowChange("t", table))
            continue
        relation = relations[0]
        table = TableName(relation.namespace or "pg_catalog", relation.name)
        decoder = decoders.get(table)
        if decoder is None:
            continue
        decoder.check(relation)
        column = decoder.shape.chunk_key_column
        if isinstance(change, Insert):
            after = decoder.row(change.new)
            changes.append(RowChange("c", table, decoder.key(after), after, after[column]))
        elif isinstance(change, Update):
            after = decoder.row(change.new)
            key = decoder.key(after)
            before = _old_image(decoder, change.old, change.old_kind)
            old_key = decoder.key(before) if before is not None else None
            changes.append(RowChange(
                "u", table, key, after, after[column], old_key,
                before[column] if before is not None else after[column], before,
                change.old_kind == "O"))
        elif isinstance(change, Delete):
            before = _old_image(decoder, change.old, change.old_kind)
            assert before is not None
            changes.append(RowChange("d", table, decoder.key(before), None, before[column],
                                     before=before, full_before=change.old_kind == "O"))
    return TxChanges(tx.xid, tx.commit_lsn, tx.end_lsn, tx.commit_time, tuple(changes))


def _old_image(decoder: RowDecoder, old: Row | None, kind: str) -> RowValues | None:
    if old is None:
        return None
    image = decoder.row(old)
    if kind == "K":  # the old key's columns only (the others are sent as NULL)
        return {k: image[k] for k in decoder.shape.key}
    return image
