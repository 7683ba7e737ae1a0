"""Column values from their text form (sparkcoord/sources/postgres/core/values.py), for every type
it maps, against the text a real server writes, both in a query and in pgoutput's messages;
and the Arrow type of each, which holds the converted value."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import column_values
from sparkcoord.sources.postgres.errors import ValueConversionError
from sparkcoord.sources.postgres.io import replication

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
    ("numeric(3,5)", "0.00123", "0.00123", pa.string()),  # scale above precision: text
    ("numeric(5,-2)", "12345", "12300", pa.string()),  # negative scale: text
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


def test_an_array_of_other_dimensions_than_its_column_declares_is_an_error_naming_the_way_on(
        admin: Any) -> None:
    text, oid, modifier = server_text(admin, "int4[]", "'{{1,2},{3,4}}'")
    with pytest.raises(ValueConversionError, match=r"integer\[\] value '\{\{1,2\},\{3,4\}\}': a "
                       r"2-dimensional array in a column declared with 1 dimension .*ALTER "
                       r"TABLE .* TYPE integer\[\]\[\].*new checkpoint location"):
        values.from_text(oid, text, modifier)
    with pytest.raises(ValueConversionError, match=r"a 1-dimensional array in a column declared "
                                                   r"with 2 dimensions"):
        values.from_text(oid, "{1,2}", modifier, dimensions=2)
    for sql_type, statement in [("numeric(6,2)[]", "numeric(6,2)[][]"),
                                ("varchar(10)[]", "character varying(10)[][]"),
                                ("timestamptz(3)[]", "timestamp(3) with time zone[][]"),
                                ('"char"[]', '"char"[][]')]:
        text, oid, modifier = server_text(admin, sql_type, "'{{NULL}}'")
        with pytest.raises(ValueConversionError) as e:
            values.from_text(oid, text, modifier)
        assert f"TYPE {statement}, which rewrites nothing" in str(e.value)
        admin.execute(f"CREATE TEMP TABLE declared (v {sql_type})")
        admin.execute(f"ALTER TABLE declared ALTER COLUMN v TYPE {statement}")  # the way on runs
        admin.execute("DROP TABLE declared")


# -- rule 5: a column at a time ---------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sparkcoord.sources.postgres.core.splits import SnapshotChunk, TableShape  # noqa: E402
from sparkcoord.sources.postgres.reader import ReaderConfig, read_chunk_watermarked  # noqa: E402


def _one_by_one(oid: int, modifier: int, texts: list[str | None]) -> list[Any]:
    """The row path's values: each text converted alone, held in the column's Arrow type."""
    convert = values.converter(oid, modifier)
    kind = values.arrow_type(oid, modifier)
    return pa.array([None if t is None else convert(t) for t in texts], kind).to_pylist()


def test_a_chunk_read_a_column_at_a_time_holds_what_each_value_read_alone_holds(
        admin: Any, admin_options: Any) -> None:
    """Every mapped type's server text form, through COPY's CSV and values.py rule 5, equals the
    value the row path (pgoutput's and a query's text, one value at a time) makes of it."""
    columns = [(f"c{i}", c[0], c[1]) for i, c in enumerate(CASES)]
    admin.execute("CREATE TABLE chunk_types (id int PRIMARY KEY, "
                  + ", ".join(f"{name} {sql_type}" for name, sql_type, _ in columns) + ")")
    admin.execute("INSERT INTO chunk_types VALUES (0, "
                  + ", ".join(f"({literal})::{sql_type}" for _, sql_type, literal in columns)
                  + ")")
    admin.execute("INSERT INTO chunk_types (id) VALUES (1)")  # every column NULL
    for i, (name, sql_type, literal) in enumerate(columns):  # each value in a row of its own
        admin.execute(f"INSERT INTO chunk_types (id, {name}) VALUES (%s, ({literal})::{sql_type})",
                      (i + 2,))
    table = TableName("public", "chunk_types")
    replication.ensure_publication(admin, "chunk_types_pub", [table])
    replication.ensure_slot(admin, "chunk_types_slot")
    from sparkcoord.sources.postgres.io import catalog

    shape = TableShape.of(catalog.table_info(admin, table))
    config = ReaderConfig(admin_options, "chunk_types_slot", "chunk_types_pub", (shape,))
    chunk = SnapshotChunk(split_id="t#0", table=table, key_column="id", index=0, start=None,
                          end=None)
    read = read_chunk_watermarked(admin, config, chunk)
    got = {row["id"]: row for row in read.batch.column("after").to_pylist()}
    assert sorted(got) == list(range(len(columns) + 2))
    texts = {row[0]: row[1:] for row in admin.execute(
        "SELECT id, " + ", ".join(f"CASE WHEN {n} IS NOT NULL THEN format('%s', {n}) END"
                                  for n, _, _ in columns)
        + " FROM chunk_types").fetchall()}
    for column, (name, _, _) in zip(shape.columns[1:], columns, strict=True):
        want = _one_by_one(column.type_oid, column.type_modifier,
                           [texts[i][int(name[1:])] for i in sorted(got)])
        assert [got[i][name] for i in sorted(got)] == want, name
    replication.drop_slot(admin, "chunk_types_slot")


def test_a_column_arrow_refuses_converts_value_by_value_with_the_same_error() -> None:
    cases = [
        (values.DATE, -1, ["2024-01-01", "infinity"], r"date value 'infinity'"),
        (values.DATE, -1, ["0044-03-15 BC"], r"before year 1"),
        (values.TIMESTAMP, -1, ["10000-01-01 00:00:00"], r"year 10000"),
        (values.NUMERIC, (10 << 16 | 2) + 4, ["1.50", "NaN"], r"numeric value 'NaN'"),
        (values.BOOL, -1, ["t", "yes"], r"boolean value 'yes'"),
        (values.INT2, -1, ["1", "40000"], r"smallint value '40000': does not fit int16"),
        (values.BYTEA, -1, ["\\x00", "abc"], r"bytea value 'abc'"),
    ]
    for oid, modifier, texts, message in cases:
        with pytest.raises(ValueConversionError, match=message):
            values.column_from_texts(oid, modifier, pa.array(texts, pa.string()))


def test_values_arrow_cannot_parse_still_convert_value_by_value() -> None:
    got = values.column_from_texts(values.INT8, -1, pa.array([" 7", None, "8"], pa.string()))
    assert got.to_pylist() == [7, None, 8] and got.type == pa.int64()
    got = values.column_from_texts(values.BYTEA, -1, pa.array(["\\x00ff", None]))
    assert got.to_pylist() == [b"\x00\xff", None]


_FORMS = st.one_of(
    st.tuples(st.just(values.INT8), st.just(-1),
              st.integers(-2**63, 2**63 - 1).map(str)),
    st.tuples(st.just(values.INT2), st.just(-1), st.integers(-2**15, 2**15 - 1).map(str)),
    st.tuples(st.just(values.FLOAT8), st.just(-1),
              st.floats(allow_nan=False).map(lambda f: repr(f).replace("inf", "Infinity"))),
    st.tuples(st.just(values.FLOAT4), st.just(-1),
              st.floats(width=32, allow_nan=False).map(
                  lambda f: repr(f).replace("inf", "Infinity"))),
    st.tuples(st.just(values.NUMERIC), st.just((18 << 16 | 4) + 4),
              st.decimals(min_value=-10**13, max_value=10**13, places=4,
                          allow_nan=False).map(lambda d: f"{d:.4f}")),
    st.tuples(st.just(values.DATE), st.just(-1), st.dates().map(lambda d: d.isoformat())),
    st.tuples(st.just(values.TIMESTAMP), st.just(-1),
              st.datetimes().map(lambda d: d.isoformat(sep=" "))),
    st.tuples(st.just(values.TIMESTAMPTZ), st.just(-1),
              st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
                  lambda d: d.isoformat(sep=" ") + "+00")),
    st.tuples(st.just(values.BOOL), st.just(-1), st.sampled_from(["t", "f"])),
)


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.lists(_FORMS, min_size=1, max_size=20))
def test_columns_of_server_text_forms_equal_their_values_read_one_by_one(
        forms: list[tuple[int, int, str]]) -> None:
    """values.py rule 5 as a property: texts in the server's forms (rule 2), cast by Arrow,
    hold exactly the values the one-by-one path makes of them."""
    by_type: dict[tuple[int, int], list[str | None]] = {}
    for oid, modifier, text in forms:
        by_type.setdefault((oid, modifier), []).append(text)
    for (oid, modifier), texts in by_type.items():
        texts.append(None)
        column = values.column_from_texts(oid, modifier, pa.array(texts, pa.string()))
        assert column.type == values.arrow_type(oid, modifier)
        assert column.to_pylist() == _one_by_one(oid, modifier, texts), (oid, texts)


def _offset_text(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    h, rest = divmod(abs(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{sign}{h:02d}" + (f":{m:02d}" if m or s else "") + (f":{s:02d}" if s else "")


@settings(max_examples=500, deadline=None, print_blob=True)
@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
       st.integers(-15 * 3600, 15 * 3600), st.integers(0, 6))
def test_a_timestamp_in_any_offset_and_precision_reads_as_the_instant_it_names(
        instant: datetime, offset_s: int, digits: int) -> None:
    """The server's form of a timestamp with time zone (any offset a zone ever had, 0 to 6
    fraction digits) reads as the UTC instant it names; the same text without the offset is
    the naive timestamp."""
    from datetime import timedelta

    instant = instant.replace(microsecond=instant.microsecond // 10 ** (6 - digits)
                              * 10 ** (6 - digits))
    local = instant + timedelta(seconds=offset_s)
    fraction = f".{local.microsecond:06d}"[:digits + 1].rstrip("0").rstrip(".")
    text = local.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0") + fraction
    if not 1 <= local.year <= 9999:
        return
    assert values.from_text(values.TIMESTAMP, text.zfill(19 + len(fraction))) == local
    aware = values.from_text(values.TIMESTAMPTZ, text + _offset_text(offset_s))
    assert aware == instant.replace(tzinfo=UTC) and aware.tzinfo is UTC


def test_a_timestamp_whose_utc_instant_leaves_years_1_to_9999_is_an_error() -> None:
    for text in ("0001-01-01 00:30:00+01", "9999-12-31 23:30:00-01"):
        with pytest.raises(ValueConversionError, match="outside the years 1 to 9999"):
            values.from_text(values.TIMESTAMPTZ, text)
    with pytest.raises(ValueConversionError, match="expected YYYY-MM-DD HH:MM:SS"):
        values.from_text(values.TIMESTAMP, "2024-01-01 00:00:00+00")  # naive column, aware text
    with pytest.raises(ValueConversionError, match="before year 1"):
        values.from_text(values.TIMESTAMP, "0044-03-15 00:00:00 BC")


# -- arrays: rule 3 -----------------------------------------------------------------------------

#: text elements that need quoting or escaping in an array's text form, and NULL
AWKWARD = ['a"b', "c,d", "{e}", "}{", "f\\g", '\\"', "", "NULL", None, "null", " lead ",
           "it's", "x y", "ü☃"]

#: (column type, value as psycopg sends it, expected value, expected Arrow type)
ARRAY_COLUMNS: list[tuple[str, Any, Any, pa.DataType]] = [
    ("text[]", AWKWARD, AWKWARD, pa.list_(pa.string())),
    ("varchar(10)[]", AWKWARD, AWKWARD, pa.list_(pa.string())),
    ("text[][]", [AWKWARD[:7], AWKWARD[7:]], [AWKWARD[:7], AWKWARD[7:]],
     pa.list_(pa.list_(pa.string()))),
    ("int4[]", [1, None, -3], [1, None, -3], pa.list_(pa.int32())),
    ("int8[][][]", [[[1], [2]], [[None], [4]]], [[[1], [2]], [[None], [4]]],
     pa.list_(pa.list_(pa.list_(pa.int64())))),
    ("numeric(6,2)[]", [Decimal("1.5"), None], [Decimal("1.50"), None],
     pa.list_(pa.decimal128(6, 2))),
    ("numeric[]", [Decimal("1e-20"), Decimal("NaN")], ["0.00000000000000000001", "NaN"],
     pa.list_(pa.string())),
    ("boolean[]", [True, None, False], [True, None, False], pa.list_(pa.bool_())),
    ("float8[]", [0.1, float("inf")], [0.1, float("inf")], pa.list_(pa.float64())),
    ("date[][]", [[date(2024, 2, 29)], [None]], [[date(2024, 2, 29)], [None]],
     pa.list_(pa.list_(pa.date32()))),
    ("timestamptz[]", [datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)],
     [datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)], pa.list_(pa.timestamp("us", tz="UTC"))),
    ("bytea[]", [b"\x00\\\"", None, b""], [b"\x00\\\"", None, b""], pa.list_(pa.binary())),
    ("jsonb[]", None, None, pa.list_(pa.string())),  # NULL, set below
    ("uuid[]", [uuid.UUID(UUID)], [UUID], pa.list_(pa.string())),
    ("int4[][]", [], [], pa.list_(pa.list_(pa.int32()))),  # '{}' fits every column
]


def _array_table(admin: Any, name: str) -> tuple[TableName, Any]:
    from sparkcoord.sources.postgres.io import catalog

    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, "
                  + ", ".join(f"c{i} {t}" for i, (t, _, _, _) in enumerate(ARRAY_COLUMNS)) + ")")
    table = TableName("public", name)
    replication.ensure_publication(admin, f"{name}_pub", [table])
    replication.ensure_slot(admin, f"{name}_slot")
    admin.execute(f"INSERT INTO {name} VALUES (1, "
                  + ", ".join("%s" for _ in ARRAY_COLUMNS) + ")",
                  [v for _, v, _, _ in ARRAY_COLUMNS])
    admin.execute(f"UPDATE {name} SET c12 = ARRAY['{{\"a\": [1, \"}}\"]}}'::jsonb, NULL]")
    admin.execute(f"INSERT INTO {name} (id) VALUES (2)")
    return table, TableShape.of(catalog.table_info(admin, table))


def test_arrays_arrive_as_nested_arrays_of_their_elements_in_the_snapshot_and_the_stream(
        admin: Any, admin_options: Any) -> None:
    from sparkcoord.sources.postgres.reader import RowDecoder, arrow_schema

    table, shape = _array_table(admin, "arrays_t")
    expected = {f"c{i}": want for i, (_, _, want, _) in enumerate(ARRAY_COLUMNS)}
    expected["c12"] = ['{"a": [1, "}"]}', None]
    after = arrow_schema([shape]).field("after").type
    for i, (_, _, _, arrow) in enumerate(ARRAY_COLUMNS):
        assert after.field(f"c{i}").type == arrow, ARRAY_COLUMNS[i][0]
    config = ReaderConfig(admin_options, "arrays_t_slot", "arrays_t_pub", (shape,))
    read = read_chunk_watermarked(admin, config, SnapshotChunk(
        split_id="a#0", table=table, key_column="id", index=0, start=None, end=None))
    rows = {row["id"]: row for row in read.batch.column("after").to_pylist()}
    assert {k: v for k, v in rows[1].items() if k != "id"} == expected
    assert all(v is None for k, v in rows[2].items() if k != "id")
    decoder = RowDecoder(shape)
    changes = [c for tx in replication.peek(admin, "arrays_t_slot", "arrays_t_pub").transactions
               for c in tx.changes]
    streamed = decoder.row(changes[1].new)  # type: ignore[union-attr]  # the update
    assert {k: v for k, v in streamed.items() if k != "id"} == expected
    assert pa.array([streamed], after).to_pylist() == [streamed]
    replication.drop_slot(admin, "arrays_t_slot")


def test_an_array_with_a_lower_bound_other_than_one_keeps_its_elements_in_order(
        admin: Any) -> None:
    admin.execute("CREATE TEMP TABLE bounds (v int[])")
    admin.execute("INSERT INTO bounds VALUES ('{1,2}')")
    admin.execute("UPDATE bounds SET v[0] = 5")  # PostgreSQL extends it to [0:2]={5,1,2}
    text, = admin.execute("SELECT v::text FROM bounds").fetchone()
    assert text == "[0:2]={5,1,2}"
    assert values.from_text(1007, text) == [5, 1, 2]


def test_an_array_of_more_dimensions_than_its_column_stops_with_table_column_value_and_way_on(
        admin: Any, admin_options: Any) -> None:
    from sparkcoord.sources.postgres.io import catalog
    from sparkcoord.sources.postgres.reader import RowDecoder

    admin.execute("CREATE TABLE arrays_bad (id int PRIMARY KEY, v int[])")
    table = TableName("public", "arrays_bad")
    replication.ensure_publication(admin, "arrays_bad_pub", [table])
    replication.ensure_slot(admin, "arrays_bad_slot")
    admin.execute("INSERT INTO arrays_bad VALUES (1, '{{1,2},{3,4}}')")
    shape = TableShape.of(catalog.table_info(admin, table))
    message = (r"table public.arrays_bad, column 'v': integer\[\] value '\{\{1,2\},\{3,4\}\}': "
               r"a 2-dimensional array in a column declared with 1 dimension .*ALTER TABLE "
               r"\.\.\. ALTER COLUMN \.\.\. TYPE integer\[\]\[\].*new checkpoint location")
    config = ReaderConfig(admin_options, "arrays_bad_slot", "arrays_bad_pub", (shape,))
    with pytest.raises(ValueConversionError, match=message):
        read_chunk_watermarked(admin, config, SnapshotChunk(
            split_id="b#0", table=table, key_column="id", index=0, start=None, end=None))
    change, = replication.peek(admin, "arrays_bad_slot", "arrays_bad_pub").transactions[0].changes
    with pytest.raises(ValueConversionError, match=message):
        RowDecoder(shape).row(change.new)  # type: ignore[union-attr]
    # the way on: declare the dimensions; a new start reads them from the catalog
    filenode = "SELECT pg_relation_filenode('arrays_bad')"
    before = admin.execute(filenode).fetchone()
    admin.execute("ALTER TABLE arrays_bad ALTER COLUMN v TYPE integer[][]")
    assert admin.execute(filenode).fetchone() == before  # nothing was rewritten
    declared = TableShape.of(catalog.table_info(admin, table))
    assert RowDecoder(declared).row(change.new)["v"] == [[1, 2], [3, 4]]  # type: ignore[union-attr]
    replication.drop_slot(admin, "arrays_bad_slot")
