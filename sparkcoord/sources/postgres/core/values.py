"""Column values from their PostgreSQL text form (what pgoutput sends, and what a text-mode
query returns) to Python values, and each type's Arrow type.

Rules:
  1. A type is known by its oid (``pg_type.oid``, fixed for the built-in types) and its type
     modifier (``atttypmod``: a numeric's precision and scale). A type not in the table below
     stays text: its value is the server's text form and its Arrow type is string.
  2. The text forms are those of a session with ``DateStyle=ISO``, ``TimeZone=UTC``,
     ``bytea_output=hex`` and ``extra_float_digits=3`` (connection.py sets them on every
     session it opens; pgoutput formats values with the settings of the session that
     decodes, which for ``pg_logical_slot_peek_binary_changes`` is ours).
  3. The mapping:
       bool 16 -> bool; int2 21 -> int16; int4 23 -> int32; int8 20 -> int64; oid 26 ->
       int64; float4 700 -> float32; float8 701 -> float64 (NaN and infinities kept);
       numeric 1700 with a precision of at most 38 -> Decimal, decimal128(p, s); numeric
       without a precision (or above 38, or a scale above the precision or below zero) ->
       its text, string; text 25, varchar 1043,
       bpchar 1042, name 19, char 18 -> str; date 1082 -> date, date32; timestamp 1114 ->
       naive datetime, timestamp[us]; timestamptz 1184 -> aware UTC datetime,
       timestamp[us, UTC]; uuid 2950 -> str; json 114, jsonb 3802 -> str (the JSON text);
       bytea 17 -> bytes, binary; an array of any of these (the array types in
       :data:`ARRAY_ELEMENTS`) -> a list of the element's values (NULL elements None),
       nested as deep as the column's declared dimensions (``pg_attribute.attndims``:
       ``integer[]`` list<int32>, ``integer[][]`` list<list<int32>>; none declared, as
       ``CREATE TABLE AS`` leaves it, is one). PostgreSQL does not enforce the declared
       dimensions, so a value of another number of them is an error naming the declared and
       the value's dimensions and the way on (an empty array fits every column). The text is
       split by psycopg's array parser, each element then read as above; a lower bound other
       than 1 (``[0:2]={...}``) is not kept: the elements arrive in order, from the first.
       An array of a type not listed here is text, as that type is (rule 1).
  4. A value the Python type cannot hold is an error naming the type and the value, never a
     silent substitute: a numeric ``NaN`` or infinity as a decimal, a date or timestamp that
     is ``infinity``, before year 1 or after year 9999.
  5. A column of many values (a snapshot chunk) converts at once: :func:`column_from_texts`
     takes the text forms as an Arrow string array and casts them with Arrow's parsers where
     those read every text form of rule 2 exactly as rule 3 does (integers, floats through
     float64 as Python reads them, decimals, dates, timestamps with their offset, ``t``/``f``
     booleans). A column Arrow refuses (a value outside its range, ``infinity``, a BC date,
     a numeric ``NaN``) and the types Arrow has no parser for (bytea, arrays) go value by
     value through :func:`converter`: so the result, and every error, is the same as
     converting each value on its own.

Thread model: none (pure functions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from sparkcoord.sources.postgres.errors import ValueConversionError

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE = 114, 700, 701, 1042, 1043, 1082
TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1114, 1184, 1700, 2950, 3802

#: the built-in types of rule 3, by oid
TYPE_NAMES = {BOOL: "boolean", BYTEA: "bytea", CHAR: '"char"', NAME: "name", INT8: "bigint",
              INT2: "smallint", INT4: "integer", TEXT: "text", OID: "oid", JSON: "json",
              FLOAT4: "real", FLOAT8: "double precision", BPCHAR: "character",
              VARCHAR: "character varying", DATE: "date",
              TIMESTAMP: "timestamp without time zone", TIMESTAMPTZ: "timestamp with time zone",
              NUMERIC: "numeric", UUID: "uuid", JSONB: "jsonb"}

#: array type oid -> element type oid (rule 3), the built-in arrays of the mapped types
ARRAY_ELEMENTS = {1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1016: INT8, 1005: INT2,
                  1007: INT4, 1009: TEXT, 1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8,
                  1014: BPCHAR, 1015: VARCHAR, 1182: DATE, 1115: TIMESTAMP, 1185: TIMESTAMPTZ,
                  1231: NUMERIC, 2951: UUID, 3807: JSONB}
TYPE_NAMES.update({oid: TYPE_NAMES[element] + "[]" for oid, element in ARRAY_ELEMENTS.items()})

#: the largest decimal precision Arrow's decimal128 (and Spark's DecimalType) holds
MAX_DECIMAL_PRECISION = 38


def numeric_precision(type_modifier: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of ``numeric(p, s)`` from its type modifier, or None for a
    numeric without one. Any thread."""
    if type_modifier < 4:
        return None
    packed = type_modifier - 4
    return (packed >> 16) & 0xFFFF, packed & 0xFFFF


