"""Snapshot chunk planning (sparkcoord/sources/postgres/core/chunks.py and io/catalog.py): on real
tables of 10,000 rows, by integer and text keys (an ICU collation whose order is not
Python's), every row is in exactly one chunk and every chunk but the last has the asked size;
chunks come one at a time from a state of a few dozen bytes that a restored planner continues
from; tables without a usable key are errors naming them; and a property over generated key
sets (duplicates and NULLs in a named chunk key column included), in memory and on the
server."""

from __future__ import annotations

import itertools
import pickle
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcoord.sources.postgres.core.chunks import (
    BoundaryQuery,
    Chunk,
    ChunkPlanner,
    Key,
    choose_chunk_key,
    chunk_sql,
)
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.errors import ChunkKeyError
from sparkcoord.sources.postgres.io import catalog

_names = itertools.count()


def plan(conn: Any, planner: ChunkPlanner) -> list[Chunk]:
    chunks = []
    while (chunk := catalog.next_chunk(conn, planner)) is not None:
        chunks.append(chunk)
    assert planner.done and chunks[-1].last
    return chunks


def rows_by_chunk(conn: Any, chunks: list[Chunk], column: str) -> list[list[Any]]:
    return [[row[0] for row in catalog.read_chunk(conn, chunk, [column], batch_rows=777)]
            for chunk in chunks]


def test_an_integer_keyed_table_of_10000_rows_is_covered_once_in_chunks_of_the_asked_size(
        admin: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    keys = random.Random(seed).sample(range(-50_000, 50_000), 10_000)
    admin.execute("CREATE TABLE chunk_ints (id bigint PRIMARY KEY, payload text)")
    with admin.cursor() as cursor:
        cursor.executemany("INSERT INTO chunk_ints VALUES (%s, 'x')", [(k,) for k in keys])
    planner = catalog.planner_for(admin, TableName.parse("chunk_ints"), 1_000)
    chunks = plan(admin, planner)
    rows = rows_by_chunk(admin, chunks, "id")
    assert [len(r) for r in rows] == [1_000] * 10  # the last chunk is the last 1,000 keys
    assert Counter(k for r in rows for k in r) == Counter(keys)
    assert [c.index for c in chunks] == list(range(10))
    assert chunks[0].start is None and chunks[-1].end is None
    assert all(a.end == b.start for a, b in itertools.pairwise(chunks))
    assert all(isinstance(c.end, int) for c in chunks[:-1])


def test_a_text_keyed_table_is_chunked_in_the_columns_collation_not_pythons(admin: Any) -> None:
    words = [f"{prefix}{i:05d}" for i, prefix in zip(range(10_000), itertools.cycle(
        ["a", "B", "é", "Z", "ä", "_", "b", "É"]), strict=False)]
    admin.execute('CREATE TABLE chunk_words (word text COLLATE "en-x-icu" PRIMARY KEY)')
    with admin.cursor() as cursor:
        cursor.executemany("INSERT INTO chunk_words VALUES (%s)", [(w,) for w in words])
    chunks = plan(admin, catalog.planner_for(admin, TableName.parse("chunk_words"), 1_500))
    rows = rows_by_chunk(admin, chunks, "word")
    assert [len(r) for r in rows] == [1_500] * 6 + [1_000]
    assert sorted(w for r in rows for w in r) == sorted(words)
    # the server's order is not Python's: "é..." sorts between "a..." and "Z..." in ICU
    assert sorted(words) != [w for r in rows for w in r]


def test_chunks_come_one_query_at_a_time_from_a_small_state_a_restored_planner_continues(
        admin: Any) -> None:
    admin.execute("CREATE TABLE chunk_resume (id int PRIMARY KEY)")
    admin.execute("INSERT INTO chunk_resume SELECT generate_series(1, 10000)")
    table = TableName.parse("chunk_resume")
    whole = plan(admin, catalog.planner_for(admin, table, 700))
    planner = catalog.planner_for(admin, table, 700)
    first = []
    for _ in range(5):
        query = planner.next_query()
        assert query is not None
        chunk = planner.boundary_found(query, catalog.next_boundary(admin, planner, query))
        assert chunk is not None  # one answer, one chunk
        first.append(chunk)
    saved = pickle.dumps(planner.state)
    assert len(saved) < 300
    rest = plan(admin, ChunkPlanner.restored(pickle.loads(saved)))
    assert first + rest == whole
    assert len(pickle.dumps(whole[3])) < 200


def test_a_table_without_a_primary_key_is_an_error_naming_it_unless_a_key_column_is_named(
        admin: Any) -> None:
    admin.execute("CREATE TABLE chunk_nokey (n int, label text)")
    admin.execute("INSERT INTO chunk_nokey SELECT i % 7, 'x' FROM generate_series(1, 100) i")
    admin.execute("INSERT INTO chunk_nokey VALUES (NULL, 'null key')")
    table = TableName.parse("chunk_nokey")
    with pytest.raises(ChunkKeyError, match=r"table public.chunk_nokey has no primary key: "
                                            r"name a chunk key column"):
        catalog.planner_for(admin, table, 10)
    with pytest.raises(ChunkKeyError, match=r"table public.chunk_nokey has no column 'nope'"):
        catalog.planner_for(admin, table, 10, chunk_key_column="nope")
    # a named column with long runs of one value and a NULL: every row still once
    chunks = plan(admin, catalog.planner_for(admin, table, 10, chunk_key_column="n"))
    rows = rows_by_chunk(admin, chunks, "n")
    assert sum(len(r) for r in rows) == 101
    assert None in rows[0]
    assert all(len(set(r)) == 1 for r in rows[1:-1] if r)  # each run of 14-15 rows is one chunk


def test_a_composite_or_unorderable_key_is_an_error_naming_the_table(admin: Any) -> None:
    admin.execute("CREATE TABLE chunk_pair (a int, b int, c uuid, PRIMARY KEY (a, b))")
    admin.execute("CREATE TABLE chunk_uuid (id uuid PRIMARY KEY)")
    with pytest.raises(ChunkKeyError, match=r"table public.chunk_pair has a composite primary "
                                            r"key \(a, b\): splitting by a composite key is not "
                                            r"yet supported"):
        catalog.planner_for(admin, TableName.parse("chunk_pair"), 10)
    assert catalog.planner_for(admin, TableName.parse("chunk_pair"), 10,
                               chunk_key_column="b").state.key_column == "b"
    with pytest.raises(ChunkKeyError, match=r"table public.chunk_uuid: column 'id' is of type "
                                            r"uuid; a chunk key must be an integer"):
        catalog.planner_for(admin, TableName.parse("chunk_uuid"), 10)
    with pytest.raises(Exception, match=r"table public.chunk_missing does not exist"):
        catalog.planner_for(admin, TableName.parse("chunk_missing"), 10)


def test_a_chunk_reads_nulls_only_in_the_first_chunk_and_quotes_every_name() -> None:
    table = TableName.parse('"My Schema"."Odd ""Name"""')
    first = Chunk(table, 'k"ey', 0, None, 10)
    middle = Chunk(table, 'k"ey', 1, 10, 20)
    assert chunk_sql(first, ["a"]) == (
        'SELECT "a" FROM "My Schema"."Odd ""Name""" WHERE ("k""ey" < %s OR "k""ey" IS NULL)',
        (10,))
    assert chunk_sql(middle) == (
        'SELECT * FROM "My Schema"."Odd ""Name""" WHERE "k""ey" >= %s AND "k""ey" < %s',
        (10, 20))
    assert chunk_sql(Chunk(table, "k", 0, None, None))[0] == 'SELECT * FROM "My Schema"."Odd ""Name"""'


def test_choosing_the_key_needs_no_server() -> None:
    t = TableName("s", "t")
    assert choose_chunk_key(t, ["id"], {"id": 20, "x": 25}) == "id"
    assert choose_chunk_key(t, [], {"id": 20, "x": 25}, "x") == "x"


# -- the property: every row in exactly one chunk ------------------------------------------


def fake_boundary(keys: list[Key | None], query: BoundaryQuery) -> Key | None:
    """What the server answers, for keys that sort the same in Python and in the column."""
    present = sorted(k for k in keys if k is not None)  # type: ignore[type-var]
    if query.after is not None:
        after = query.after
        present = [k for k in present if (k >= after if query.inclusive else k > after)]  # type: ignore[operator]
    return present[query.offset] if query.offset < len(present) else None


def in_chunk(key: Key | None, chunk: Chunk) -> bool:
    if key is None:
        return chunk.start is None
    return ((chunk.start is None or key >= chunk.start)  # type: ignore[operator]
            and (chunk.end is None or key < chunk.end))  # type: ignore[operator]


key_sets = st.one_of(
    st.lists(st.one_of(st.none(), st.integers(-20, 20)), max_size=80),
    st.lists(st.one_of(st.none(), st.text("abcAB_", max_size=3)), max_size=80),
    st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), unique=True, max_size=80),
)


