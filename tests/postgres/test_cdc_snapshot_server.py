"""The snapshot and the stream against a real PostgreSQL 15 (tests/postgres_server.py), no Spark:
the real enumerator (under the CoordinatorHarness, its workers run by hand) plans chunks of a
20,000-row table, readers driven by hand read them with watermarks while a writer thread
inserts, updates, deletes and changes keys, the stream takes over, and the snapshot rows plus
the changes applied by key equal the table at the end; the slot is confirmed behind the
readers, never ahead. The readers connect as an executor would: their options were pickled
(no password, decision 64) and libpq finds the password in PGPASSWORD, which the test sets."""

from __future__ import annotations

import functools
import itertools
import logging
import pickle
import random
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.core.errors import RequestFailed
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text
from sparkcoord.sources.postgres.core.splits import SnapshotChunk, TableShape
from sparkcoord.sources.postgres.enumerator import (
    PLANNING,
    PostgresEnumerator,
    PostgresEnumeratorIO,
)
from sparkcoord.sources.postgres.errors import ConnectionRefused, ValueConversionError
from sparkcoord.sources.postgres.io import catalog, replication
from sparkcoord.sources.postgres.io.connection import ConnectionOptions
from sparkcoord.sources.postgres.reader import (
    KeyOrder,
    PostgresReader,
    ReaderConfig,
    RowDecoder,
    SchemaChanged,
    read_chunk_watermarked,
    stream_position,
)
from sparkcoord.testing import CoordinatorHarness, ManualLane, ManualWorkers
from tests.postgres.test_cdc_enumerator import lanes
from tests.postgres_server import ADMIN_PASSWORD

_names = itertools.count()


class Writer(threading.Thread):
    """Random inserts, updates, deletes and key changes, a few per transaction."""

    def __init__(self, options: ConnectionOptions, table: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.options, self.table, self.rng = options, table, random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.options.connect() as conn:
                next_id = 1_000_000
                while not self.stop.is_set():
                    with conn.transaction():
                        for _ in range(self.rng.randint(1, 4)):
                            op, target = self.rng.random(), self.rng.randint(1, 20_000)
                            if op < 0.3:
                                next_id += 1
                                conn.execute(f"INSERT INTO {self.table} VALUES (%s, %s, %s)",
                                             (next_id, next_id, f"new {next_id}"))
                            elif op < 0.7:
                                conn.execute(f"UPDATE {self.table} SET v = v + 1, note = %s "
                                             "WHERE id = %s", (f"u{self.transactions}", target))
                            elif op < 0.85:
                                conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (target,))
                            else:  # a key change, often into another chunk
                                next_id += 1
                                conn.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s",
                                             (next_id, target))
                    self.transactions += 1
                    self.stop.wait(0.002)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.error = e


def run_reader(h: CoordinatorHarness, config: ReaderConfig, subtask: int, state: Any
               ) -> tuple[list[pa.RecordBatch], Any]:
    """One Spark task of the reader, by hand."""
    context = SubtaskContext(
        h.name, subtask, h.parallelism, h.epoch, 0, 0,
        send=lambda event: h.send_from_subtask(subtask, event),
        request=lambda request, timeout: h.request_from_subtask(subtask, request))
    reader = PostgresReader(config)
    reader.open(context, state)
    try:
        batches = list(reader.process())
        return batches, reader.snapshot_state()
    finally:
        reader.close()


def applied(batches: list[pa.RecordBatch]) -> dict[int, tuple[int, str]]:
    """The output applied by key in (lsn, seq) order."""
    rows: list[dict[str, Any]] = []
    for batch in batches:
        rows.extend(batch.to_pylist())
    rows.sort(key=lambda r: (r["lsn"], -1 if r["seq"] is None else r["seq"]))
    table: dict[int, tuple[int, str]] = {}
    for row in rows:
        key = row["key"]["id"]
        if row["op"] == "d":
            table.pop(key, None)
        else:
            assert row["op"] in ("r", "c", "u"), row
            table[key] = (row["after"]["v"], row["after"]["note"])
    return table


@pytest.fixture
def executor_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Rule 5 of reader.py: an executor's libpq finds the password in its environment."""
    monkeypatch.setenv("PGPASSWORD", ADMIN_PASSWORD)
    yield