def _as_decimal(type_modifier: int) -> tuple[int, int] | None:
    shape = numeric_precision(type_modifier)
    # PostgreSQL 15 allows a scale above the precision or below zero; Spark's decimal does not
    if shape is None or shape[0] > MAX_DECIMAL_PRECISION or not 0 <= shape[1] <= shape[0]:
        return None
    return shape


def arrow_type(type_oid: int, type_modifier: int = -1, dimensions: int = 1) -> pa.DataType:
    """The Arrow type of a column (rule 3; string for a type not listed): ``dimensions`` is
    an array column's declared number (``attndims``). Any thread."""
    element = ARRAY_ELEMENTS.get(type_oid)
    if element is not None:  # an array's type modifier is its element's
        kind = arrow_type(element, type_modifier)
        for _ in range(max(dimensions, 1)):
            kind = pa.list_(kind)
        return kind
    if type_oid == BOOL:
        return pa.bool_()
    if type_oid == INT2:
        return pa.int16()
    if type_oid == INT4:
        return pa.int32()
    if type_oid in (INT8, OID):
        return pa.int64()
    if type_oid == FLOAT4:
        return pa.float32()
    if type_oid == FLOAT8:
        return pa.float64()
    if type_oid == NUMERIC:
        shape = _as_decimal(type_modifier)
        return pa.string() if shape is None else pa.decimal128(*shape)
    if type_oid == DATE:
        return pa.date32()
    if type_oid == TIMESTAMP:
        return pa.timestamp("us")
    if type_oid == TIMESTAMPTZ:
        return pa.timestamp("us", tz="UTC")
    if type_oid == BYTEA:
        return pa.binary()
    return pa.string()


def _fail(type_oid: int, text: str, problem: str) -> ValueConversionError:
    shown = text if len(text) <= 64 else text[:61] + "..."
    name = TYPE_NAMES.get(type_oid, f"type {type_oid}")
    return ValueConversionError(f"{name} value {shown!r}: {problem}")


def _bool(text: str) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    raise _fail(BOOL, text, "expected 't' or 'f'")


