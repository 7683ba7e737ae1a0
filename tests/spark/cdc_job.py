"""A PostgreSQL change-data-capture job for the real-Spark tests, the driver-kill tests and the
soak, with writers that run beside it and a judge.

    python -m tests.spark.cdc_job write <workdir> <seed> <transactions> [<pause s> [<after>]]
    python -m tests.spark.cdc_job run <workdir> [<failure> <seed>]

Both read the database URL (with its password) from ``CDC_URL``; ``run`` exports the password
as ``PGPASSWORD`` before Spark starts, so Spark's processes inherit it (docs/cdc.md).

The job captures ``public.orders`` and ``public.customers`` (:func:`create_tables`) with the
PostgreSQL source (small chunks, two readers) into the idempotent batch-file sink, projected to
plain columns (``lsn``, ``seq``, ``xid``, the key and the after-image's columns). A writer (a
process of its own, started once the query runs) runs transactions of 1-4 inserts, updates,
deletes and key changes across both tables and logs each committed transaction's xid, how many
rows the stream must emit for it (a key change is a delete and an insert), the WAL insert
position just before and just after its commit (its end is between them) and the wall-clock
time its commit returned (:func:`lag_figures`). Where ``orders`` has the merge soak's extra
columns (:func:`add_order_extras`: a large TOASTed ``big``, a ``at`` timestamptz with values
at both ends of the range), the writers change them too. The job stops when
every writer is done, every logged transaction that committed after the last chunk's high
watermark is in the sink, and the sink applied by key equals the tables. Before each
look at the sink it records the slot's confirmed position, so the judge can check that the slot
was never ahead of what the sink held (:func:`judge`).

``<failure>``: ``task`` (a reader's task raises once, in the middle of a batch chosen by the
seed), ``fail_job`` (the enumerator fails the job once, at a request chosen by the seed),
``none``. SPARKCOORD_TEST_KILL may kill the whole driver at a protocol point
(sparkcoord.runtime.kills), or at the source's own points ``cdc-snapshot`` (a reader read a
chunk), ``cdc-handover`` (the stream was handed out) and ``cdc-stream`` (the stream reader
read changes), with the epoch as given.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection
from decimal import Decimal
from typing import Any

TABLES = "public.orders,public.customers"
ORDERS, CUSTOMERS = 3000, 1000
SOURCE = "postgres"


#: the optional columns of ``orders`` (:func:`add_order_extras`)
BIG, AT = "big", "at"
#: a large value of ``big``: 3,200 characters, kept out of line uncompressed (STORAGE EXTERNAL)
BIG_VALUE = "repeat(md5(%s), 100)"
#: both ends of docs/cdc.md's timestamp range at microsecond precision (issue 43 finding 1)
EDGE_TIMES = ("9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00")


def add_order_extras(conn: Any, extras: list[str]) -> None:
    """The merge soak's cases on ``orders``, after :func:`create_tables` and before the job
    starts (a superuser's autocommit connection). ``toast`` (issue 43 finding 3): a column
    ``big`` whose values are TOASTed (out of line), set on every other row; under the default
    replica identity an update that leaves it alone does not send it. ``edges`` (finding 1): a
    column ``at`` (timestamptz) at 9999-12-31 23:59:59.999999 UTC on a third of the rows and at
    0001-01-01 UTC on another third."""
    unknown = set(extras) - {"toast", "edges"}
    if unknown:
        raise ValueError(f"unknown orders extras {sorted(unknown)}: known are toast, edges")
    if "toast" in extras:
        conn.execute(f"ALTER TABLE orders ADD COLUMN {BIG} text")
        conn.execute(f"ALTER TABLE orders ALTER COLUMN {BIG} SET STORAGE EXTERNAL")
        conn.execute(f"UPDATE orders SET {BIG} = repeat(md5('first ' || id), 100) "
                     "WHERE id % 2 = 0")
    if "edges" in extras:
        conn.execute(f"ALTER TABLE orders ADD COLUMN {AT} timestamptz")
        conn.execute(f"UPDATE orders SET {AT} = CASE id %% 3 WHEN 0 THEN %s::timestamptz "
                     "WHEN 1 THEN %s::timestamptz ELSE now() END", EDGE_TIMES)


def order_extras(conn: Any) -> set[str]:
    """Which of :func:`add_order_extras`'s columns ``orders`` has (``big``, ``at``)."""
    rows = conn.execute("SELECT column_name FROM information_schema.columns "
                        "WHERE table_schema = 'public' AND table_name = 'orders'").fetchall()
    return {r[0] for r in rows} & {BIG, AT}


def create_tables(conn: Any, orders: int = ORDERS, customers: int = CUSTOMERS) -> None:
    """The two captured tables and their first rows (a superuser's autocommit connection)."""
    conn.execute("DROP TABLE IF EXISTS orders, customers, unrelated")
    conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, v int NOT NULL, note text)")
    conn.execute("CREATE TABLE customers (id bigserial PRIMARY KEY, amount numeric(12,2), "
                 "seen timestamptz)")
    conn.execute("CREATE TABLE unrelated (id bigserial PRIMARY KEY, pad text)")
    conn.execute("INSERT INTO orders (v, note) SELECT g, 'row ' || g "
                 "FROM generate_series(1, %s) g", (orders,))
    conn.execute("INSERT INTO customers (amount, seen) SELECT g * 1.25, "
                 "timestamptz '2026-01-01 00:00:00+00' + g * interval '1.000123 second' "
                 "FROM generate_series(1, %s) g", (customers,))