def status(h: CoordinatorHarness) -> dict[str, Any]:
    result: dict[str, Any] = h.ask_as_client("status").result()
    return result


def test_a_20000_row_table_written_during_its_snapshot_ends_equal_to_the_snapshot_plus_changes(
        admin: Any, admin_options: ConnectionOptions, executor_env: None, tmp_path: Any) -> None:
    n = next(_names)
    name, slot, pub = f"cdc_big_{n}", f"cdc_big_slot_{n}", f"cdc_big_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL, note text)")
    admin.execute(f"INSERT INTO {name} SELECT g, g, 'row ' || g FROM generate_series(1, 20000) g")
    executor_options = pickle.loads(pickle.dumps(admin_options))  # what an executor gets
    assert executor_options.secrets == () and executor_options.secrets_dropped
    config = ReaderConfig(executor_options, slot, pub,
                          (TableShape.of(catalog.table_info(admin, table)),),
                          max_changes_per_batch=3000, max_chunks_per_batch=3)
    io = PostgresEnumeratorIO(admin_options, slot, pub, chunk_size=1000)
    runner, slot_runner = lanes()
    provider = functools.partial(PostgresEnumerator, io=lambda: io, tables=(table,),
                                 plan_ahead=6)
    h = CoordinatorHarness(provider, parallelism=2, storage_url=f"file://{tmp_path}/ckpt",
                           workers=runner.workers)
    writer = Writer(admin_options, name, seed=n)
    out: list[pa.RecordBatch] = []
    states: dict[int, Any] = {0: None, 1: None}
    seed = random.randrange(1 << 30)
    print(f"real-server snapshot seed {seed}")
    rng = random.Random(seed)
    h.start()
    try:
        runner.run_all()  # the slot and the publication exist before the writer starts
        h.run()
        writer.start()
        stopped_at: int | None = None
        streamed = 0  # changes the stream emitted (not snapshot reads)
        for _ in range(400):
            runner.run_all()
            h.clock.advance(0.5)  # a poll tick: the stream's next bound, on the slot worker
            h.run()
            slot_runner.run_all()
            h.run()
            h.checkpoint()
            for subtask in rng.sample([0, 1], 2):
                batches, states[subtask] = run_reader(h, config, subtask, states[subtask])
                out.extend(batches)
                streamed += sum(1 for b in batches for op in b.column("op").to_pylist()
                                if op != "r")
            h.commit()
            slot_runner.run_all()
            h.run()
            assert h.service.failure is None, h.service.failure
            phase = status(h)["phase"]
            if phase == "stream" and stopped_at is None and streamed > 100:
                # stream batches with writes until the stream emitted changes of its own (on a
                # busy machine the writer may be slow: a fixed number of batches made the
                # check below depend on its pace), then the writes stop
                writer.stop.set()
                writer.join(30)
                assert writer.error is None, writer.error
                stopped_at = lsn_from_text(admin.execute(
                    "SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
            if stopped_at is not None:
                position = next(p for s in states.values() if (p := stream_position(s)))
                if position.after >= stopped_at and position.filter is None:
                    break
        else:
            raise AssertionError(f"the stream never caught up (seed {seed}): {status(h)}")
        assert writer.transactions > 50  # the snapshot really ran beside the writes
        assert status(h)["chunks_finished"] >= 20
        final = {r[0]: (r[1], r[2]) for r in admin.execute(
            f"SELECT id, v, note FROM {name}").fetchall()}
        got = applied(out)
        missing = set(final) - set(got)
        extra = set(got) - set(final)
        wrong = [k for k in final if k in got and got[k] != final[k]]
        assert not missing and not extra and not wrong, (
            f"seed {seed}: {len(missing)} missing, {len(extra)} extra, {len(wrong)} wrong")
        snapshot_keys = [r["key"]["id"] for b in out for r in b.to_pylist() if r["op"] == "r"]
        assert len(snapshot_keys) == len(set(snapshot_keys))  # each key read by one chunk once
        rows = [r for b in out for r in b.to_pylist()]
        changes = [(r["lsn"], r["seq"], r["op"]) for r in rows if r["op"] != "r"]
        assert len(changes) == len(set(changes))  # no change emitted twice
        # and none that a chunk's rows already hold (its high watermark is at or after it)
        read_at = {r["key"]["id"]: r["lsn"] for r in rows if r["op"] == "r"}
        again = [r for r in rows if r["op"] != "r" and read_at.get(r["key"]["id"], -1) >= r["lsn"]]
        assert not again, f"seed {seed}: {len(again)} change(s) emitted and in the snapshot too"
        assert len(changes) > 100
        # the slot was confirmed, and never ahead of what the readers read
        info = replication.slot_info(admin, slot)
        assert info is not None and info.confirmed_flush_lsn is not None
        position = next(p for s in states.values() if (p := stream_position(s)))
        assert 0 < info.confirmed_flush_lsn <= position.after
    finally:
        writer.stop.set()
        writer.join(30)
        h.service.close()
        h.run()
        runner.run_all()
        replication.drop_slot(admin, slot)


def ten_rows_and_their_first_chunk(admin: Any, admin_options: ConnectionOptions, kind: str
                                   ) -> tuple[str, str, ReaderConfig, SnapshotChunk]:
    """A table of ids 1 to 10 with its publication and slot: (name, slot, the reader's
    config, the chunk of ids below 6)."""
    n = next(_names)
    name, slot, pub = f"cdc_{kind}_{n}", f"cdc_{kind}_slot_{n}", f"cdc_{kind}_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL, note text)")
    admin.execute(f"INSERT INTO {name} SELECT g, g, 'r' FROM generate_series(1, 10) g")
    replication.ensure_publication(admin, pub, [table])
    replication.ensure_slot(admin, slot)
    config = ReaderConfig(admin_options, slot, pub,
                          (TableShape.of(catalog.table_info(admin, table)),))
    chunk = SnapshotChunk(split_id=f"{table}#0", table=table, key_column="id", index=0,
                          start=None, end=6)
    return name, slot, config, chunk


def commit_in_the_window(reader: Any, other: Any, *statements: str) -> None:
    """Make ``other`` commit ``statements`` right after ``reader``'s chunk read takes its
    snapshot: invisible to the rows, before the high watermark, so in the window (rule 2)."""
    original = reader.execute

    def execute(statement: Any, params: Any = None, **kw: Any) -> Any:
        result = original(statement, params, **kw)
        if "pg_current_snapshot" in str(statement):
            for sql in statements:
                other.execute(sql)
        return result

    reader.execute = execute


def test_a_chunk_read_applies_the_changes_committed_between_its_snapshot_and_its_high_watermark(
        admin: Any, admin_options: ConnectionOptions) -> None:
    name, slot, config, chunk = ten_rows_and_their_first_chunk(admin, admin_options, "win")
    with admin_options.connect() as reader, admin_options.connect() as other:
        commit_in_the_window(
            reader, other, f"UPDATE {name} SET v = 100 WHERE id = 2",
            f"DELETE FROM {name} WHERE id = 3",
            f"UPDATE {name} SET id = 60 WHERE id = 4",  # out of the chunk
            f"UPDATE {name} SET id = 5 + 0 * id WHERE id = 5",  # no-op key change
            f"UPDATE {name} SET id = 0 WHERE id = 9")  # into the chunk
        read = read_chunk_watermarked(reader, config, chunk, KeyOrder(reader, config.shapes))
    rows = read.batch.column("after").to_pylist()
    assert {r["id"]: r["v"] for r in rows} == {0: 9, 1: 1, 2: 100, 5: 5}
    assert len(rows) == 4 and set(read.batch.column("op").to_pylist()) == {"r"}
    assert read.high > 0 and set(read.batch.column("lsn").to_pylist()) == {read.high}
    replication.drop_slot(admin, slot)


def test_a_truncate_between_a_chunks_snapshot_and_its_high_watermark_empties_the_rows_read(
        admin: Any, admin_options: ConnectionOptions) -> None:
    """The column-at-a-time read (values.py rule 5) keeps the rows no window change touches;
    a TRUNCATE in the window touches every row, so only what was inserted after it (and falls
    in the chunk) remains."""
    name, slot, config, chunk = ten_rows_and_their_first_chunk(admin, admin_options, "trunc")
    with admin_options.connect() as reader, admin_options.connect() as other:
        commit_in_the_window(reader, other, f"TRUNCATE {name}",
                             f"INSERT INTO {name} VALUES (3, 30, 'in'), (8, 80, 'out')")
        read = read_chunk_watermarked(reader, config, chunk, KeyOrder(reader, config.shapes))
    assert [(r["id"], r["v"], r["note"]) for r in read.batch.column("after").to_pylist()] == [
        (3, 30, "in")]
    replication.drop_slot(admin, slot)


def test_a_chunk_read_keeps_a_leading_byte_order_mark_and_matches_float4_keys_to_its_window(
        admin: Any, admin_options: ConnectionOptions) -> None:
    """Two ways the column-at-a-time read could part from the row path (found by review): Arrow's
    CSV reader drops a byte-order mark at the start of its input, and a float4 key read by Arrow
    (float32) is not the window's key (Python's float of the text)."""
    n = next(_names)
    name, slot, pub = f"cdc_edge_{n}", f"cdc_edge_slot_{n}", f"cdc_edge_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} (note text, id int, f real, v int, "
                  "PRIMARY KEY (id, f))")
    admin.execute(f"INSERT INTO {name} VALUES (E'\\uFEFFabc', 1, 1.1, 1), ('def', 2, 2.2, 2)")
    replication.ensure_publication(admin, pub, [table])
    replication.ensure_slot(admin, slot)
    config = ReaderConfig(admin_options, slot, pub,
                          (TableShape.of(catalog.table_info(admin, table), "id"),))
    chunk = SnapshotChunk(split_id=f"{table}#0", table=table, key_column="id", index=0,
                          start=None, end=None)
    quiet = read_chunk_watermarked(admin, config, chunk).batch.column("after").to_pylist()
    assert sorted(r["note"] for r in quiet) == ["def", "\ufeffabc"]
    with admin_options.connect() as reader, admin_options.connect() as other:
        commit_in_the_window(reader, other, f"UPDATE {name} SET v = 100 WHERE id = 1",
                             f"DELETE FROM {name} WHERE id = 2")
        read = read_chunk_watermarked(reader, config, chunk, KeyOrder(reader, config.shapes))
    rows = read.batch.column("after").to_pylist()
    assert [(r["note"], r["id"], r["v"]) for r in rows] == [("\ufeffabc", 1, 100)]
    replication.drop_slot(admin, slot)