def _integer(type_oid: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise _fail(type_oid, text, "not an integer") from None
    return convert


def _float(type_oid: int) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            return float(text)  # Python reads NaN, Infinity and -Infinity as the server writes
        except ValueError:
            raise _fail(type_oid, text, "not a floating-point number") from None
    return convert


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise _fail(NUMERIC, text, "not a number") from None
    if not value.is_finite():
        raise _fail(NUMERIC, text, "a decimal column holds only finite numbers (NaN and "
                                   "infinities have no decimal form)")
    return value


_DATE = re.compile(r"^(\d{4,})-(\d\d)-(\d\d)( BC)?$")
_TIMESTAMP = re.compile(
    r"^(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?$")


def _date(text: str) -> date:
    if len(text) == 10:  # YYYY-MM-DD, the common form: C's parser
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass  # the checks below say why
    match = _DATE.match(text)
    if not match:
        raise _fail(DATE, text, _why_not_date(text))
    if match[4]:
        raise _fail(DATE, text, "a date before year 1 has no Python form")
    try:
        return date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError as e:
        raise _fail(DATE, text, str(e)) from None


def _why_not_date(text: str) -> str:
    if text in ("infinity", "-infinity"):
        return f"{text} has no Python form"
    return "expected YYYY-MM-DD (DateStyle ISO)"


def _timestamp(type_oid: int) -> Callable[[str], datetime]:
    aware = type_oid == TIMESTAMPTZ

    def convert(text: str) -> datetime:
        # the common form (years 1 to 9999, a space between date and time) through C's
        # parser; anything it refuses or reads otherwise goes the checked way below
        if len(text) >= 19 and text[10] == " " and text[-3:] != " BC":
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                pass
            else:
                if not aware and value.tzinfo is None:
                    return value
                offset = value.utcoffset()
                if aware and offset is not None:
                    if not offset:
                        return value.replace(tzinfo=timezone.utc)
                    try:
                        return (value.replace(tzinfo=None) - offset).replace(tzinfo=timezone.utc)
                    except OverflowError:
                        pass
        match = _TIMESTAMP.match(text)
        if not match or bool(match[8]) != aware:
            raise _fail(type_oid, text, _why_not_date(text).replace(
                "YYYY-MM-DD", "YYYY-MM-DD HH:MM:SS[.ffffff]" + ("+HH[:MM]" if aware else "")))
        if match[12]:
            raise _fail(type_oid, text, "a time before year 1 has no Python form")
        try:
            value = datetime(int(match[1]), int(match[2]), int(match[3]), int(match[4]),
                             int(match[5]), int(match[6]),
                             int((match[7] or "0").ljust(6, "0")))
        except ValueError as e:
            raise _fail(type_oid, text, str(e)) from None
        if not aware:
            return value
        offset = timedelta(hours=int(match[9]), minutes=int(match[10] or 0),
                           seconds=int(match[11] or 0))
        if match[8] == "-":
            offset = -offset
        try:
            return (value - offset).replace(tzinfo=timezone.utc)
        except OverflowError:
            raise _fail(type_oid, text, "outside the years 1 to 9999 in UTC") from None
    return convert


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise _fail(BYTEA, text, "expected the hex form \\x... (bytea_output=hex)")
    try:
        return bytes.fromhex(text[2:])
    except ValueError:
        raise _fail(BYTEA, text, "not hex digits after \\x") from None


def _text(text: str) -> str:
    return text


def _dimensions(parts: list[Any]) -> int:
    """How many dimensions psycopg's nested lists have (PostgreSQL's arrays are rectangular:
    the first element tells)."""
    depth = 1
    while parts and isinstance(parts[0], list):
        parts, depth = parts[0], depth + 1
    return depth


def _sql_type(type_oid: int, type_modifier: int) -> str:
    """A mapped type's SQL name with its modifier (``numeric(6,2)``, ``character
    varying(10)``, ``timestamp(3) with time zone``), for a statement in an error."""
    name = TYPE_NAMES[type_oid]
    shape = numeric_precision(type_modifier) if type_oid == NUMERIC else None
    if shape is not None:
        return f"numeric({shape[0]},{shape[1]})"
    if type_oid in (VARCHAR, BPCHAR) and type_modifier >= 4:
        return f"{name}({type_modifier - 4})"
    if type_oid in (TIMESTAMP, TIMESTAMPTZ) and type_modifier >= 0:
        return name.replace("timestamp", f"timestamp({type_modifier})", 1)
    return name


def _array(type_oid: int, element: Callable[[str], Any], element_sql: str,
           dimensions: int) -> Callable[[str], list[Any]]:
    from psycopg import adapters
    from psycopg.pq import Format

    loader = adapters.get_loader(1009, Format.TEXT)  # text[]: the elements as text
    assert loader is not None, "psycopg has a text[] loader"
    texts = loader(1009, None)
    declared = max(dimensions, 1)

    def nested(parts: list[Any], depth: int) -> list[Any]:
        if depth == 1:
            return [None if p is None else element(p) for p in parts]
        return [nested(p, depth - 1) for p in parts]

    def convert(text: str) -> list[Any]:
        try:
            parts = texts.load(text.encode())
        except Exception as e:  # noqa: BLE001 - psycopg's parser error, named below
            raise _fail(type_oid, text, f"not an array's text form ({e})") from None
        if not parts:
            return []  # '{}' has no dimensions: it fits every column
        found = _dimensions(parts)
        if found != declared:
            brackets = "[]" * found
            raise _fail(type_oid, text, (
                f"a {found}-dimensional array in a column declared with {declared} "
                f"dimension{'s' if declared > 1 else ''} (PostgreSQL does not enforce the "
                f"declared number; its Spark type, nested arrays, needs it). The way on: "
                f"declare the column's dimensions (ALTER TABLE ... ALTER COLUMN ... TYPE "
                f"{element_sql}{brackets}, which rewrites nothing) and start again with a "
                f"new checkpoint location and startupMode initial, as for a schema change; "
                f"or store only {declared}-dimensional values in it"))
        return nested(parts, declared)
    return convert


def converter(type_oid: int, type_modifier: int = -1,
              dimensions: int = 1) -> Callable[[str], Any]:
    """The function from a column's text form to its Python value (rule 3), chosen once per
    column (``dimensions``: an array column's declared number). Any thread."""
    element = ARRAY_ELEMENTS.get(type_oid)
    if element is not None:
        return _array(type_oid, converter(element, type_modifier),
                      _sql_type(element, type_modifier), dimensions)
    if type_oid == BOOL:
        return _bool
    if type_oid in (INT2, INT4, INT8, OID):
        return _integer(type_oid)
    if type_oid in (FLOAT4, FLOAT8):
        return _float(type_oid)
    if type_oid == NUMERIC:
        return _text if _as_decimal(type_modifier) is None else _decimal
    if type_oid == DATE:
        return _date
    if type_oid in (TIMESTAMP, TIMESTAMPTZ):
        return _timestamp(type_oid)
    if type_oid == BYTEA:
        return _bytea
    return _text


#: the types whose text forms Arrow's cast from string reads as rule 3 does (rule 5)
_ARROW_PARSED = frozenset({INT2, INT4, INT8, OID, FLOAT8, DATE, TIMESTAMP, TIMESTAMPTZ})


def column_from_texts(type_oid: int, type_modifier: int, texts: pa.Array,
                      dimensions: int = 1) -> pa.Array:
    """A column's values from their text forms (rule 5): ``texts`` a string array (null for
    SQL NULL), the result an array of :func:`arrow_type`. A value that cannot be converted is
    the :class:`ValueConversionError` :func:`converter` raises for it (the caller adds the
    table and the column). Any thread."""
    import pyarrow.compute as pc

    kind = arrow_type(type_oid, type_modifier, dimensions)
    if converter(type_oid, type_modifier) is _text:
        return texts
    try:
        if type_oid == BOOL:
            if pc.all(pc.is_in(texts.drop_null(), pa.array(["t", "f"]))).as_py() is not False:
                return pc.equal(texts, "t")
        elif type_oid in _ARROW_PARSED:
            return pc.cast(texts, kind)
        elif type_oid == FLOAT4:  # through float64, as Python's float() and pa.array do
            return pc.cast(pc.cast(texts, pa.float64()), kind)
        elif type_oid == NUMERIC:
            return pc.cast(texts, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass  # a value Arrow refuses: each value on its own says which and why
    convert = converter(type_oid, type_modifier, dimensions)
    items = [None if text is None else convert(text) for text in texts.to_pylist()]
    try:
        return pa.array(items, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        for item, text in zip(items, texts.to_pylist(), strict=True):
            try:
                pa.array([item], kind)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise _fail(type_oid, text, f"does not fit {kind}") from None
        raise ValueConversionError(f"{TYPE_NAMES.get(type_oid, type_oid)} column: {e}") from None


def from_text(type_oid: int, text: str | None, type_modifier: int = -1,
              dimensions: int = 1) -> Any:
    """One value from its text form (None stays None). Any thread."""
    return None if text is None else converter(type_oid, type_modifier, dimensions)(text)


def is_known(type_oid: int) -> bool:
    """Whether rule 3 lists the type (an unknown type stays text). Any thread."""
    return type_oid in TYPE_NAMES
