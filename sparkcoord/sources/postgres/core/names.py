"""Names of tables, slots and publications as the source's options give them, and as SQL text.

Rules:
  1. A table is ``schema.table`` or ``table`` (schema ``public``); a part in double quotes keeps
     its case and may hold dots (``"Sales"."Order.Lines"``), an unquoted part is folded to
     lower case, as PostgreSQL does.
  2. SQL text names a table or column only through :func:`quote_ident`, always quoted, so no
     name is ever read as SQL.
  3. Slot and publication names are 1 to 63 characters of lower-case letters, digits and
     underscores: what a slot allows, and what pgoutput's ``publication_names`` parameter
     reads without quoting.

Thread model: none (pure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkcoord.core.encoding import encoded

_SIMPLE = re.compile(r"^[a-z0-9_]{1,63}$")


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (rule 2). Any thread."""
    if "\0" in name:
        raise ValueError(f"an identifier cannot hold a zero byte: {name!r}")
    return '"' + name.replace('"', '""') + '"'


@encoded("postgres.TableName")
@dataclass(frozen=True, slots=True, order=True)
class TableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``schema.table`` or ``table`` (rule 1). Any thread."""
        parts: list[str] = []
        rest = text.strip()
        while True:
            if rest.startswith('"'):
                match = re.match(r'"((?:[^"]|"")+)"', rest)
                if not match:
                    raise ValueError(f"table name {text!r}: an unclosed double quote")
                parts.append(match[1].replace('""', '"'))
                rest = rest[match.end():]
            else:
                match = re.match(r"[^.\"\s]+", rest)
                if not match:
                    raise ValueError(f"table name {text!r}: expected schema.table or table")
                parts.append(match[0].lower())
                rest = rest[match.end():]
            if not rest:
                break
            if not rest.startswith(".") or len(parts) == 2:
                raise ValueError(f"table name {text!r}: expected schema.table or table")
            rest = rest[1:]
        return cls("public", parts[0]) if len(parts) == 1 else cls(parts[0], parts[1])

    @property
    def sql(self) -> str:
        """``"schema"."table"`` (rule 2)."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def __str__(self) -> str:
        def show(part: str) -> str:
            return part if re.fullmatch(r"[a-z_][a-z0-9_]*", part) else quote_ident(part)
        return f"{show(self.schema)}.{show(self.name)}"


def parse_tables(text: str) -> tuple[TableName, ...]:
    """The ``tables`` option: names separated by commas (outside double quotes), each once.
    Any thread."""
    names: list[str] = []
    current, quoted = "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            names.append(current)
            current = ""
        else:
            current += ch
    names.append(current)
    tables = [TableName.parse(n) for n in names if n.strip()]
    if not tables:
        raise ValueError("option 'tables': name at least one table (schema.table)")
    seen: set[TableName] = set()
    for table in tables:
        if table in seen:
            raise ValueError(f"option 'tables': {table} is named twice")
        seen.add(table)
    return tuple(tables)


def check_simple_name(kind: str, name: str) -> str:
    """``name`` when it is a valid slot or publication name (rule 3), else an error naming
    ``kind``. Any thread."""
    if not _SIMPLE.match(name):
        raise ValueError(f"{kind} name {name!r}: use 1 to 63 lower-case letters, digits and "
                         "underscores")
    return name