def test_text_keys_are_placed_in_chunks_by_the_servers_collation(admin: Any) -> None:
    n = next(_names)
    name = f"cdc_text_{n}"
    admin.execute(f'CREATE TABLE {name} (k text COLLATE "en-x-icu" PRIMARY KEY)')
    table = TableName("public", name)
    shape = TableShape.of(catalog.table_info(admin, table))
    order = KeyOrder(admin, [shape])
    # ICU orders 'b' before 'C' (case-insensitive first); Python's code points do not
    assert order.positions(table, ["b"], ["C", "a", None]) == [1, 0, 0]
    chunk = SnapshotChunk(split_id="x", table=table, key_column="k", index=1, start="b",
                          end="d").chunk
    inside = order.in_chunk(chunk, ["C", "a", "D"])
    assert [inside(k) for k in ["C", "a", "D", None]] == [True, False, False, False]


def test_an_executor_without_the_password_is_refused_with_how_to_supply_it(
        admin_options: ConnectionOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    executor_options = pickle.loads(pickle.dumps(admin_options))
    with pytest.raises(ConnectionRefused, match="PGPASSWORD") as refused:
        executor_options.connect()
    assert ADMIN_PASSWORD not in str(refused.value)


def test_a_value_that_cannot_be_converted_names_its_table_and_column() -> None:
    from sparkcoord.sources.postgres.core.splits import ShapeColumn

    shape = TableShape(TableName("public", "events"),
                       (ShapeColumn("id", 23, -1), ShapeColumn("at", 1082, -1)), ("id",), "id")
    with pytest.raises(ValueConversionError, match=r"table public.events, column 'at'"):
        RowDecoder(shape).row(["1", "infinity"])


def test_a_column_added_while_streaming_stops_the_reader_naming_the_table_and_the_change(
        admin: Any, admin_options: ConnectionOptions) -> None:
    from sparkcoord.sources.postgres.reader import decode_transaction

    n = next(_names)
    name, slot, pub = f"cdc_alter_{n}", f"cdc_alter_slot_{n}", f"cdc_alter_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
    shape = TableShape.of(catalog.table_info(admin, table))
    replication.ensure_publication(admin, pub, [table])
    replication.ensure_slot(admin, slot)
    admin.execute(f"ALTER TABLE {name} ADD COLUMN extra text")
    admin.execute(f"INSERT INTO {name} VALUES (1, 1, 'x')")
    peek = replication.peek(admin, slot, pub)
    with pytest.raises(SchemaChanged, match=rf"table public.{name} changed .*added: extra"):
        for tx in peek.transactions:
            decode_transaction(tx, {table: RowDecoder(shape)})
    replication.drop_slot(admin, slot)


def test_readers_reading_chunks_at_once_share_the_slot_and_get_every_row_once(
        admin: Any, admin_options: ConnectionOptions) -> None:
    n = next(_names)
    name, slot, pub = f"cdc_par_{n}", f"cdc_par_slot_{n}", f"cdc_par_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL, note text)")
    admin.execute(f"INSERT INTO {name} SELECT g, g, 'r' FROM generate_series(1, 4000) g")
    replication.ensure_publication(admin, pub, [table])
    replication.ensure_slot(admin, slot)
    for i in range(300):  # WAL for every peek to decode, so that peeks overlap
        admin.execute(f"UPDATE {name} SET v = v + 1 WHERE id = %s", (i + 1,))
    config = ReaderConfig(admin_options, slot, pub,
                          (TableShape.of(catalog.table_info(admin, table)),))
    chunks = [SnapshotChunk(split_id=f"{table}#{i}", table=table, key_column="id", index=i,
                            start=None if i == 0 else i * 500, end=None if i == 7 else (i + 1) * 500)
              for i in range(8)]
    results: dict[int, dict[Any, Any]] = {}
    errors: list[BaseException] = []

    def read(chunk: SnapshotChunk) -> None:
        try:
            with admin_options.connect() as conn:
                for _ in range(2):
                    batch = read_chunk_watermarked(conn, config, chunk).batch
                    results[chunk.index] = {
                        (r["id"],): r for r in batch.column("after").to_pylist()}
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    keys = [k[0] for rows in results.values() for k in rows]
    assert sorted(keys) == list(range(1, 4001))
    replication.drop_slot(admin, slot)