# -- the writers -----------------------------------------------------------------------------


def write(url: str, workdir: str, seed: int, transactions: int, pause_s: float = 0.01,
          after_stream: int = 0) -> None:
    """Run ``transactions`` random transactions (the writer process's main thread), then, once
    the job says its stream took over (the file ``streaming`` in ``workdir``, written by
    :func:`run_job`), ``after_stream`` more: so some transactions are the stream's alone
    whatever the machine's speed. Logs ``<xid> <rows the stream emits> <insert position
    before> <after its commit>`` after each commit and ``done`` at the end. A lost connection
    (a server restart) is opened again; a transaction whose commit was in flight then is
    logged if the server says it committed."""
    import psycopg

    rng = random.Random(seed)
    # the extra columns' choices draw from their own generator: the transactions of a table
    # without them stay what the seed made them before
    extra_rng = random.Random(seed + 7919)
    os.makedirs(workdir, exist_ok=True)
    conn = _connect(url)
    extras = order_extras(conn)
    with open(os.path.join(workdir, f"writer-{seed}.log"), "a") as log:
        for n in range(transactions + after_stream):
            if n == transactions and after_stream:
                _wait_for(os.path.join(workdir, STREAMING))
            xid, emitted, before, committed_at = 0, 0, 0, 0.0
            try:
                with conn.transaction():
                    row = conn.execute("SELECT txid_current()").fetchone()
                    assert row is not None
                    xid = int(row[0])
                    for _ in range(rng.randint(1, 4)):
                        emitted += _one_change(conn, rng, n, extras, extra_rng, seed)
                    if rng.random() < 0.1:  # WAL of a table the source does not capture
                        conn.execute("INSERT INTO unrelated (pad) VALUES (repeat('x', 500))")
                    before = _insert_position(conn)
                committed_at = time.time()
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                continue
            except psycopg.OperationalError:
                conn.close()
                conn = _connect(url)
                if not before:
                    continue  # it never reached its commit
                row = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()
                if row is None or row[0] != "committed":
                    continue
                committed_at = time.time()  # at the latest
            if emitted:
                log.write(f"{xid % (1 << 32)} {emitted} {before} {_insert_position(conn)} "
                          f"{committed_at:.6f}\n")
                log.flush()
            time.sleep(pause_s * rng.random() * 2)
        log.write("done\n")
    conn.close()


def _connect(url: str, wait_s: float = 90.0) -> Any:
    """An autocommit connection, waiting for a server that is restarting."""
    import psycopg

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: the file run_job writes once its source's phase is "stream" (the writers' second phase)
STREAMING = "streaming"
#: the file ``run`` appends each finished run's restarts and failures to (JSON lines)
REPORTS = "reports.jsonl"


