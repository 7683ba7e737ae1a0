"""``sparkcoord cdc`` (sparkcoord/sources/postgres/command.py): its arguments are checked before
Spark starts, nothing it shows holds the URL's password, and (marked ``spark``) docs/cdc.md's
example and the command mirror a real PostgreSQL table into parquet, continuing one checkpoint.

The tests without Spark never start a session: the runner's Spark side is replaced by fakes.
The Spark tests run Spark only in subprocesses, with PGPASSWORD in their environment only (this
process never has it: other tests check the source without it)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console

from sparkcoord.cli import main
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.sources.console import RowCount
from sparkcoord.sources.postgres import command
from sparkcoord.sources.postgres.command import (
    cdc_options,
    header,
    pgpassword_note,
    progress_text,
    run_cdc,
)
from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server

__all__ = ["postgres_server"]  # the session's server fixture (tests/postgres_server.py)

SECRET = "pa55-w0rd-zz"
URL = f"postgresql://cdc:{SECRET}@db.example.com:5432/shop"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs", "cdc.md")


# -- arguments (no Spark) -------------------------------------------------------------------


def test_cdc_help_lists_tables_out_checkpoint_bounded_and_option(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["cdc", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--tables", "--out", "--checkpoint", "--bounded", "--option"):
        assert flag in out


def test_cdc_without_tables_out_or_checkpoint_is_a_usage_error(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["cdc", URL, "--out", "o", "--checkpoint", "c"])
    assert exit_.value.code == 2
    assert "--tables" in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    ("chunkSize", "--option 'chunkSize' is not KEY=VALUE"),
    ("=5", "--option '=5' is not KEY=VALUE"),
    (f"password:{SECRET}", "--option password... is not KEY=VALUE"),
    ("chunkSize=abc", "option 'chunkSize': expected an integer, got 'abc'"),
    ("startupMode=earliest", "option 'startupMode': use one of initial, latest"),
    ("pollInterval=soon", "option 'pollInterval': expected a duration"),
    ("pasword=x", "unknown connection option 'pasword'"),
    ("tables=public.x", "give the tables with --tables"),
    ("chunkKeyColumn=public.other:id", "names table public.other, which option 'tables' does "
                                       "not capture"),
])
def test_a_bad_option_is_an_error_naming_it_before_spark_starts_without_the_password(
        capsys: Any, monkeypatch: Any, option: str, message: str) -> None:
    def no_run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("the runner (and Spark) must not start")

    monkeypatch.setattr(command, "run_cdc", no_run)
    code = main(["cdc", URL, "--tables", "public.orders", "--out", "o", "--checkpoint", "c",
                 "--option", option])
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert captured.err.startswith("sparkcoord cdc: ")
    assert SECRET not in captured.out + captured.err


def test_a_url_libpq_cannot_read_is_an_error_that_shows_it_without_its_password(
        capsys: Any, monkeypatch: Any) -> None:
    def no_run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("the runner (and Spark) must not start")

    monkeypatch.setattr(command, "run_cdc", no_run)
    bad = f"postgresql://cdc:{SECRET}@db/shop?sslmode"  # a parameter without a value
    assert main(["cdc", bad, "--tables", "public.orders", "--out", "o", "--checkpoint",
                 "c"]) == 2
    err = capsys.readouterr().err
    assert "not a PostgreSQL connection URL" in err
    assert "postgresql://cdc:***@db/shop?sslmode" in err
    assert SECRET not in err


def test_the_options_given_become_the_sources_options_with_the_tables() -> None:
    options = cdc_options(URL, ["public.orders", "customers"],
                          {"chunkSize": "500", "sslmode": "disable"})
    assert options == {"tables": "public.orders,customers", "chunkSize": "500",
                       "sslmode": "disable"}


# -- what is shown (no Spark) ----------------------------------------------------------------


@pytest.mark.parametrize("url, shown", [
    (URL, "postgresql://cdc:***@db.example.com:5432/shop"),
    (f"postgresql://cdc@db/shop?password={SECRET}&sslmode=require",
     "postgresql://cdc@db/shop?password=***&sslmode=require"),
    (f"host=db user=cdc password={SECRET} dbname=shop", "host=db user=cdc password=*** dbname=shop"),
])
def test_the_header_shows_the_url_without_its_password_and_the_slot(url: str, shown: str) -> None:
    text = header(url, "public.orders", "out/", "/ck", "sparkcoord_0123", bounded=False)
    assert shown in text
    assert SECRET not in text
    assert "replication slot sparkcoord_0123" in text and "public.orders -> out/" in text
    assert "until Ctrl-C" in text
    assert "then stop" in header(url, "public.orders", "out/", "/ck", "s", bounded=True)


def test_without_a_url_the_header_says_libpqs_environment_is_used() -> None:
    assert "libpq's environment" in header(None, "public.orders", "o", "/ck", "s", False)


@pytest.mark.parametrize("status, shown", [
    ({}, "starting"),
    ({"phase": "setting up"}, "setting up the slot and the publication"),
    ({"phase": "setting up", "waiting": "creating the replication slot ...",
      "blocking_pids": [4242]},
     "setting up the slot and the publication: the slot's creation waits for transaction(s) "
     "holding a transaction id to end (pid 4242; see the WARNING)"),
    ({"phase": "snapshot", "chunks_planned": 12, "chunks_finished": 5, "planning_done": False},
     "snapshot: 5 of 12+ chunks read"),
    ({"phase": "snapshot", "chunks_planned": 12, "chunks_finished": 12, "planning_done": True},
     "snapshot: 12 of 12 chunks read"),
    ({"phase": "hand-over", "chunks_finished": 12}, "snapshot done (12 chunks); handing over to the stream"),
    ({"phase": "stream", "confirmed_lsn": (1 << 32) + 0x2A0}, "stream; slot confirmed at 1/2A0"),
    ({"phase": "stream", "confirmed_lsn": 0}, "stream"),
])
def test_the_progress_line_shows_rows_and_the_sources_phase(status: dict[str, Any],
                                                             shown: str) -> None:
    line = progress_text("public.orders", "out/", 12345, status, restarts=0)
    assert line.startswith("public.orders -> out/: 12,345 rows; ")
    assert line.endswith(shown)
    assert progress_text("t", "o", 1, status, restarts=2).endswith("; 2 restart(s)")


@dataclass
class Progress:
    runId: str
    batchId: int
    numInputRows: int


def test_the_rows_count_sums_every_batch_also_those_spark_no_longer_keeps() -> None:
    count = RowCount()
    reports = [Progress("run-a", b, 10) for b in range(250)]
    for end in range(1, 251):  # polled after every batch; Spark keeps the newest 100
        count.add(reports[max(0, end - 100):end])
    assert count.rows == 2500
    # an idle trigger's report of the next batch id (0 rows) gives way to that batch's report
    count.add([*reports[151:], Progress("run-a", 250, 0)])
    assert count.rows == 2500
    count.add([*reports[152:], Progress("run-a", 250, 7)])
    assert count.rows == 2507
    # a restarted query (a new runId) adds to the count; nothing to go by keeps it
    count.add([*reports[153:], Progress("run-a", 250, 7), Progress("run-b", 251, 3)])
    count.add([])
    assert count.rows == 2510


def test_a_password_without_pgpassword_or_a_passfile_gets_a_note(monkeypatch: Any,
                                                                  tmp_path: Any) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-such-passfile"))
    options = {"tables": "public.orders"}
    note = pgpassword_note(URL, options)
    assert note is not None and "PGPASSWORD" in note and SECRET not in note
    assert pgpassword_note("postgresql://cdc@db/shop", options) is None  # no password given
    assert pgpassword_note("postgresql://cdc@db/shop", {**options, "password": SECRET})
    passfile = tmp_path / "pgpass"
    passfile.write_text("*:*:*:cdc:x\n")
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    assert pgpassword_note(URL, options) is None


# -- the runner with its Spark side faked (no Spark) ----------------------------------------


class FakeWriter:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def format(self, name: str) -> FakeWriter:
        self.calls.append(("format", name))
        return self

    def option(self, key: str, value: str) -> FakeWriter:
        self.calls.append(("option", (key, value)))
        return self

    def trigger(self, **kwargs: Any) -> FakeWriter:
        self.calls.append(("trigger", kwargs))
        return self


class FakeHandle:
    restarts = 0

    def __init__(self) -> None:
        self.polls = 0
        self.recentProgress = [Progress("r", 0, 40), Progress("r", 1, 2)]

    def await_termination(self, timeout_s: float | None = None) -> bool:
        self.polls += 1
        return self.polls > 2

    def request(self, operator: str, request: Any, timeout_s: float = 30.0) -> Any:
        assert (operator, request) == ("postgres", "status")
        return {"phase": "stream", "chunks_planned": 3, "chunks_finished": 3,
                "confirmed_lsn": 0x10}

    def stop(self) -> None:
        raise AssertionError("not stopped: the run ended by itself")


def fake_spark_side(monkeypatch: Any, failure: Exception | None = None
                    ) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    calls: list[tuple[str, Any]] = []
    seen: dict[str, Any] = {}

    class FakeJob:
        def __init__(self, spark: Any, checkpoint: str) -> None:
            self.checkpoint_dir = "/abs/" + checkpoint.strip("/")

        def start(self, writer: FakeWriter) -> FakeHandle:
            return FakeHandle()

    class FakeCDC:
        def __init__(self, job: FakeJob) -> None:
            self.job = job

        def options(self, **options: str) -> FakeCDC:
            seen["options"] = options
            return self

        def load(self, url: str, name: str) -> Any:
            seen["url"], seen["name"] = url, name
            if failure is not None:
                raise failure
            df = type("DF", (), {})()
            df.writeStream = FakeWriter(calls)
            return df

    monkeypatch.setattr("sparkcoord.spark.job.CoordinatedJob", FakeJob)
    monkeypatch.setattr("sparkcoord.sources.postgres.stream.PostgresCDC", FakeCDC)
    return calls, seen


def test_the_runner_writes_parquet_shows_no_password_and_reports_rows_and_the_slot(
        monkeypatch: Any) -> None:
    from sparkcoord.sources.postgres.stream import default_slot_name

    calls, seen = fake_spark_side(monkeypatch)
    screen = io.StringIO()
    result = run_cdc(URL, "public.orders,public.customers", "out/", "ck", bounded=True,
                     options={"password": SECRET, "chunkSize": "100"},
                     spark=object(), console=Console(file=screen, width=300))
    text = screen.getvalue()
    assert SECRET not in text
    assert "postgresql://cdc:***@db.example.com:5432/shop" in text
    slot = default_slot_name("/abs/ck", "postgres")
    assert result == {"rows": 42, "restarts": 0, "slot": slot, "publication": slot,
                      "last_status": FakeHandle().request("postgres", "status")}
    assert f"replication slot {slot}" in text
    assert text.rstrip().endswith("public.orders, public.customers -> out/: 42 rows; stream; "
                                  "slot confirmed at 0/10")
    assert seen["url"] == URL and seen["name"] == "postgres"  # the password goes to the builder
    assert seen["options"] == {"tables": "public.orders,public.customers",
                               "password": SECRET, "chunkSize": "100"}
    assert calls == [("format", "parquet"), ("option", ("path", "out/")),
                     ("trigger", {"availableNow": True})]


def test_an_own_session_gets_the_given_password_as_pgpassword_for_its_lifetime_only(
        monkeypatch: Any) -> None:
    """Rule 4: Spark's processes of a local session the command starts inherit PGPASSWORD."""
    from contextlib import contextmanager
    from threading import Event

    fake_spark_side(monkeypatch)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    at_start: list[str | None] = []

    @contextmanager
    def session(spark: Any, app: str) -> Any:
        at_start.append(os.environ.get("PGPASSWORD"))  # what a JVM started here inherits
        yield object(), Event()

    monkeypatch.setattr("sparkcoord.sources.console.command_session", session)
    screen = io.StringIO()
    run_cdc(URL, "public.orders", "o", "ck", console=Console(file=screen, width=300))
    assert at_start == [SECRET] and "PGPASSWORD" not in os.environ
    assert SECRET not in screen.getvalue() and "note:" not in screen.getvalue()
    # one the user exported wins; a given session is not touched
    monkeypatch.setenv("PGPASSWORD", "exported-by-the-user")
    run_cdc(URL, "public.orders", "o", "ck", console=Console(file=io.StringIO()))
    assert at_start[-1] == "exported-by-the-user"
    assert os.environ["PGPASSWORD"] == "exported-by-the-user"