def one_reader_source(admin: Any, admin_options: ConnectionOptions, tmp_path: Any, kind: str,
                      columns: str, rows: str, *, chunk_size: int = 100, startup: str = "initial",
                      **limits: Any
                      ) -> tuple[str, str, ReaderConfig,
                                 tuple[CoordinatorHarness, ManualLane, ManualLane]]:
    """A new table ``(columns)`` holding ``SELECT rows`` and the real enumerator for it under
    the harness (one reader, its workers run by hand): (name, slot, the reader's config as an
    executor gets it, (harness, planning runner, slot runner))."""
    n = next(_names)
    name, slot, pub = f"cdc_{kind}_{n}", f"cdc_{kind}_slot_{n}", f"cdc_{kind}_pub_{n}"
    table = TableName("public", name)
    admin.execute(f"CREATE TABLE {name} ({columns})")
    admin.execute(f"INSERT INTO {name} SELECT {rows}")
    config = ReaderConfig(pickle.loads(pickle.dumps(admin_options)), slot, pub,
                          (TableShape.of(catalog.table_info(admin, table)),), **limits)
    io = PostgresEnumeratorIO(admin_options, slot, pub, chunk_size=chunk_size)
    runner, slot_runner = lanes()
    provider = functools.partial(PostgresEnumerator, io=lambda: io, tables=(table,),
                                 startup=startup)
    h = CoordinatorHarness(provider, parallelism=1, storage_url=f"file://{tmp_path}/ckpt",
                           workers=runner.workers)
    return name, slot, config, (h, runner, slot_runner)


