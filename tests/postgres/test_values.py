"""Column values from their text form (sparkcoord/sources/postgres/values.py), for every type
it maps, against the text a real server writes, both in a query and in pgoutput's messages;
and the Arrow type of each, which holds the converted value."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.sources.postgres import replication, values
from sparkcoord.sources.postgres.errors import ValueConversionError
from sparkcoord.sources.postgres.names import TableName
from sparkcoord.sources.postgres.pgoutput import column_values

UTC = timezone.utc
UUID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"

#: (SQL type, SQL literal, expected Python value, expected Arrow type)
CASES: list[tuple[str, str, Any, pa.DataType]] = [
    ("boolean", "true", True, pa.bool_()),
    ("boolean", "false", False, pa.bool_()),
    ("smallint", "-32768", -32768, pa.int16()),
    ("integer", "2147483647", 2147483647, pa.int32()),
    ("bigint", "-9223372036854775808", -9223372036854775808, pa.int64()),
    ("real", "1.5", 1.5, pa.float32()),
    ("real", "0.1", 0.1, pa.float32()),  # the shortest text of the float4 nearest 0.1
    ("double precision", "0.1", 0.1, pa.float64()),
    ("double precision", "-1e300", -1e300, pa.float64()),
    ("double precision", "'Infinity'", float("inf"), pa.float64()),
    ("double precision", "'-Infinity'", float("-inf"), pa.float64()),
    ("numeric(10,2)", "12345678.9", Decimal("12345678.90"), pa.decimal128(10, 2)),
    ("numeric(38,0)", "-" + "9" * 38, Decimal("-" + "9" * 38), pa.decimal128(38, 0)),
    ("numeric", "3.14159265358979323846264338327950288419716939937510",
     "3.14159265358979323846264338327950288419716939937510", pa.string()),
    ("numeric", "'NaN'", "NaN", pa.string()),
    ("numeric(40,2)", "1.25", "1.25", pa.string()),
    ("text", "'héllo, wörld ☃'", "héllo, wörld ☃", pa.string()),
    ("text", "''", "", pa.string()),
    ("varchar(5)", "'abc'", "abc", pa.string()),
    ("char(5)", "'ab'", "ab   ", pa.string()),
    ("date", "'2024-02-29'", date(2024, 2, 29), pa.date32()),
    ("date", "'0001-01-01'", date(1, 1, 1), pa.date32()),
    ("timestamp", "'2024-01-02 03:04:05.123456'", datetime(2024, 1, 2, 3, 4, 5, 123456),
     pa.timestamp("us")),
    ("timestamp", "'2024-01-02 03:04:05'", datetime(2024, 1, 2, 3, 4, 5), pa.timestamp("us")),
    ("timestamp", "'2024-01-02 03:04:05.5'", datetime(2024, 1, 2, 3, 4, 5, 500000),
     pa.timestamp("us")),
    ("timestamptz", "'2024-01-02 03:04:05.000001+05:30'",
     datetime(2024, 1, 1, 21, 34, 5, 1, tzinfo=UTC), pa.timestamp("us", tz="UTC")),
    ("timestamptz", "'1900-06-01 00:00:00 Europe/Amsterdam'",
     datetime(1900, 5, 31, 23, 40, 28, tzinfo=UTC), pa.timestamp("us", tz="UTC")),
    ("uuid", f"'{UUID}'", UUID, pa.string()),
    ("json", """'{"b": 1,  "a": [true]}'""", '{"b": 1,  "a": [true]}', pa.string()),
    ("jsonb", """'{"b": 1,  "a": [true]}'""", '{"a": [true], "b": 1}', pa.string()),
    ("bytea", "'\\x00ff10'::bytea", b"\x00\xff\x10", pa.binary()),
    ("bytea", "''::bytea", b"", pa.binary()),
    ("interval", "'1 day 02:00'", "1 day 02:00:00", pa.string()),  # not mapped: stays text
    ("interval[]", "'{1 day}'", '{"1 day"}', pa.string()),  # an array of it: text too
    ("int4[]", "'{1,2,NULL}'", [1, 2, None], pa.list_(pa.int32())),
    ("text[]", """ARRAY['a,b', 'q"x', NULL, 'NULL', '']""", ["a,b", 'q"x', None, "NULL", ""],
     pa.list_(pa.string())),
    ("numeric(5,2)[]", "'{1.5,-2.25}'", [Decimal("1.50"), Decimal("-2.25")],
     pa.list_(pa.decimal128(5, 2))),
    ("timestamptz[]", "'{2026-01-02 03:04:05.678+01}'",
     [datetime(2026, 1, 2, 2, 4, 5, 678000, tzinfo=timezone.utc)],
     pa.list_(pa.timestamp("us", tz="UTC"))),
    ("bytea[]", "ARRAY['\\x00ff'::bytea]", [b"\x00\xff"], pa.list_(pa.binary())),
    ("bigint[]", "'{}'", [], pa.list_(pa.int64())),
]


def server_text(conn: Any, sql_type: str, literal: str) -> tuple[str, int, int]:
    """The text form the server writes for ``literal::sql_type``, with the type's oid and
    modifier (as a column of that type has them)."""
    conn.execute("DROP TABLE IF EXISTS one_value")
    conn.execute(f"CREATE TEMP TABLE one_value AS SELECT ({literal})::{sql_type} AS v")
    text, = conn.execute("SELECT format('%s', v) FROM one_value").fetchone()
    oid, modifier = conn.execute(
        "SELECT atttypid::int8, atttypmod FROM pg_attribute WHERE attrelid = "
        "'one_value'::regclass AND attname = 'v'").fetchone()
    return text, oid, modifier


@pytest.mark.parametrize("sql_type, literal, expected, arrow", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_mapped_type_reads_the_servers_text_form(admin: Any, sql_type: str, literal: str,
                                                      expected: Any, arrow: pa.DataType) -> None:
    text, oid, modifier = server_text(admin, sql_type, literal)
    value = values.from_text(oid, text, modifier)
    assert value == expected and type(value) is type(expected)
    assert values.arrow_type(oid, modifier) == arrow
    assert pa.array([value, None], type=arrow).to_pylist()[0] == (
        expected if arrow != pa.float32() else pytest.approx(expected))


def test_nan_floats_stay_nan(admin: Any) -> None:
    text, oid, modifier = server_text(admin, "double precision", "'NaN'")
    value = values.from_text(oid, text, modifier)
    assert value != value  # NaN


def test_pgoutput_sends_the_same_text_forms_as_a_query(admin: Any) -> None:
    columns = [(f"c{i}", c[0], c[1]) for i, c in enumerate(CASES)]
    admin.execute("CREATE TABLE all_types (id int PRIMARY KEY, "
                  + ", ".join(f"{name} {sql_type}" for name, sql_type, _ in columns) + ")")
    replication.ensure_publication(admin, "values_pub", [TableName.parse("all_types")])
    replication.ensure_slot(admin, "values_slot")
    admin.execute("INSERT INTO all_types VALUES (1, "
                  + ", ".join(f"({literal})::{sql_type}" for _, sql_type, literal in columns)
                  + ")")
    admin.execute("INSERT INTO all_types (id) VALUES (2)")
    t1, t2 = replication.peek(admin, "values_slot", "values_pub").transactions
    relation = t1.relation(0)
    row = column_values(relation, t1.changes[0].new)  # type: ignore[union-attr]
    for (name, _, _), (_, _, expected, arrow), column in zip(columns, CASES,
                                                             relation.columns[1:], strict=True):
        value = values.from_text(column.type_oid, row[name], column.type_modifier)  # type: ignore[arg-type]
        assert value == expected, name
        assert values.arrow_type(column.type_oid, column.type_modifier) == arrow, name
    nulls = t2.changes[0].new  # type: ignore[union-attr]
    assert nulls[1:] == (None,) * len(columns)
    assert values.from_text(values.INT4, None) is None


def test_values_a_python_type_cannot_hold_are_errors_naming_type_and_value() -> None:
    cases = [
        (values.NUMERIC, (10 << 16 | 2) + 4, "NaN", r"numeric value 'NaN': .*finite"),
        (values.DATE, -1, "infinity", r"date value 'infinity': infinity has no Python form"),
        (values.DATE, -1, "0044-03-15 BC", r"date value '0044-03-15 BC': .*before year 1"),
        (values.TIMESTAMP, -1, "10000-01-01 00:00:00", r"timestamp without time zone value "
                                                       r"'10000-01-01 00:00:00': year 10000"),
        (values.TIMESTAMPTZ, -1, "2024-01-01 00:00:00", r"expected YYYY-MM-DD HH:MM:SS"),
        (values.BOOL, -1, "yes", r"boolean value 'yes': expected 't' or 'f'"),
        (values.BYTEA, -1, "abc", r"bytea value 'abc': expected the hex form"),
        (values.INT4, -1, "1.5", r"integer value '1.5': not an integer"),
    ]
    for oid, modifier, text, message in cases:
        with pytest.raises(ValueConversionError, match=message):
            values.from_text(oid, text, modifier)


def test_an_unknown_type_stays_text() -> None:
    assert values.from_text(600, "(1,2)") == "(1,2)"  # point
    assert values.arrow_type(600) == pa.string()
    assert not values.is_known(600) and values.is_known(values.JSONB)


def test_numeric_precision_and_scale_come_from_the_type_modifier() -> None:
    assert values.numeric_precision(-1) is None
    assert values.numeric_precision((12 << 16 | 3) + 4) == (12, 3)
    assert values.arrow_type(values.NUMERIC, (12 << 16 | 3) + 4) == pa.decimal128(12, 3)


def test_uuids_are_their_canonical_text() -> None:
    value = values.from_text(values.UUID, UUID)
    assert uuid.UUID(value) == uuid.UUID(UUID) and value == UUID


def test_a_multi_dimensional_array_is_an_error_naming_its_type(admin: Any) -> None:
    text, oid, modifier = server_text(admin, "int4[]", "'{{1,2},{3,4}}'")
    with pytest.raises(ValueConversionError, match=r"integer\[\] value .*multi-dimensional"):
        values.from_text(oid, text, modifier)
