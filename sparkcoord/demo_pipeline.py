"""``sparkcoord demo pipeline``: PostgreSQL -> the change data capture source -> a Delta table
merged by key, with the job's driver killed with SIGKILL in the middle, then a verdict that
compares the source table and the Delta table row by row.

What it does, in its work directory (``--dir``, wiped first as ``sparkcoord demo`` does):

  1. Starts a PostgreSQL of its own (:class:`sparkcoord.testing.postgres.PostgresServer`:
     ``initdb`` in ``<dir>/postgres``, loopback, a free port, ``wal_level=logical``; as the
     ``postgres`` user when run as root), a role ``sparkcoord_demo`` (LOGIN REPLICATION) with
     the password ``$PGPASSWORD`` if set, else a random one, its database ``demo`` and the
     table ``public.items (id bigint PRIMARY KEY, name text, qty int)`` with ``--rows`` rows.
  2. Starts the job's driver program (``python -m sparkcoord.demo_pipeline <dir>``, a process
     in a session of its own, its output in ``<dir>/driver-<run>.log``, Spark's own log in
     ``<dir>/spark.log``): ``PostgresCDC`` on the table -> ``LakeSink`` ``delta`` ``merge``
     into ``<dir>/items``, on the checkpoint ``<dir>/checkpoint``. The URL it gets has no
     password; the password goes in its environment as ``PGPASSWORD`` (docs/cdc.md,
     "Passwords"), so it is never in its arguments, its checkpoint or its logs.
  3. Once the table's first commit is there (the snapshot's first batch), a writer thread
     runs transactions of 1-4 inserts, updates, deletes and primary-key changes, for
     ``--seconds``.
  4. After a third of that, and at least two more table commits, it kills the driver: SIGKILL
     of every process of its session (the driver program, Spark's JVM, the source runner, the
     Python workers), as when the driver's machine dies, while the writer writes.
  5. Restarts the driver on the same checkpoint; once the restarted driver committed to the
     table and ``--seconds`` passed, stops the writer and tells the driver (the file
     ``<dir>/writer-stopped``), which ends its streaming run and catches up with an
     ``availableNow`` run: every transaction committed before it started is then in the table.
  6. Reads both tables and prints the verdict: rows in the source, rows in the target, keys
     missing from the target, extra keys in the target, keys whose columns differ; PASS only
     if the three are 0 (and the driver was killed and the restarted one ended cleanly).

PostgreSQL is stopped and its directory removed at the end whatever happens (a failure,
Ctrl-C, SIGTERM), and a driver still running is killed. Exit code 0 only on PASS.

Thread model: the command's main thread runs the steps and waits; the writer is a thread of its
own; the driver program is another process (its main thread runs the job).
"""

from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sparkcoord.demo import demo_session, prepare_workdir
from sparkcoord.runtime.kills import kill_session

#: the demo's role, database and table
ROLE, DATABASE, TABLE = "sparkcoord_demo", "demo", "items"
#: the environment variable that gives the driver program the database URL (no password in it)
URL_ENV = "SPARKCOORD_DEMO_URL"
#: the file that tells the driver program the writer stopped: end the stream, catch up, exit
WRITER_STOPPED = "writer-stopped"
#: the Delta table's directory and the job's checkpoint, in the work directory
TARGET, CHECKPOINT = "items", "checkpoint"


class DemoFailed(Exception):
    """A step of the demo did not happen (the driver died, a wait timed out)."""


# ------------------------------------------------------------------ the command (main thread)


def run_pipeline_demo(workdir: str, rows: int = 2000, seconds: float = 20.0,
                      console: Console | None = None, force: bool = False,
                      prepared: bool = False, timeout_s: float = 300.0) -> bool:
    """Run the demo in ``workdir`` (wiped first unless ``prepared``:
    :func:`sparkcoord.demo.prepare_workdir`); whether the verdict is PASS. ``timeout_s``
    bounds each wait (the first commit, the kill, the catch-up). Called by ``sparkcoord demo
    pipeline`` on its main thread, which it blocks."""
    from sparkcoord.testing.postgres import sigterm_as_interrupt

    console = console or Console()
    if not prepared:
        prepare_workdir(workdir, force)
    with sigterm_as_interrupt():
        return _Demo(workdir, rows, seconds, console, timeout_s).run()