def test_a_batch_that_runs_again_emits_exactly_what_it_emitted_before_while_writes_go_on(
        admin: Any, admin_options: ConnectionOptions, executor_env: None, tmp_path: Any) -> None:
    """splits.py rule 5: Spark runs a batch again after a restart even when its sink already
    committed it (a file sink then keeps the first run's rows), so the second run must emit the
    same rows from the same state and answers, though the table changed in between: a chunk's
    rows are emitted from the state by the batch after the read, the stream up to the logged
    bound."""
    name, slot, config, (h, runner, slot_runner) = one_reader_source(
        admin, admin_options, tmp_path, "again", "id int PRIMARY KEY, v int NOT NULL, note text",
        "g, g, 'r' FROM generate_series(1, 600) g", chunk_size=200,
        max_changes_per_batch=40, max_chunks_per_batch=1)
    state: Any = None
    runs_compared = {"chunk rows": 0, "stream": 0}

    def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
        return [r for b in batches for r in b.to_pylist()]

    h.start()
    try:
        runner.run_all()
        h.run()
        for number in range(60):
            admin.execute(f"UPDATE {name} SET v = v + 1 WHERE id = %s", (number * 7 % 600 + 1,))
            runner.run_all()
            h.clock.advance(0.5)
            h.run()
            slot_runner.run_all()
            h.run()
            h.checkpoint()
            # each run restores the state from its bytes, as a task does
            first, _ = run_reader(h, config, 0, pickle.loads(pickle.dumps(state)))
            # the task runs again (a retry adopts the first one's log; a re-run after a
            # restore gets the same logged answers): writes land in between
            admin.execute(f"INSERT INTO {name} VALUES (%s, 0, 'between')", (10_000 + number,))
            admin.execute(f"UPDATE {name} SET note = 'between' WHERE id = %s", (number + 1,))
            h.retry_task(0)
            second, after_second = run_reader(h, config, 0, pickle.loads(pickle.dumps(state)))
            assert rows_of(second) == rows_of(first), f"batch {number} emitted other rows"
            kinds = {r["op"] for r in rows_of(first)}
            runs_compared["chunk rows"] += "r" in kinds
            runs_compared["stream"] += bool(kinds - {"r"})
            state = after_second
            h.commit()
            slot_runner.run_all()
            h.run()
            assert h.service.failure is None, h.service.failure
        assert runs_compared["chunk rows"] >= 3 and runs_compared["stream"] >= 5, runs_compared
    finally:
        h.service.close()
        h.run()
        runner.run_all()
        replication.drop_slot(admin, slot)