@settings(max_examples=300, print_blob=True)
@given(keys=key_sets, size=st.integers(1, 12))
def test_every_generated_row_is_in_exactly_one_chunk(keys: list[Key | None], size: int) -> None:
    planner = ChunkPlanner(TableName("s", "t"), "k", size)
    chunks: list[Chunk] = []
    while (query := planner.next_query()) is not None:
        chunk = planner.boundary_found(query, fake_boundary(keys, query))
        if chunk is not None:
            chunks.append(chunk)
        assert len(chunks) <= len(keys) + 1  # never stalls
    for key in keys:
        assert sum(in_chunk(key, c) for c in chunks) == 1, key
    non_null = [k for k in keys if k is not None]
    if len(set(non_null)) == len(non_null):  # a unique key: chunks of exactly the asked size
        sizes = [sum(in_chunk(k, c) for k in non_null) for c in chunks]
        assert all(s == size for s in sizes[:-1]) and sizes[-1] <= size


@settings(max_examples=20, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.one_of(st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=40),
                      st.lists(st.one_of(st.none(), st.text("aAbBéÉ_ ", max_size=3)),
                               max_size=40)),
       size=st.integers(1, 6))
def test_every_generated_row_on_the_server_is_in_exactly_one_chunk(
        admin: Any, keys: list[Key | None], size: int) -> None:
    n = next(_names)
    kind = "int" if any(isinstance(k, int) for k in keys) else 'text COLLATE "en-x-icu"'
    admin.execute(f"CREATE TABLE chunk_prop_{n} (row_id serial PRIMARY KEY, k {kind})")
    with admin.cursor() as cursor:
        cursor.executemany(f"INSERT INTO chunk_prop_{n} (k) VALUES (%s)", [(k,) for k in keys])
    planner = catalog.planner_for(admin, TableName.parse(f"chunk_prop_{n}"), size,
                                  chunk_key_column="k")
    chunks = plan(admin, planner)
    seen = [row[0] for c in chunks for row in catalog.read_chunk(admin, c, ["row_id"])]
    assert sorted(seen) == list(range(1, len(keys) + 1))  # every row once
    admin.execute(f"DROP TABLE chunk_prop_{n}")
