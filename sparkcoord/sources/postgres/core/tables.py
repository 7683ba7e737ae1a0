"""A captured table as the catalog reports it: its columns (name, type, modifier, not null,
declared array dimensions) and its key; built by ``io/catalog.py``, read by the sans-IO
parts (``splits.py``'s table shapes, the chunk key's choice).

Thread model: none (frozen values).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcoord.sources.postgres.core.names import TableName


@dataclass(frozen=True, slots=True)
class TableColumn:
    name: str
    type_oid: int
    type_modifier: int
    not_null: bool
    #: an array column's declared dimensions (``attndims``; 0 when none were declared)
    dimensions: int = 0


@dataclass(frozen=True, slots=True)
class TableInfo:
    table: TableName
    columns: tuple[TableColumn, ...]
    primary_key: tuple[str, ...]
    #: columns with a unique index of their own (valid, not partial, not on an expression)
    unique_columns: frozenset[str] = frozenset()

    @property
    def column_types(self) -> dict[str, int]:
        return {c.name: c.type_oid for c in self.columns}