def _wait_for(path: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.1)


def _insert_position(conn: Any) -> int:
    from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text

    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return lsn_from_text(row[0])


def start_writers(url: str, workdir: str, seeds: list[int], transactions: int,
                  pause_s: float = 0.01, after_stream: int = 0) -> list[Any]:
    """Writer processes (``python -m tests.spark.cdc_job write``), one per seed."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, CDC_URL=url, PYTHONPATH=repo)
    return [subprocess.Popen([sys.executable, "-m", "tests.spark.cdc_job", "write", workdir,
                              str(seed), str(transactions), str(pause_s), str(after_stream)],
                             cwd=repo, env=env)
            for seed in seeds]


def when_running(workdir: str, process: Any, timeout_s: float = 180.0) -> bool:
    """Wait until the job in ``process`` (a ``Popen`` of ``cdc_job run``) committed its first
    batch (the sink has a file), so writers started then meet its snapshot; False if the
    process ended first."""
    sink = os.path.join(workdir, "sink")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.isdir(sink) and any(n.endswith(".json") for n in os.listdir(sink)):
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.2)
    raise TimeoutError(f"the job in {workdir} committed no batch within {timeout_s} s")


def _one_change(conn: Any, rng: random.Random, n: int, extras: Collection[str] = (),
                extra_rng: random.Random | None = None, seed: int = 0) -> int:
    """One insert, update, delete or key change; the rows the stream emits for it. With
    ``extras`` (``orders``' extra columns) an insert may set them, and an update sets ``big``
    now and then (most leave it alone: PostgreSQL then does not send it) and ``at`` to an
    edge of the range now and then; ``extra_rng`` draws those choices."""
    op = rng.random()
    if rng.random() < 0.7:
        target = rng.randint(1, int(ORDERS * 1.3))
        sets, values = _extra_values(extras, extra_rng, f"{seed}-{n}")
        if op < 0.35:
            columns = ", ".join(["v", "note", *sets])
            marks = ", ".join(["%s", "%s", *(sets[c] for c in sets)])
            conn.execute(f"INSERT INTO orders ({columns}) VALUES ({marks})",
                         (n, f"new {n}", *values))
            return 1
        if op < 0.75:
            assignments = "".join(f", {c} = {sets[c]}" for c in sets)
            return int(conn.execute(f"UPDATE orders SET v = v + 1, note = %s{assignments} "
                                    "WHERE id = %s", (f"u{n}", *values, target)).rowcount)
        if op < 0.9:
            return int(conn.execute("DELETE FROM orders WHERE id = %s", (target,)).rowcount)
        moved = conn.execute("UPDATE orders SET id = nextval('orders_id_seq') WHERE id = %s",
                             (target,)).rowcount
        return 2 * int(moved)  # a key change: a delete of the old key, an insert of the new
    target = rng.randint(1, int(CUSTOMERS * 1.3))
    if op < 0.35:
        conn.execute("INSERT INTO customers (amount, seen) VALUES (%s, now())",
                     (Decimal(rng.randint(0, 10**6)) / 100,))
        return 1
    if op < 0.8:
        return int(conn.execute("UPDATE customers SET amount = amount + 0.25, seen = now() "
                                "WHERE id = %s", (target,)).rowcount)
    return int(conn.execute("DELETE FROM customers WHERE id = %s", (target,)).rowcount)


def _extra_values(extras: Collection[str], extra_rng: random.Random | None,
                  tag: str) -> tuple[dict[str, str], list[Any]]:
    """The extra columns one insert or update of ``orders`` sets (column -> SQL expression)
    and their parameters: ``big`` a quarter of the time, ``at`` a third of the time."""
    sets: dict[str, str] = {}
    values: list[Any] = []
    if not extras or extra_rng is None:
        return sets, values
    if BIG in extras and extra_rng.random() < 0.25:
        sets[BIG] = BIG_VALUE
        values.append(tag)
    if AT in extras and extra_rng.random() < 0.33:
        sets[AT] = "%s::timestamptz"
        values.append(extra_rng.choice([*EDGE_TIMES, "2026-06-01 12:00:00.123456+00"]))
    return sets, values


def writer_logs(workdir: str) -> tuple[dict[int, tuple[int, int, int]], int, int]:
    """Every writer's logged transactions (xid -> (rows emitted, insert position before its
    commit, after it)), writers seen, writers done."""
    logged: dict[int, tuple[int, int, int]] = {}
    seen = done = 0
    if not os.path.isdir(workdir):
        return logged, seen, done
    for name in os.listdir(workdir):
        if name.startswith("writer-") and name.endswith(".log"):
            seen += 1
            with open(os.path.join(workdir, name)) as f:
                for line in f:
                    if line.strip() == "done":
                        done += 1
                    elif line.strip():
                        xid, rows, before, after = line.split()[:4]
                        logged[int(xid)] = (int(rows), int(before), int(after))
    return logged, seen, done


def commit_times(workdir: str) -> dict[int, float]:
    """Every writer's logged transactions: xid -> the wall-clock time its commit returned."""
    times: dict[int, float] = {}
    for name in os.listdir(workdir) if os.path.isdir(workdir) else []:
        if name.startswith("writer-") and name.endswith(".log"):
            with open(os.path.join(workdir, name)) as f:
                for line in f:
                    fields = line.split()
                    if len(fields) == 5:
                        times[int(fields[0])] = float(fields[4])
    return times


