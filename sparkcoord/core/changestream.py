"""What a change stream's producer tells its consumers about the tables it carries.

Rules:
  1. A change stream capturing several tables has one ``key`` and one ``after`` (and
     ``before``) struct holding the union of the tables' columns (a column a table lacks is
     null in its rows). Its ``after`` field's metadata under :data:`TABLES_METADATA` names
     each table's own columns and key: ``{"public.t": {"columns": [...], "key": [...]}}``.
  2. The producer (``sources/postgres/stream.py``) writes it; a consumer that applies one
     table's changes by key (``sinks/stream.py``, mode ``merge``) takes that table's columns
     and key from it, never the union's: a join on a union key column that is null for the
     table never matches.

Thread model: none (constants and pure functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: rule 1's metadata key
TABLES_METADATA = "sparkcoord.cdc.tables"


def tables_of(metadata: Mapping[str, Any] | None) -> dict[str, dict[str, list[str]]]:
    """The tables a change stream's ``after`` field's metadata names (rule 1); empty if it
    names none (not a change stream of ours, or written before rule 1)."""
    tables = (metadata or {}).get(TABLES_METADATA) or {}
    return {str(name): {"columns": list(shape["columns"]), "key": list(shape["key"])}
            for name, shape in tables.items()}
