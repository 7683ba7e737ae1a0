"""A server that cannot take a session yet is waited for (sparkcoord/sources/postgres/
connection.py rule 4): PostgreSQL answers a startup packet with SQLSTATE 57P03 while it starts,
replays its WAL after a crash (``pg_ctl stop -m immediate`` and a start) or is a standby not yet
consistent, and every place the source connects (the coordinator's planner and slot connections,
the readers) waits through it; a refused login still fails at once.

Which message a server in crash recovery sends when is a race against its WAL replay, so two
servers here hold the state as long as the test needs: a real standby restored from a base backup
whose end is not in its WAL yet (it answers "not yet accepting connections" until the test hands
it the rest, which it does on the source's first WARNING); and :class:`RecoveringServer`, which
listens on loopback in front of the session's real server, answers the next ``refuse(n)``
startup packets with the ErrorResponse PostgreSQL 15 sends (the texts of its postmaster.c), and
relays every other connection to the real server byte for byte.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkcoord.sources.postgres.enumerator import PostgresEnumeratorIO
from sparkcoord.sources.postgres.errors import ConnectionRefused
from sparkcoord.sources.postgres.io.connection import ConnectionOptions, transient_refusal
from sparkcoord.sources.postgres.reader import PostgresReader, ReaderConfig
from sparkcoord.testing import postgres
from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, Role

#: PostgreSQL 15's answers to a startup packet it cannot serve yet: (SQLSTATE, message, detail),
#: as postmaster.c's canAcceptConnections and postinit.c send them
NOT_YET = [
    ("57P03", "the database system is starting up", None),
    ("57P03", "the database system is not yet accepting connections",
     "Consistent recovery state has not been yet reached."),
    ("57P03", "the database system is not accepting connections", "Hot standby mode is disabled."),
    ("57P03", "the database system is in recovery mode", None),
    ("57P03", "the database system is shutting down", None),
    ("53300", "sorry, too many clients already", None),
    ("53300", "remaining connection slots are reserved for non-replication superuser "
              "connections", None),
    ("53300", 'too many connections for role "ann"', None),
]
#: and answers that do not change by waiting
REFUSED_LOGIN = [
    ("28P01", 'password authentication failed for user "ann"', None),
    ("28000", 'role "ann" does not exist', None),
    ("3D000", 'database "shop" does not exist', None),
    ("55000", 'database "shop" is not currently accepting connections', None),
    ("28000", 'no pg_hba.conf entry for host "10.0.0.1", user "ann", database "shop", no '
              "encryption", None),
]
SSL_REQUEST, GSSENC_REQUEST = 80877103, 80877104


def libpq_text(port: int, message: str, detail: str | None) -> str:
    """The text libpq gives for a server's FATAL answer to the startup packet."""
    text = f'connection to server at "127.0.0.1", port {port} failed: FATAL:  {message}\n'
    return text + (f"DETAIL:  {detail}\n" if detail else "")


def error_response(sqlstate: str, message: str, detail: str | None) -> bytes:
    """A protocol 3 ErrorResponse of severity FATAL."""
    fields = [(b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message)]
    if detail:
        fields.append((b"D", detail))
    body = b"".join(code + text.encode() + b"\0" for code, text in fields) + b"\0"
    return b"E" + struct.pack("!i", len(body) + 4) + body


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the client went away")
        data += chunk
    return data