def lag_figures(workdir: str) -> dict[str, float | None]:
    """The stream's lag behind the writers at the end of the writes and the catch-up time
    (issue 43), from the writers' commit times (:func:`commit_times`) and the times the sink's
    batch files were written (a batch's file is written when the sink commits it; a batch
    run again after a kill is written again, later). Only the transactions the stream must
    carry count (committed after the last chunk's high watermark, as :func:`judge` says).
    ``end``: the writers' last commit. ``lag_at_end_s``: ``end`` minus the commit time of
    the oldest of them the sink did not hold by ``end`` (0: it held all but the last).
    ``catch_up_s``: from ``end`` until the sink held every one of them (None: it never did)."""
    times = commit_times(workdir)
    logged, _, _ = writer_logs(workdir)
    sink = os.path.join(workdir, "sink")
    held_at: dict[int, float] = {}
    highs: list[int] = []
    for name in os.listdir(sink) if os.path.isdir(sink) else []:
        if not name.endswith(".json"):
            continue
        path = os.path.join(sink, name)
        written = os.stat(path).st_mtime
        with open(path) as f:
            for row in json.load(f):
                if row["op"] == "r":
                    highs.append(row["lsn"])
                else:
                    held_at[row["xid"]] = min(held_at.get(row["xid"], written), written)
    last_high = max(highs, default=0)
    stream = {x: t for x, t in times.items() if x in logged and logged[x][1] >= last_high}
    if not stream:
        return {"lag_at_end_s": None, "catch_up_s": None}
    end = max(times.values())
    pending = [t for x, t in stream.items() if held_at.get(x, float("inf")) > end]
    held = [held_at.get(x) for x in stream]
    return {"lag_at_end_s": round(end - min(pending), 2) if pending else 0.0,
            "catch_up_s": None if None in held
            else round(max(0.0, max(h for h in held if h is not None) - end), 2)}


# -- the sink, applied ---------------------------------------------------------------------


def sink_rows(workdir: str) -> list[dict[str, Any]]:
    from sparkcoord.examples.sinks import read_batch_files

    batches = read_batch_files(os.path.join(workdir, "sink"))
    return [row for batch in sorted(batches) for row in batches[batch]]


def applied(rows: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[Any, ...]]:
    """The sink's rows applied by key in (lsn, seq) order."""
    state: dict[tuple[str, int], tuple[Any, ...]] = {}
    for row in sorted(rows, key=lambda r: (r["lsn"], -1 if r["seq"] is None else r["seq"])):
        key = (row["table"], row["key_id"])
        if row["op"] == "d":
            state.pop(key, None)
        elif row["op"] in ("r", "c", "u"):
            state[key] = _image(row)
        else:
            raise AssertionError(f"unexpected operation {row['op']!r} in {row}")
    return state


