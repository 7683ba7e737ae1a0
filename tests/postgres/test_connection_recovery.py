"""A server that cannot take a session yet is waited for (sparkcoord/sources/postgres/
connection.py rule 4): PostgreSQL answers a startup packet with SQLSTATE 57P03 while it starts,
replays its WAL after a crash (``pg_ctl stop -m immediate`` and a start) or is a standby not yet
consistent, and every place the source connects (the coordinator's planner and slot connections,
the readers) waits through it; a refused login still fails at once.

Which message a real server sends when is a race against its WAL replay, so the server here is
made deterministic: :class:`RecoveringServer` listens on loopback in front of the session's real
server, answers the next ``refuse(n)`` startup packets with the ErrorResponse PostgreSQL 15 sends
(the texts of its postmaster.c), and relays every other connection to the real server byte for
byte.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sparkcoord.sources.postgres.connection import ConnectionOptions, transient_refusal
from sparkcoord.sources.postgres.enumerator import PostgresEnumeratorIO
from sparkcoord.sources.postgres.errors import ConnectionRefused
from sparkcoord.sources.postgres.reader import PostgresReader, ReaderConfig
from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer

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
    from sparkcoord.sources.postgres import replication

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