def test_a_named_slot_and_publication_are_the_ones_reported(monkeypatch: Any) -> None:
    fake_spark_side(monkeypatch)
    result = run_cdc(URL, "public.orders", "o", "ck", spark=object(),
                     options={"slot": "mine", "publication": "pub"},
                     console=Console(file=io.StringIO()))
    assert (result["slot"], result["publication"]) == ("mine", "pub")


def test_the_command_prints_a_failure_without_the_password_and_exits_1(
        monkeypatch: Any, capsys: Any) -> None:
    def failing(url: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise SparkCoordError(f"the job gave up: could not reach {url}")

    monkeypatch.setattr(command, "run_cdc", failing)
    assert main(["cdc", URL, "--tables", "public.orders", "--out", "o", "--checkpoint",
                 "c"]) == 1
    captured = capsys.readouterr()
    assert "could not reach postgresql://cdc:***@db.example.com:5432/shop" in captured.err
    assert SECRET not in captured.out + captured.err


def test_the_command_prints_the_rows_and_how_to_drop_the_slot(monkeypatch: Any,
                                                             capsys: Any) -> None:
    got: dict[str, Any] = {}

    def fake(url: str, tables: str, out: str, checkpoint: str, **kwargs: Any) -> dict[str, Any]:
        got.update(url=url, tables=tables, out=out, checkpoint=checkpoint, **kwargs)
        return {"rows": 1234, "restarts": 0, "last_status": {}, "slot": "sparkcoord_ab",
                "publication": "sparkcoord_ab"}

    monkeypatch.setattr(command, "run_cdc", fake)
    assert main(["cdc", URL, "--tables", "public.orders", "--out", "o", "--checkpoint", "c",
                 "--bounded", "--option", "chunkSize=5", "--option", "sslmode=disable"]) == 0
    out = capsys.readouterr().out
    assert "1,234 rows read into o" in out
    assert "SELECT pg_drop_replication_slot('sparkcoord_ab')" in out
    assert got == {"url": URL, "tables": "public.orders", "out": "o", "checkpoint": "c",
                   "options": {"chunkSize": "5", "sslmode": "disable"}, "bounded": True}


# -- on Spark and a real PostgreSQL (subprocesses) -------------------------------------------


def python_blocks() -> list[str]:
    with open(DOCS) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


DOC_URL = "postgresql://cdc@localhost:5432/shop"

APPLY = """
import json
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2,4]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
exec(compile(BLOCK, "docs/cdc.md", "exec"))
rows = sorted((r["id"], r["item"], r["qty"]) for r in current.collect())
ops = sorted(r["op"] for r in spark.read.parquet("out/").collect())
print("RESULT " + json.dumps({"rows": rows, "ops": ops}))
spark.stop()
"""


def spark_env() -> dict[str, str]:
    return dict(os.environ, PGPASSWORD=ADMIN_PASSWORD, PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=REPO)


def run(argv: list[str], cwd: Any, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=spark_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.mark.spark
@pytest.mark.own_processes
def test_the_guides_example_and_the_command_mirror_a_table_and_the_guides_query_applies_it(
        tmp_path: Any, postgres_server: PostgresServer) -> None:
    import psycopg

    server = postgres_server
    database = server.create_database("t_cdc_cli")
    url = server.url(database, ADMIN_USER)
    blocks = python_blocks()
    assert DOC_URL in blocks[0]
    with psycopg.connect(server.url(database, ADMIN_USER, ADMIN_PASSWORD),
                         autocommit=True) as conn:
        try:
            conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, item text, "
                         "qty int, placed timestamptz)")
            conn.execute("INSERT INTO public.orders SELECT g, 'item ' || g, g % 7, now() "
                         "FROM generate_series(1, 1000) g")
            # 1. the guide's example, as written but for the URL: the snapshot, then it ends
            (tmp_path / "mirror.py").write_text(blocks[0].replace(DOC_URL, url))
            done = run([sys.executable, "mirror.py"], tmp_path)
            assert "only showing top 5 rows" in done.stdout
            # 2. changes: a truncate and inserts in one transaction, an update, a delete, an
            # insert and a key change
            with conn.transaction():
                conn.execute("TRUNCATE public.orders")
                conn.execute("INSERT INTO public.orders SELECT g, 'again ' || g, g, now() "
                             "FROM generate_series(1, 10) g")
            conn.execute("UPDATE public.orders SET qty = 100 WHERE id = 1")
            conn.execute("DELETE FROM public.orders WHERE id = 2")
            conn.execute("INSERT INTO public.orders VALUES (1001, 'new', 5, now())")
            conn.execute("UPDATE public.orders SET id = 3003 WHERE id = 3")
            # 3. the command, bounded, on the same checkpoint location and sink: the changes
            password_url = server.url(database, ADMIN_USER, ADMIN_PASSWORD)
            done = run([sys.executable, "-m", "sparkcoord.cli", "cdc", password_url,
                        "--tables", "public.orders", "--out", "out/", "--checkpoint", "ckpt/",
                        "--bounded"], tmp_path)
            shown = done.stdout + done.stderr
            assert ADMIN_PASSWORD not in shown
            assert f"postgresql://{ADMIN_USER}:***@" in shown
            # t, 10 c, u, d, c, d + c
            assert "16 rows read into out/" in done.stdout, done.stdout
            # 4. the guide's query applied to the sink gives the table
            script = f"BLOCK = {blocks[1]!r}\n{APPLY}"
            done = run([sys.executable, "-c", script], tmp_path)
            result = json.loads(done.stdout.split("RESULT ", 1)[1])
            table = sorted(conn.execute("SELECT id, item, qty FROM public.orders").fetchall())
            assert [tuple(r) for r in result["rows"]] == table
            assert len(table) == 10
            # every change once: the snapshot, the truncate, 10 + 2 inserts, 2 deletes, 1 update
            ops = result["ops"]
            assert {op: ops.count(op) for op in set(ops)} == {"r": 1000, "t": 1, "c": 12,
                                                               "d": 2, "u": 1}
        finally:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s", (database,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