class _Demo:
    def __init__(self, workdir: str, rows: int, seconds: float, console: Console,
                 timeout_s: float) -> None:
        self.workdir = workdir
        self.rows = rows
        self.seconds = seconds
        self.console = console
        self.timeout_s = timeout_s
        self.password = os.environ.get("PGPASSWORD") or secrets.token_urlsafe(18)
        self.target = os.path.join(workdir, TARGET)
        self.started = time.monotonic()
        self.server: Any = None
        self.driver: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.writer: Writer | None = None
        self._last_status = 0.0

    # -- output ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.started:6.1f}s[/] {text}",
                           highlight=False)

    def status(self, force: bool = False) -> None:
        """A progress line every few seconds while it waits."""
        if not force and time.monotonic() - self._last_status < 3.0:
            return
        self._last_status = time.monotonic()
        try:
            source = len(self.source_rows())
            version = table_version(self.target)
            target = len(table_rows(self.target)) if version >= 0 else 0
        except Exception as exc:  # noqa: BLE001 - a progress line only: the next one may do
            self.say(f"  (no progress line: {type(exc).__name__})")
            return
        written = self.writer.transactions if self.writer else 0
        self.say(f"  source {source:,} rows ({written:,} transactions written); "
                 f"Delta table {'version ' + str(version) if version >= 0 else 'not created yet'}"
                 f", {target:,} rows")

    # -- the steps ------------------------------------------------------------------------

    def run(self) -> bool:
        from sparkcoord.testing.postgres import PostgresServer, Role

        self.say(f"[bold]sparkcoord demo pipeline[/] in {self.workdir}: PostgreSQL -> CDC source "
                 f"-> Delta merge, the driver killed in the middle")
        role = Role(ROLE, self.password, "REPLICATION")
        try:
            self.server = PostgresServer(os.path.join(self.workdir, "postgres"), roles=[role])
        except RuntimeError as exc:  # no server binaries, no postgres user under root
            self.console.print(f"sparkcoord demo pipeline: {exc}", markup=False, highlight=False)
            return False
        try:
            try:
                try:
                    self.server.start()
                except PermissionError as exc:  # root, and the postgres user cannot reach it
                    self.server.stop()
                    self.say(f"{exc}; PostgreSQL goes in a temporary directory instead")
                    self.server = PostgresServer(roles=[role])
                    self.server.start()
            except RuntimeError as exc:  # initdb or pg_ctl failed: their output and the log
                raise DemoFailed(f"PostgreSQL did not start: {exc}") from exc
            return self._run()
        except DemoFailed as exc:
            self.console.print("[bold red]demo failed:[/]")
            self.console.print(str(exc), markup=False, highlight=False)
            self.console.print("[bold red]VERDICT: FAIL[/]")
            return False
        except KeyboardInterrupt:
            self.say("[yellow]interrupted: stopping the driver, the writer and PostgreSQL[/]")
            raise
        finally:
            self._stop_driver()
            if self.writer is not None:
                self.writer.stop()
            self.server.stop()
            self.say(f"PostgreSQL stopped; the Delta table, the checkpoint and the logs stay in "
                     f"{self.workdir}")

    def _run(self) -> bool:
        server = self.server
        self.say(f"PostgreSQL {server.bindir.parent.name} up on {server.host}:{server.port} "
                 f"(data in {server.root}), logical decoding on")
        server.create_database(DATABASE, owner=ROLE)
        with self.connect() as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, name text, qty int)")
            conn.execute(f"INSERT INTO {TABLE} SELECT g, 'item ' || g, g %% 100 "
                         "FROM generate_series(1, %s) g", (self.rows,))
        self.say(f"table public.{TABLE}: {self.rows:,} rows")
        self.start_driver()
        self.wait(lambda: table_version(self.target) >= 0, "the table's first commit")
        self.writer = Writer(self.connect, self.rows + 1)
        self.writer.start()
        writing = time.monotonic()
        self.say(f"writer started: transactions of 1-4 inserts, updates, deletes and key "
                 f"changes for {self.seconds:g} s")
        first = table_version(self.target)
        self.wait(lambda: time.monotonic() - writing >= self.seconds / 3
                  and table_version(self.target) >= first + 2, "two table commits more")
        killed_at = table_version(self.target)
        assert self.driver is not None
        pid = self.driver.pid
        kill_session(pid)
        code = self.driver.wait()
        self.say(f"[bold red]driver run 1 killed[/] with SIGKILL (pid {pid} and its session: "
                 f"the JVM, the source runner, the Python workers; exit code {code}) at table "
                 f"version {killed_at}, {self.writer.transactions:,} transactions written so far")
        self.driver = None
        self.start_driver()
        self.say("driver run 2: restarted on the same checkpoint")
        self.wait(lambda: time.monotonic() - writing >= self.seconds
                  and table_version(self.target) > killed_at, "the restarted driver's commit")
        self.writer.stop()
        self.say(f"writer stopped after {self.writer.transactions:,} transactions; the driver "
                 f"catches up (an availableNow run) and ends")
        with open(os.path.join(self.workdir, WRITER_STOPPED), "w") as f:
            f.write("the writer stopped: end the stream, catch up, exit\n")
        self.wait(lambda: self.driver is None or self.driver.poll() is not None,
                  "the driver to catch up and end", driver_may_end=True)
        end = self.driver.wait() if self.driver is not None else 0
        self.driver = None
        if end != 0:
            raise DemoFailed(f"driver run 2 ended with exit code {end}\n{self.log_tail(2)}")
        self.say(f"driver run 2 ended (exit code 0); table version {table_version(self.target)}")
        return self.verdict(code == -9)

    # -- the driver program ---------------------------------------------------------------

    def start_driver(self) -> None:
        self.runs += 1
        env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
        env.update({URL_ENV: self.server.url(DATABASE, ROLE), "PGPASSWORD": self.password,
                    "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable)})
        log = open(os.path.join(self.workdir, f"driver-{self.runs}.log"), "wb")  # noqa: SIM115
        with log:
            self.driver = subprocess.Popen(
                [sys.executable, "-m", "sparkcoord.demo_pipeline", self.workdir],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.say(f"driver run {self.runs} started (pid {self.driver.pid}; its output in "
                 f"driver-{self.runs}.log)")

    def _stop_driver(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            kill_session(self.driver.pid)
            self.driver.wait()
        self.driver = None

    def log_tail(self, run: int, lines: int = 30) -> str:
        path = os.path.join(self.workdir, f"driver-{run}.log")
        try:
            with open(path, errors="replace") as f:
                return "\n".join(f.read().splitlines()[-lines:])
        except OSError:
            return ""

    def wait(self, done: Callable[[], bool], what: str, driver_may_end: bool = False) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if not driver_may_end and self.driver is not None and self.driver.poll() is not None:
                raise DemoFailed(f"driver run {self.runs} ended (exit code "
                                 f"{self.driver.returncode}) before {what}\n"
                                 f"{self.log_tail(self.runs)}")
            if self.writer is not None and self.writer.error is not None:
                raise DemoFailed(f"the writer failed: {self.writer.error}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"no {what} within {self.timeout_s:g} s\n"
                                 f"{self.log_tail(self.runs)}")
            self.status()
            time.sleep(0.3)

    # -- the tables -----------------------------------------------------------------------

    def connect(self) -> Any:
        return self.server.connect(ROLE, DATABASE)

    def source_rows(self) -> dict[int, tuple[Any, ...]]:
        with self.connect() as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute(f"SELECT id, name, qty FROM {TABLE}")}

    def verdict(self, killed: bool) -> bool:
        self.status(force=True)
        source, target = self.source_rows(), table_rows(self.target)
        missing = source.keys() - target.keys()
        extra = target.keys() - source.keys()
        differing = [k for k in source.keys() & target.keys() if source[k] != target[k]]
        ok = killed and not missing and not extra and not differing
        table = Table(title="verdict: public.items (PostgreSQL) vs the Delta table, row by row")
        for column in ("rows in source", "rows in target", "missing", "extra", "differing",
                       "verdict"):
            table.add_column(column, justify="right")
        table.add_row(f"{len(source):,}", f"{len(target):,}", str(len(missing)), str(len(extra)),
                      str(len(differing)), "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]")
        self.console.print(table)
        for name, keys in (("missing", sorted(missing)), ("extra", sorted(extra)),
                           ("differing", sorted(differing))):
            if keys:
                self.console.print(f"  {name} keys (first 10): {keys[:10]}")
        assert self.writer is not None
        commits = sink_commits(self.target)
        self.console.print(f"driver runs: {self.runs} (run 1 killed with SIGKILL: "
                           f"{'yes' if killed else 'NO'}); writer transactions: "
                           f"{self.writer.transactions:,}; Delta table history: "
                           f"{sum(commits.values())} merge commits by {len(commits)} sink "
                           f"runs ({', '.join(str(n) for n in commits.values())}: the killed "
                           f"driver's, the restarted one's stream and catch-up)",
                           highlight=False)
        self.console.print("[bold green]VERDICT: PASS[/] (the Delta table equals the source "
                           "table)" if ok else "[bold red]VERDICT: FAIL[/]", highlight=False)
        return ok


class Writer(threading.Thread):
    """Transactions of 1-4 random inserts, updates, deletes and primary-key changes on the
    demo's table, until :meth:`stop` (its own thread; ``transactions`` counts the committed
    ones, ``error`` holds what stopped it early)."""

    def __init__(self, connect: Callable[[], Any], next_id: int, seed: int | None = None,
                 pause_s: float = 0.02) -> None:
        super().__init__(name="sparkcoord-demo-writer", daemon=True)
        self._connect = connect
        self._next_id = next_id
        self._rng = random.Random(seed)
        self._pause_s = pause_s
        self._stop_event = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(60)

    def run(self) -> None:
        try:
            with self._connect() as conn:
                while not self._stop_event.is_set():
                    with conn.transaction():
                        for _ in range(self._rng.randint(1, 4)):
                            self._change(conn)
                    self.transactions += 1
                    self._stop_event.wait(self._pause_s * 2 * self._rng.random())
        except BaseException as exc:  # noqa: BLE001 - reported by the demo's waits
            self.error = exc

    def _change(self, conn: Any) -> None:
        rng, op = self._rng, self._rng.random()
        target = rng.randint(1, self._next_id)
        if op < 0.3:
            conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s)",
                         (self._next_id, f"new {self._next_id}", rng.randint(0, 99)))
            self._next_id += 1
        elif op < 0.75:
            conn.execute(f"UPDATE {TABLE} SET qty = qty + 1, name = %s WHERE id = %s",
                         (f"updated {self.transactions}", target))
        elif op < 0.93:
            conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (target,))
        else:  # a key change: the stream has a delete of the old key and an insert of the new
            conn.execute(f"UPDATE {TABLE} SET id = %s WHERE id = %s", (self._next_id, target))
            self._next_id += 1