def _image(row: dict[str, Any]) -> tuple[Any, ...]:
    if row["table"] == "public.orders":
        return (row["v"], row["note"])
    return (None if row["amount"] is None else Decimal(row["amount"]), row["seen_us"])


def tables_now(conn: Any) -> dict[tuple[str, int], tuple[Any, ...]]:
    state: dict[tuple[str, int], tuple[Any, ...]] = {}
    for key, v, note in conn.execute("SELECT id, v, note FROM orders").fetchall():
        state[("public.orders", key)] = (v, note)
    for key, amount, seen in conn.execute(
            "SELECT id, amount, (extract(epoch FROM seen) * 1000000)::bigint FROM customers"
    ).fetchall():
        state[("public.customers", key)] = (amount, seen)
    return state


def slot_confirmed(conn: Any, slot: str) -> int | None:
    from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text

    row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None or row[0] is None else lsn_from_text(row[0])


def record_sample(workdir: str, conn: Any, slot: str) -> list[dict[str, Any]]:
    """The slot's confirmed position, then the sink's rows (read after it): one sample for
    the judge's "never ahead" check, appended to ``samples.jsonl``. The sink's rows."""
    confirmed = slot_confirmed(conn, slot)
    rows = sink_rows(workdir)
    if confirmed is not None:
        xids = sorted({r["xid"] for r in rows if r["op"] != "r"})
        with open(os.path.join(workdir, "samples.jsonl"), "a") as f:
            f.write(json.dumps({"confirmed": confirmed, "xids": xids}) + "\n")
    return rows


def judge(workdir: str, conn: Any) -> dict[str, Any]:
    """Every check of a finished run: the sink applied by key equals the tables; every logged
    transaction's rows are in the sink exactly once (and none that no writer made); a key's
    changes are in commit order; every snapshot row once; the slot never confirmed a
    transaction the sink did not hold yet."""
    rows = sink_rows(workdir)
    got, want = applied(rows), tables_now(conn)
    logged, _, _ = writer_logs(workdir)
    changes = [r for r in rows if r["op"] != "r"]
    # a transaction that committed after every chunk's high watermark is the stream's alone:
    # all its rows once; one that committed before every chunk was read is the snapshot's
    highs = [r["lsn"] for r in rows if r["op"] == "r"]
    last_high, first_high = max(highs, default=0), min(highs, default=0)
    per_change = Counter((r["table"], r["lsn"], r["seq"], r["op"]) for r in changes)
    per_xid = Counter(r["xid"] for r in changes)
    snapshot = Counter((r["table"], r["key_id"]) for r in rows if r["op"] == "r")
    end_of = {r["xid"]: r["lsn"] for r in changes}
    ahead = 0
    samples_path = os.path.join(workdir, "samples.jsonl")
    samples = 0
    if os.path.exists(samples_path):
        with open(samples_path) as f:
            for line in f:
                sample = json.loads(line)
                samples += 1
                held = set(sample["xids"])
                ahead += sum(1 for xid, end in end_of.items()
                             if end <= sample["confirmed"] and xid not in held)
    order = 0
    last: dict[tuple[str, int], int] = {}
    for batch_row in changes:  # sink order is batch order: per key, positions must grow
        key = (batch_row["table"], batch_row["key_id"])
        if batch_row["lsn"] < last.get(key, -1):
            order += 1
        last[key] = batch_row["lsn"]
    return {
        "missing": sum(1 for k in want if k not in got),
        "extra": sum(1 for k in got if k not in want),
        "wrong": sum(1 for k in want if k in got and got[k] != want[k]),
        "changes_twice": sum(1 for n in per_change.values() if n > 1),
        "transactions_missing": sum(1 for x, (_, before, _) in logged.items()
                                    if before >= last_high and x not in per_xid),
        "transactions_miscounted": sum(
            1 for x, (n, before, _) in logged.items() if x in per_xid
            and (per_xid[x] > n or (before >= last_high and per_xid[x] != n))),
        "transactions_in_stream_and_snapshot": sum(
            1 for x, (_, _, after) in logged.items() if x in per_xid and after <= first_high),
        "transactions_unknown": sum(1 for x in per_xid if x not in logged),
        "snapshot_rows_twice": sum(1 for n in snapshot.values() if n > 1),
        "out_of_order": order,
        "slot_ahead": ahead,
        "samples": samples,
        "transactions": len(logged),
        "transactions_streamed_whole": sum(1 for x, (_, before, _) in logged.items()
                                           if before >= last_high and x in per_xid),
        "snapshot_rows": sum(snapshot.values()),
    }


