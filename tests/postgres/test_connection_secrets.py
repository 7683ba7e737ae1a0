"""Connection options (sparkcoord/sources/postgres/io/connection.py) against a real server with
password authentication: the URL, the options and libpq's environment (PGPASSWORD, a
passfile) combine as libpq documents, and no password ever shows: not in a repr, a pickle, a
log line, an error or its traceback; a refused connection names host, port, database and
user."""

from __future__ import annotations

import logging
import os
import pickle
import traceback
from pathlib import Path
from typing import Any

import pytest

from sparkcoord.sources.postgres.errors import ConnectionRefused
from sparkcoord.sources.postgres.io import replication
from sparkcoord.sources.postgres.io.connection import ConnectionOptions, Secret, redacted
from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer

WRONG = "s3cr3t-pw-wrong"


@pytest.fixture
def no_libpq_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PG* variable of the machine leaks into a test, and no ~/.pgpass."""
    for name in list(os.environ):
        if name.startswith("PG"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-such-passfile"))


def everything_shown(*objects: Any) -> str:
    """Every text a log, an error report or a checkpoint could hold of ``objects``."""
    parts = []
    for obj in objects:
        parts += [repr(obj), str(obj)]
        if isinstance(obj, BaseException):
            parts += traceback.format_exception(obj)
            parts += [repr(a) for a in obj.args]
    return "\n".join(parts)


def test_redacted_hides_the_password_of_a_url_and_of_key_value_text() -> None:
    cases = {
        "postgresql://ann:s3cr3t-pw@db.example:5432/shop":
            "postgresql://ann:***@db.example:5432/shop",
        "postgres://ann:s3cr3t-pw@db/shop?sslmode=require&password=s3cr3t-pw":
            "postgres://ann:***@db/shop?sslmode=require&password=***",
        "host=db user=ann password=s3cr3t-pw dbname=shop":
            "host=db user=ann password=*** dbname=shop",
        "host=db password = 's3cr3t pw\\' x' sslpassword=s3cr3t-pw":
            "host=db password = *** sslpassword=***",
        "postgresql://ann@db/shop": "postgresql://ann@db/shop",
        "failed: postgresql://ann:s3cr3t-pw@db/x is down": "failed: postgresql://ann:***@db/x is down",
    }
    for text, shown in cases.items():
        assert redacted(text) == shown
        assert "s3cr3t" not in redacted(text)


def test_options_show_no_password_in_repr_str_or_conninfo() -> None:
    options = ConnectionOptions.parse("postgresql://ann:s3cr3t-pw@db.example:5433/shop",
                                      {"sslpassword": "s3cr3t-pw-ssl", "sslmode": "disable"})
    assert options.get("user") == "ann" and options.get("port") == "5433"
    assert options.get("password") is None
    shown = everything_shown(options, options.conninfo(), options.describe(), options.secrets)
    assert "s3cr3t" not in shown
    assert options.describe() == "ann@db.example:5433/shop"
    assert "Secret(***)" in repr(options.secrets[0][1])


def test_options_pickle_without_their_password() -> None:
    options = ConnectionOptions.parse("postgresql://ann:s3cr3t-pw@db/shop")
    data = pickle.dumps(options)
    assert b"s3cr3t" not in data
    copy = pickle.loads(data)
    assert copy == options and copy.params == options.params
    assert copy.secrets == () and copy.secrets_dropped
    with pytest.raises(TypeError, match="a password is never pickled"):
        pickle.dumps(Secret("s3cr3t-pw"))


def test_options_override_the_url_and_unknown_options_are_errors() -> None:
    options = ConnectionOptions.parse("postgresql://ann@db:5432/shop",
                                      {"user": "bob", "database": "stock", "port": "6000"})
    assert (options.get("user"), options.get("dbname"), options.get("port")) == (
        "bob", "stock", "6000")
    with pytest.raises(ValueError, match=r"unknown connection option 'tables'"):
        ConnectionOptions.parse("postgresql://db/shop", {"tables": "public.x"})
    url = "postgresql://ann:s3cr3t-pw@db/shop?no_such_keyword=1"  # libpq refuses the keyword
    with pytest.raises(ValueError, match=r"not a PostgreSQL connection URL .*\*\*\*") as e:
        ConnectionOptions.parse(url)
    assert "s3cr3t" not in everything_shown(e.value)


def test_a_wrong_password_names_host_port_database_and_user_and_never_the_password(
        postgres_server: PostgresServer, database: str, caplog: pytest.LogCaptureFixture,
        no_libpq_env: None) -> None:
    caplog.set_level(logging.DEBUG)
    options = ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER, WRONG))
    with pytest.raises(ConnectionRefused) as e:
        options.connect()
    message = str(e.value)
    assert (f"PostgreSQL at 127.0.0.1 port {postgres_server.port}, database {database!r}, "
            f"user {ADMIN_USER!r}: cannot connect") in message
    assert "password authentication failed" in message
    assert e.value.__cause__ is None and e.value.__suppress_context__
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "s3cr3t" not in everything_shown(e.value) + logged
    assert f"{ADMIN_USER}@127.0.0.1:{postgres_server.port}/{database}" in logged


def test_nothing_a_working_session_logs_or_raises_holds_the_password(
        postgres_server: PostgresServer, database: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    options = ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER),
                                      {"password": ADMIN_PASSWORD})
    with options.connect() as conn:
        conn.execute("CREATE TABLE sec_t (id int PRIMARY KEY)")
        replication.ensure_publication(conn, "sec_pub", [replication.TableName.parse("sec_t")])
        replication.ensure_slot(conn, "sec_slot")
        conn.execute("INSERT INTO sec_t VALUES (1)")
        peeked = replication.peek(conn, "sec_slot", "sec_pub")
        with pytest.raises(Exception) as e:
            replication.peek(conn, "no_such_slot", "sec_pub")
        shown = everything_shown(conn, peeked, e.value, options)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert ADMIN_PASSWORD not in shown + logged


def test_an_unreachable_server_is_an_error_naming_where(no_libpq_env: None) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = ConnectionOptions.parse(f"postgresql://ann:s3cr3t-pw@127.0.0.1:{port}/shop",
                                      {"connect_timeout": "2"})
    with pytest.raises(ConnectionRefused, match=rf"PostgreSQL at 127.0.0.1 port {port}, "
                                                r"database 'shop', user 'ann': cannot connect: "
                                                r".*refused") as e:
        options.connect()
    assert "s3cr3t" not in everything_shown(e.value)


def test_libpq_takes_the_password_from_pgpassword_or_a_passfile(
        postgres_server: PostgresServer, database: str, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, no_libpq_env: None) -> None:
    options = ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER))
    with pytest.raises(ConnectionRefused, match="no password supplied"):
        options.connect()
    monkeypatch.setenv("PGPASSWORD", ADMIN_PASSWORD)
    with options.connect() as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == ADMIN_USER
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{postgres_server.port}:*:{ADMIN_USER}:{ADMIN_PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with options.connect() as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == ADMIN_USER


def test_libpq_takes_host_port_user_and_database_from_the_environment(
        postgres_server: PostgresServer, database: str, monkeypatch: pytest.MonkeyPatch,
        no_libpq_env: None) -> None:
    for name, value in {"PGHOST": "127.0.0.1", "PGPORT": str(postgres_server.port),
                        "PGUSER": ADMIN_USER, "PGDATABASE": database,
                        "PGPASSWORD": ADMIN_PASSWORD}.items():
        monkeypatch.setenv(name, value)
    options = ConnectionOptions.parse(None)
    assert options.describe() == f"{ADMIN_USER}@127.0.0.1:{postgres_server.port}/{database}"
    with options.connect() as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == database


def test_an_unpickled_copy_that_is_refused_says_how_to_supply_the_password(
        postgres_server: PostgresServer, database: str, no_libpq_env: None) -> None:
    options = ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER),
                                      {"password": ADMIN_PASSWORD})
    with options.connect():
        pass  # the driver's own copy connects
    copy = pickle.loads(pickle.dumps(options))
    with pytest.raises(ConnectionRefused, match=r"never sent to other processes or "
                                                r"checkpoints: supply it here through "
                                                r"PGPASSWORD or a passfile"):
        copy.connect()


def test_every_session_gets_the_settings_values_are_read_with(admin: Any) -> None:
    settings = {name: admin.execute(f"SHOW {name}").fetchone()[0]
                for name in ("DateStyle", "TimeZone", "bytea_output", "extra_float_digits",
                             "client_encoding")}
    assert settings == {"DateStyle": "ISO, MDY", "TimeZone": "UTC", "bytea_output": "hex",
                        "extra_float_digits": "3", "client_encoding": "UTF8"}


def test_the_users_own_session_options_are_kept_and_ours_win(
        postgres_server: PostgresServer, database: str) -> None:
    options = ConnectionOptions.parse(
        postgres_server.url(database, ADMIN_USER),
        {"password": ADMIN_PASSWORD, "options": "-c TimeZone=Asia/Tokyo -c work_mem=7MB"})
    with options.connect() as conn:
        assert conn.execute("SHOW work_mem").fetchone()[0] == "7MB"
        assert conn.execute("SHOW TimeZone").fetchone()[0] == "UTC"