def test_a_column_added_while_streaming_emits_the_transactions_before_it_and_stops_the_next_batch(
        admin: Any, admin_options: ConnectionOptions, executor_env: None, tmp_path: Any) -> None:
    """Issue 43, finding 6: five updates committed right before ``ALTER TABLE ... ADD COLUMN``,
    in the same batch's read as the first change after it, are emitted by that batch (a batch
    that runs again emits them again); the job fails in the next batch, once they committed,
    naming the table and the way on (enumerator.py rule 7), and the slot is never confirmed
    past them: the change of the new shape is still in it."""
    name, slot, config, (h, runner, slot_runner) = one_reader_source(
        admin, admin_options, tmp_path, "shape", "id int PRIMARY KEY, v int",
        "g, 0 FROM generate_series(1, 5) g", startup="latest")
    pub = config.publication
    state: Any = None

    def boundary() -> None:
        runner.run_all()
        h.clock.advance(0.5)  # a poll tick learns the stream's next bound
        h.run()
        slot_runner.run_all()
        h.run()
        h.checkpoint()

    def commit() -> None:
        h.commit()
        slot_runner.run_all()
        h.run()

    h.start()
    try:
        runner.run_all()  # the publication and the slot
        h.run()
        boundary()
        _, state = run_reader(h, config, 0, state)  # the stream goes out
        commit()
        for i in range(1, 6):
            admin.execute(f"UPDATE {name} SET v = {i} WHERE id = {i}")
        admin.execute(f"ALTER TABLE {name} ADD COLUMN extra text")
        admin.execute(f"INSERT INTO {name} VALUES (6, 6, 'new shape')")
        boundary()
        before = pickle.loads(pickle.dumps(state))
        first, _ = run_reader(h, config, 0, pickle.loads(pickle.dumps(before)))
        h.retry_task(0)  # the batch runs again: the same rows
        out, state = run_reader(h, config, 0, pickle.loads(pickle.dumps(before)))
        rows = [r for b in out for r in b.to_pylist()]
        assert rows == [r for b in first for r in b.to_pylist()]
        assert [(r["op"], r["after"]["id"], r["after"]["v"]) for r in rows] == [
            ("u", i, i) for i in range(1, 6)]
        assert h.service.failure is None  # the updates are not in the sink yet
        commit()
        assert h.service.failure is None
        last_emitted = max(r["lsn"] for r in rows)
        boundary()
        with pytest.raises(RequestFailed, match=rf"table public\.{name} changed"):
            run_reader(h, config, 0, pickle.loads(pickle.dumps(state)))
        failure = str(h.service.failure)
        assert "SchemaChanged" in failure and "added: extra" in failure
        assert f"table public.{name} changed while it was captured" in failure
        assert "new checkpoint location" in failure
        info = replication.slot_info(admin, slot)
        assert info is not None and (info.confirmed_flush_lsn or 0) <= last_emitted
        kept = replication.peek(admin, slot, pub)
        assert any(tx.end_lsn > last_emitted for tx in kept.transactions)  # still there
    finally:
        h.service.close()
        h.run()
        runner.run_all()
        replication.drop_slot(admin, slot)