class RecoveringServer:
    """Loopback TCP in front of the real server (module docstring). Its thread accepts; a relayed
    connection gets two more, which end when either side closes."""

    def __init__(self, target_port: int, sqlstate: str = "57P03",
                 message: str = "the database system is not yet accepting connections",
                 detail: str | None = "Consistent recovery state has not been yet reached.") -> None:
        self.target_port = target_port
        self.answer = error_response(sqlstate, message, detail)
        self.to_refuse = 0
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def refuse(self, n: int) -> None:
        """Answer the next ``n`` startup packets with the error (the test's thread, before
        the connections)."""
        self.to_refuse = n

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._sockets.append(client)
            if self.to_refuse > 0:
                self.to_refuse -= 1
                self._refuse(client)
            else:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                self._sockets.append(upstream)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._relay, args=(a, b), daemon=True).start()

    def _refuse(self, client: socket.socket) -> None:
        with client:
            try:
                while True:
                    length, code = struct.unpack("!ii", read_exactly(client, 8))
                    if code in (SSL_REQUEST, GSSENC_REQUEST):
                        client.sendall(b"N")  # no encryption: the startup packet follows
                        continue
                    read_exactly(client, length - 8)
                    self.refused += 1
                    client.sendall(self.answer)
                    return
            except OSError:
                return

    @staticmethod
    def _relay(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for s in (source, target):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        except OSError:
            pass
        self._listener.close()
        self._thread.join()
        for s in self._sockets:
            s.close()


@pytest.fixture
def recovering(postgres_server: PostgresServer) -> Iterator[RecoveringServer]:
    server = RecoveringServer(postgres_server.port)
    try:
        yield server
    finally:
        server.close()


def options_via(server: RecoveringServer, database: str) -> ConnectionOptions:
    return ConnectionOptions.parse(f"postgresql://{ADMIN_USER}@127.0.0.1:{server.port}/{database}",
                                   {"password": ADMIN_PASSWORD, "sslmode": "disable"})


@pytest.mark.parametrize(("sqlstate", "message", "detail"), NOT_YET)
def test_every_answer_of_a_server_that_cannot_take_a_session_yet_is_waited_for(
        sqlstate: str, message: str, detail: str | None) -> None:
    assert transient_refusal(libpq_text(5432, message, detail))


@pytest.mark.parametrize(("sqlstate", "message", "detail"), REFUSED_LOGIN)
def test_a_refused_login_or_a_database_that_allows_no_connections_is_not_waited_for(
        sqlstate: str, message: str, detail: str | None) -> None:
    assert not transient_refusal(libpq_text(5432, message, detail))


def test_a_connection_waits_while_the_server_replays_its_wal_after_a_crash(
        recovering: RecoveringServer, database: str, caplog: pytest.LogCaptureFixture) -> None:
    recovering.refuse(3)
    options = options_via(recovering, database)
    with caplog.at_level(logging.WARNING), options.connect(retry_s=60.0) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert recovering.refused == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "not yet accepting connections" in warnings[0] and "trying again" in warnings[0]
    assert ADMIN_PASSWORD not in warnings[0]


def test_a_connection_that_is_not_asked_to_wait_fails_at_once_naming_the_servers_answer(
        recovering: RecoveringServer, database: str) -> None:
    recovering.refuse(1)
    with pytest.raises(ConnectionRefused, match="not yet accepting connections") as e:
        options_via(recovering, database).connect(retry_s=0.0)
    assert e.value.transient and recovering.refused == 1


def test_a_wrong_password_fails_at_once_even_when_asked_to_wait(
        postgres_server: PostgresServer, database: str) -> None:
    options = ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER, "wrong-pw"))
    with pytest.raises(ConnectionRefused, match="password authentication failed") as e:
        options.connect(retry_s=3600.0)  # would outlast the test's time limit if it waited
    assert not e.value.transient


def terminate(postgres_server: PostgresServer, application_name: str) -> None:
    """End the sessions of ``application_name``, waiting until they are gone."""
    with postgres_server.connect(via_socket=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity "
                              "WHERE application_name = %s", (application_name,)).fetchall()
    assert ended == [(True,)]


def test_confirming_the_slot_after_a_crash_waits_for_the_recovering_server(
        postgres_server: PostgresServer, database: str, recovering: RecoveringServer,
        admin: Any) -> None:
    """The issue's run: the coordinator's slot connection breaks (the server crashed), and
    confirming the slot meets the server replaying its WAL: it waits, then confirms."""
    from sparkcoord.sources.postgres.io import replication

    replication.ensure_slot(admin, "recovery_slot")
    admin.execute("CREATE TABLE recovery_t (id int PRIMARY KEY)")
    io = PostgresEnumeratorIO(options_via(recovering, database), "recovery_slot", "recovery_pub",
                              chunk_size=100)
    try:
        confirmed = io.advance(0)
        admin.execute("INSERT INTO recovery_t VALUES (1)")
        target = replication.current_insert_lsn(admin)
        terminate(postgres_server, "sparkcoord-cdc-slot")
        recovering.refuse(3)
        assert io.advance(target) >= target > confirmed
        assert recovering.refused == 3
    finally:
        io.close()
        replication.drop_slot(admin, "recovery_slot")


def test_a_readers_connection_waits_for_the_recovering_server(
        database: str, recovering: RecoveringServer) -> None:
    recovering.refuse(3)
    reader = PostgresReader(ReaderConfig(options_via(recovering, database), "s", "p", ()))
    try:
        assert reader._connection().execute("SELECT 1").fetchone() == (1,)
    finally:
        reader.close()
    assert recovering.refused == 3