CLEAN = ("missing", "extra", "wrong", "changes_twice", "transactions_missing",
         "transactions_miscounted", "transactions_in_stream_and_snapshot",
         "transactions_unknown", "snapshot_rows_twice", "out_of_order", "slot_ahead")


# -- failures --------------------------------------------------------------------------------


def failing_reader(config: Any, marker_dir: str, at: int) -> Any:
    """A reader whose task raises once, after the first rows of its ``at``-th batch that emits
    rows (counted per subtask in ``marker_dir``, across attempts)."""
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.postgres.reader import PostgresReader

    class Reader(PostgresReader):
        def process(self) -> Any:
            first = True
            for item in super().process():
                yield item
                if first:
                    first = False
                    if self._emitting_batches() >= at and _once(marker_dir, "task"):
                        raise RuntimeError(f"injected task failure in batch "
                                           f"{self.context.epoch}")

        def _emitting_batches(self) -> int:
            os.makedirs(marker_dir, exist_ok=True)
            path = os.path.join(marker_dir, f"emitting-{self.context.subtask}")
            with open(path, "a") as f:
                f.write(".")
            return os.path.getsize(path)

    return Reader(config)


def killing_reader(config: Any) -> Any:
    """A reader that reaches the source's kill points (module docstring)."""
    from sparkcoord.runtime.kills import kill_point
    from sparkcoord.sources.postgres.core.splits import StagedChunk
    from sparkcoord.sources.postgres.reader import PostgresReader, stream_position

    class Reader(PostgresReader):
        def process(self) -> Any:
            streaming = stream_position(self.state) is not None
            yield from super().process()
            if stream_position(self.state) is not None:
                kill_point("cdc-stream" if streaming else "cdc-handover", self.context.epoch)
            elif any(isinstance(p, StagedChunk) for _, p in self.state.unfinished):
                kill_point("cdc-snapshot", self.context.epoch)  # chunks read, not yet emitted

    return Reader(config)


def failing_enumerator(context: Any, marker_dir: str, at: int, **kwargs: Any) -> Any:
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.postgres.enumerator import PostgresEnumerator

    class Enumerator(PostgresEnumerator):
        asked = 0

        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            Enumerator.asked += 1
            if Enumerator.asked == at and _once(marker_dir, "fail_job"):
                self.context.fail_job(f"injected failure at request {at}")
            return super().handle_request(subtask, attempt, request)

    return Enumerator(context, **kwargs)


# -- the job ---------------------------------------------------------------------------------