def test_a_transaction_holding_an_xid_holds_up_the_slot_creation_with_a_warning_and_a_status_naming_it(
        admin: Any, admin_options: ConnectionOptions, tmp_path: Any) -> None:
    """Issue 43, finding 7: creating a logical slot waits for every transaction that holds a
    transaction id (PostgreSQL's behaviour). The wait is watched from a connection and thread
    of its own (replication.py rule 7, enumerator.py rule 8): a WARNING and the source's status
    name the blocking backend, the set-up goes on once its transaction ends."""
    n = next(_names)
    name, slot, pub = f"cdc_wait_{n}", f"cdc_wait_slot_{n}", f"cdc_wait_pub_{n}"
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, note text)")
    warnings: list[str] = []
    warned = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING and slot in record.getMessage():
                warnings.append(record.getMessage())
                warned.set()

    seen = Seen()
    logging.getLogger("sparkcoord.sources.postgres").addHandler(seen)
    io = PostgresEnumeratorIO(admin_options, slot, pub, chunk_size=100, slot_wait_warn_s=0.05)
    set_ups: list[threading.Thread] = []

    class SetUpOnAThread(ManualWorkers):
        """The set-up on a thread of its own, as in a real run; the slot lane by hand."""

        def run(self, owner: str, lane: str, work: Any) -> None:
            if lane != PLANNING:
                super().run(owner, lane, work)
                return
            thread = threading.Thread(target=work, daemon=True)
            set_ups.append(thread)
            thread.start()

    provider = functools.partial(PostgresEnumerator, io=lambda: io, tables=(TableName(
        "public", name),), startup="latest", first_boundary_wait_s=0.0)
    h = CoordinatorHarness(provider, parallelism=1, storage_url=f"file://{tmp_path}/ckpt",
                           workers=SetUpOnAThread())
    try:
        with admin_options.connect(application_name="holds-an-xid") as holder:
            pid = holder.info.backend_pid
            with holder.transaction(force_rollback=True):
                holder.execute(f"INSERT INTO {name} VALUES (1, 'x')")
                holder.execute(f"CREATE ROLE cdc_wait_role_{n} PASSWORD 'hunter2'")
                h.start()  # the set-up: it creates the publication, then waits for the slot
                assert warned.wait(120), "no warning while the slot creation waited"
                h.run()
                h.checkpoint()  # the status answers once an epoch is sealed
                status_now = status(h)
                assert status_now["phase"] == "setting up"
                assert f"pid {pid} (application 'holds-an-xid'" in status_now["waiting"]
                assert status_now["blocking_pids"] == [pid]
                assert set_ups[0].is_alive()  # it cannot end before the holder's transaction
            # the transaction rolled back: the creation goes on
        set_ups[0].join(120)
        assert not set_ups[0].is_alive()
        h.run()
        assert replication.slot_info(admin, slot) is not None
        assert status(h)["waiting"] is None and status(h)["blocking_pids"] == []
        warning = warnings[0]
        assert f"pid {pid} (application 'holds-an-xid', user 'cdc_admin', state 'idle in " \
               "transaction', transaction started " in warning
        assert f"query 'CREATE ROLE cdc_wait_role_{n} PASSWORD ***'" in warning
        assert "hunter2" not in warning
        assert h.service.failure is None
    finally:
        logging.getLogger("sparkcoord.sources.postgres").removeHandler(seen)
        h.service.close()
        h.run()
        replication.drop_slot(admin, slot)