class UnfinishedStandby(postgres.PostgresServer):
    """A hot standby restored from a base backup of ``primary`` with the WAL of the backup's
    start only: it replays that and waits for the rest, answering 57P03 "not yet accepting
    connections" (it is not consistent before the backup's end); :meth:`finish` hands it
    the rest."""

    def __init__(self, primary: postgres.PostgresServer) -> None:
        super().__init__()
        self.primary = primary
        self._rest: list[Path] = []

    def start(self) -> None:
        postgres._RUNNING.add(self)
        if self._owner is not None:
            os.chown(self.root, *self._owner)
        os.chmod(self.root, 0o700)
        with self.primary.connect(via_socket=True) as conn:
            first, = conn.execute("SELECT pg_walfile_name(pg_backup_start('recovery', true))"
                                  ).fetchone()
            subprocess.run(["cp", "-a", str(self.primary.data), str(self.data)], check=True)
            conn.execute("CREATE TABLE after_the_start (id int)")
            conn.execute("SELECT pg_switch_wal()")
            last, label = conn.execute("SELECT pg_walfile_name(lsn), labelfile FROM "
                                       "pg_backup_stop(false)").fetchone()
        wal = self.data / "pg_wal"
        for path in wal.iterdir():
            if path.is_file():
                path.unlink()
        for name in ("postmaster.pid", "postmaster.opts"):
            (self.data / name).unlink(missing_ok=True)
        source = self.primary.data / "pg_wal"
        shutil.copy2(source / first, wal / first)
        self._rest = [source / n for n in sorted(os.listdir(source)) if first < n <= last]
        assert self._rest, "the backup's end is in a segment after its start"
        (self.data / "backup_label").write_text(label)
        (self.data / "standby.signal").write_text("")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.socket_dir}'\n"
                       "hot_standby = on\nwal_retrieve_retry_interval = '50ms'\n")
        if self._owner is not None:
            subprocess.run(["chown", "-R", f"{self._owner[0]}:{self._owner[1]}", str(self.data)],
                           check=True)
        self._started = True
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-W",
                  "start")

    def finish(self) -> None:
        """Hand the standby the WAL up to the backup's end: it becomes consistent."""
        for path in self._rest:
            target = self.data / "pg_wal" / path.name
            shutil.copy2(path, target.with_suffix(".part"))
            if self._owner is not None:
                os.chown(target.with_suffix(".part"), *self._owner)
            os.rename(target.with_suffix(".part"), target)

    def answer(self) -> str:
        """What the standby answers a connection now."""
        import psycopg

        try:
            psycopg.connect(host=self.host, port=self.port, user=ADMIN_USER,
                            password=ADMIN_PASSWORD, dbname="postgres", connect_timeout=5).close()
        except psycopg.OperationalError as e:
            return str(e)
        return "accepted"


class FinishOnWarning(logging.Handler):
    """Finishes the standby when the source logs that it waits for it (its first refusal)."""

    def __init__(self, standby: UnfinishedStandby) -> None:
        super().__init__(logging.WARNING)
        self.standby = standby
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())
        if "trying again" in record.getMessage():
            self.standby.finish()


def test_a_real_server_not_yet_accepting_connections_while_it_replays_its_wal_is_waited_for(
        ) -> None:
    primary = postgres.PostgresServer(roles=[Role(ADMIN_USER, ADMIN_PASSWORD, "SUPERUSER")])
    with primary, UnfinishedStandby(primary) as standby:
        deadline = time.monotonic() + 60  # the postmaster opens its socket, then recovery starts
        while "not yet accepting connections" not in standby.answer():
            assert time.monotonic() < deadline, standby.answer()
            time.sleep(0.05)
        handler = FinishOnWarning(standby)
        logger = logging.getLogger("sparkcoord.sources.postgres.io.connection")
        logger.addHandler(handler)
        try:
            options = ConnectionOptions.parse(
                f"postgresql://{ADMIN_USER}@127.0.0.1:{standby.port}/postgres",
                {"password": ADMIN_PASSWORD})
            with options.connect(retry_s=60.0) as conn:
                assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        finally:
            logger.removeHandler(handler)
        assert len(handler.seen) == 1
        assert ("FATAL: the database system is not yet accepting connections DETAIL: Consistent "
                "recovery state has not been yet reached.") in handler.seen[0]