def run_job(spark: Any, workdir: str, url: str, failure: str = "none", seed: int = 0,
            timeout_s: float = 300.0, retain: int = 3,
            on_running: Callable[[], None] | None = None, **options: str) -> Any:
    """Run the job until it holds every writer's transactions and equals the tables (the
    driver program's thread); its report. ``on_running`` is called once the query runs (to
    start the writers)."""
    import dataclasses

    import psycopg
    from pyspark.sql import functions as F

    from sparkcoord.examples.sinks import BatchFileSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.sources.postgres.stream import default_slot_name
    from sparkcoord.spark import CoordinatedJob

    spark.dataSource.register(BatchFileSink)
    markers = os.path.join(workdir, "markers")
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"), retain=retain)
    settings = {"tables": TABLES, "chunkSize": "250", "parallelism": "2",
                "maxChunksPerBatch": "2", "maxChangesPerBatch": "300", "pollInterval": "200ms"}
    settings.update(options)
    spec, struct = PostgresCDC(job).options(**settings).operator_spec(url, name=SOURCE)
    rng = random.Random(seed)
    config = spec.operator.args[0]
    if failure == "task":
        spec = dataclasses.replace(spec, operator=functools.partial(
            failing_reader, config, markers, rng.randint(1, 6)))
    elif failure == "fail_job":
        spec = dataclasses.replace(spec, coordinator=functools.partial(
            failing_enumerator, marker_dir=markers, at=rng.randint(3, 40),
            **spec.coordinator.keywords))
    elif failure == "kill":
        spec = dataclasses.replace(spec, operator=functools.partial(killing_reader, config))
    elif failure != "none":
        raise ValueError(f"unknown failure {failure!r}")
    df = job.sources([spec], struct, name=SOURCE)
    out = df.select("op", "table", "lsn", "seq", "xid", F.col("key.id").alias("key_id"),
                    F.col("after.v").alias("v"), F.col("after.note").alias("note"),
                    F.col("after.amount").cast("string").alias("amount"),
                    F.unix_micros(F.col("after.seen")).alias("seen_us"))
    writer = (out.writeStream.format("sparkcoord-batchfiles")
              .option("path", os.path.join(workdir, "sink"))
              .trigger(processingTime="0 seconds"))
    slot = default_slot_name(job.checkpoint_dir, SOURCE)
    with open(os.path.join(workdir, "slot"), "w") as f:
        f.write(slot)
    conns = [_connect(url)]
    started: list[bool] = []

    def until() -> bool:
        if on_running is not None and not started:
            started.append(True)
            on_running()
        streaming = os.path.join(workdir, STREAMING)
        if not os.path.exists(streaming) and _phase(job) == "stream":
            with open(streaming, "w") as f:
                f.write("the stream took over\n")
        try:
            return done(conns[0])
        except psycopg.OperationalError:  # the server restarted (a test does that)
            conns[0].close()
            conns[0] = _connect(url)
            return False

    def done(conn: Any) -> bool:
        rows = record_sample(workdir, conn, slot)
        logged, seen, finished = writer_logs(workdir)
        if not seen or finished < seen:
            return False
        last_high = max((r["lsn"] for r in rows if r["op"] == "r"), default=0)
        xids = {r["xid"] for r in rows if r["op"] != "r"}
        if any(x not in xids for x, (_, before, _) in logged.items() if before >= last_high):
            return False
        return applied(rows) == tables_now(conn)

    try:
        return job.run(writer, until=until, poll_s=0.3, timeout_s=timeout_s)
    finally:
        conns[0].close()


def _phase(job: Any) -> str | None:
    """The source's phase, None while no run can answer (a restart, a query starting)."""
    try:
        status = job.request(SOURCE, "status", timeout_s=5)
    except Exception:  # noqa: BLE001 - not running right now: ask again at the next poll
        return None
    return None if not isinstance(status, dict) else status.get("phase")


def main() -> None:
    command, workdir = sys.argv[1], sys.argv[2]
    url = os.environ["CDC_URL"]
    if command == "write":
        write(url, workdir, int(sys.argv[3]), int(sys.argv[4]),
              float(sys.argv[5]) if len(sys.argv) > 5 else 0.01,
              int(sys.argv[6]) if len(sys.argv) > 6 else 0)
        return
    failure = sys.argv[3] if len(sys.argv) > 3 else "none"
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions

    secrets = dict((k, s.reveal()) for k, s in ConnectionOptions.parse(url).secrets)
    os.environ["PGPASSWORD"] = secrets["password"]  # before Spark starts: its processes inherit it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-cdc-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    report = run_job(spark, workdir, url, failure, seed)
    with open(os.path.join(workdir, REPORTS), "a") as f:  # for the soak (one line a run)
        f.write(json.dumps({"restarts": report.restarts,
                            "failures": [str(x) for x in report.failures]}) + "\n")
    print("done", report.restarts, report.failures)


if __name__ == "__main__":
    main()