def table_version(path: str) -> int:
    """The Delta table's newest version, -1 while it does not exist."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return int(DeltaTable(path).version())
    except TableNotFoundError:
        return -1


def sink_commits(path: str) -> dict[str, int]:
    """The Delta table's commits by the sink, counted per sink run (the run id each commit
    records, ``sparkcoord.run-id``: one per query run), oldest run first."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        history = DeltaTable(path).history()
    except TableNotFoundError:
        return {}
    runs: dict[str, int] = {}
    for commit in sorted(history, key=lambda c: int(c["version"])):
        run = commit.get("sparkcoord.run-id")
        if run is not None:
            runs[str(run)] = runs.get(str(run), 0) + 1
    return runs


def table_rows(path: str) -> dict[int, tuple[Any, ...]]:
    """The Delta table's rows by key (empty while it does not exist)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        data = DeltaTable(path).to_pyarrow_table(columns=["id", "name", "qty"])
    except TableNotFoundError:
        return {}
    columns = [data.column(c).to_pylist() for c in ("id", "name", "qty")]
    return {i: (n, q) for i, n, q in zip(*columns, strict=True)}


# ------------------------------------------------------- the driver program (another process)


def driver_main(workdir: str) -> int:
    """The job's driver program (``python -m sparkcoord.demo_pipeline <dir>``, its main
    thread): the pipeline as a streaming run until the file :data:`WRITER_STOPPED` appears,
    then an ``availableNow`` run that catches up; exit code 0. The URL (without a password)
    comes from :data:`URL_ENV`, the password from ``PGPASSWORD``, which Spark's processes
    inherit (local mode)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.spark import CoordinatedJob

    url = os.environ[URL_ENV]
    spark = demo_session(workdir, "sparkcoord-demo-pipeline")
    stopped = os.path.join(workdir, WRITER_STOPPED)

    def writer(job: Any) -> Any:
        changes = (PostgresCDC(job).options(tables=f"public.{TABLE}", chunkSize="500",
                                            maxChunksPerBatch="2", pollInterval="200ms")
                   .load(url))
        return (LakeSink(job).format("delta").options(mode="merge", jobId="demo")
                .writer(changes, os.path.join(workdir, TARGET)))

    try:
        job = CoordinatedJob(spark, os.path.join(workdir, CHECKPOINT))
        print("streaming until the writer stops", flush=True)
        report = job.run(writer(job).trigger(processingTime="500 milliseconds"),
                         until=lambda: os.path.exists(stopped), poll_s=0.3)
        print(f"streaming run ended: {report.restarts} restart(s)", flush=True)
        job = CoordinatedJob(spark, os.path.join(workdir, CHECKPOINT))
        report = job.run(writer(job).trigger(availableNow=True), timeout_s=600)
        print(f"caught up (availableNow run): {report.restarts} restart(s)", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover - the driver program, run by the demo
    sys.exit(driver_main(sys.argv[1]))
