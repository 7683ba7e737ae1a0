"""A real PostgreSQL 15 server for tests: made with ``initdb`` in a temporary directory, listening
on 127.0.0.1 (a free port) and on a unix socket inside that directory, with logical decoding on
(``wal_level=logical``), and stopped and removed afterwards, whatever the tests did.

Rules:
  1. The binaries come from ``pg_config --bindir`` or ``/usr/lib/postgresql/15/bin``; when
     neither has ``initdb`` the fixture fails with what to install (Debian's ``postgresql-15``,
     which ``.ci/run`` installs).
  2. ``initdb`` and ``postgres`` refuse to run as root. Under root (here and in CI) every server
     command runs as the ``postgres`` system user (``runuser -u postgres --``) and the
     temporary directory belongs to that user.
  3. TCP connections need a password (scram-sha-256); the unix socket trusts everyone, so the
     tests set up roles and databases through it as the bootstrap superuser.
  4. The server is stopped (``pg_ctl stop -m fast``, then ``-m immediate``, then SIGKILL of the
     postmaster) in a ``finally`` and at interpreter exit, so a failed test, a failed setup
     or an interrupted run (Ctrl-C, or SIGTERM: a CI timeout, which the fixture turns into a
     KeyboardInterrupt while the server runs) leaves no postgres process behind. Only a
     SIGKILL of the test process can leave one.

Durability is off (``fsync``, ``full_page_writes``): a test server loses nothing that a test
needs when it does not crash, and it is much faster. ``synchronous_commit`` stays on: logical
decoding reads flushed WAL only, so a test can peek right after its commit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: the bootstrap superuser (initdb -U), reached through the trusted unix socket
BOOTSTRAP_USER = "postgres"
#: a superuser with a password, over TCP
ADMIN_USER, ADMIN_PASSWORD = "cdc_admin", "s3cr3t-pw"
#: a role without REPLICATION and without superuser, over TCP
PLAIN_USER, PLAIN_PASSWORD = "cdc_plain", "s3cr3t-pw-plain"

_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "10",
    "max_connections": "40",
    "shared_buffers": "32MB",
    "fsync": "off",
    "full_page_writes": "off",
    "TimeZone": "'UTC'",
    "log_min_messages": "warning",
}


def postgres_bindir() -> Path:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` are (rule 1)."""
    candidates = []
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             check=True, timeout=10)
        candidates.append(Path(out.stdout.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    candidates.append(Path("/usr/lib/postgresql/15/bin"))
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: looked in "
        f"{', '.join(str(c) for c in candidates)}. Install Debian's postgresql-15 "
        "(apt-get install postgresql-15; .ci/run does this when initdb is missing)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Role:
    name: str
    password: str


class PostgresServer:
    """One running server (module docstring). ``url()`` and ``connect()`` reach it."""

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.as_root = os.geteuid() == 0
        self._owner: tuple[int, int] | None = None
        if self.as_root:
            import pwd

            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, and there is no 'postgres' system user to "
                                   "run initdb and postgres as (they refuse root)") from None
            self._owner = (entry.pw_uid, entry.pw_gid)
        self.root = Path(tempfile.mkdtemp(prefix="sparkcoord-pg-"))
        self.data = self.root / "data"
        self.socket_dir = str(self.root)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.admin = Role(ADMIN_USER, ADMIN_PASSWORD)
        self.plain = Role(PLAIN_USER, PLAIN_PASSWORD)
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}): "
                               f"{result.stdout}{result.stderr}{self._log_tail()}")
        return result

    def _log_tail(self) -> str:
        log = self.root / "server.log"
        if not log.exists():
            return ""
        return "\nserver log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])

    def start(self) -> None:
        if self._owner is not None:
            os.chown(self.root, *self._owner)
        pwfile = self.root / "bootstrap.pw"
        pwfile.write_text("bootstrap-pw\n")
        if self._owner is not None:
            os.chown(pwfile, *self._owner)
        self._run("initdb", "-D", str(self.data), "-U", BOOTSTRAP_USER, "-E", "UTF8",
                  "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256",
                  f"--pwfile={pwfile}", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# sparkcoord tests\n")
            conf.write(f"port = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.socket_dir}'\n")
            for name, value in _SETTINGS.items():
                conf.write(f"{name} = {value}\n")
        self._started = True  # from here on, stop() has something to stop
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            conn.execute(f"CREATE ROLE {ADMIN_USER} LOGIN SUPERUSER PASSWORD '{ADMIN_PASSWORD}'")
            conn.execute(f"CREATE ROLE {PLAIN_USER} LOGIN PASSWORD '{PLAIN_PASSWORD}'")

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (fast: every session is ended), stay down ``down_s`` seconds, start
        it again on the same port and data: a PostgreSQL restart in the middle of a test."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "stop", "-m", "fast")
        time.sleep(down_s)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Rule 4: fast, then immediate, then SIGKILL; then the directory goes. Idempotent."""
        if self._started and self.data.exists():
            for mode in ("fast", "immediate"):
                try:
                    self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "30", "stop",
                              "-m", mode, timeout=60)
                    break
                except (RuntimeError, subprocess.SubprocessError):
                    continue
            else:
                self._kill_postmaster()
        self._started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        pidfile = self.data / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    # -- reaching it ----------------------------------------------------------------------

    def url(self, database: str, user: str | None = None, password: str | None = None) -> str:
        """``postgresql://user[:password]@127.0.0.1:port/database``."""
        who = user or ""
        if password is not None:
            who += f":{password}"
        return f"postgresql://{who}{'@' if who else ''}{self.host}:{self.port}/{database}"

    def connect(self, user: str = BOOTSTRAP_USER, database: str = "postgres", *,
                via_socket: bool = False, autocommit: bool = True, **kw: Any) -> Any:
        """A psycopg connection: over the unix socket (trusted; always for the bootstrap
        superuser, who has no password over TCP) or TCP with the role's password."""
        import psycopg

        if via_socket or user == BOOTSTRAP_USER:
            return psycopg.connect(host=self.socket_dir, port=self.port, dbname=database,
                                   user=user, autocommit=autocommit, **kw)
        password = {ADMIN_USER: ADMIN_PASSWORD, PLAIN_USER: PLAIN_PASSWORD}.get(user)
        return psycopg.connect(host=self.host, port=self.port, dbname=database, user=user,
                               password=password, autocommit=autocommit, **kw)

    def drop_slots(self, database: str) -> None:
        """Drop the replication slots of ``database`` that no session holds (slots are the
        server's, not the database's: ``max_replication_slots`` counts them all)."""
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s AND NOT active",
                                        (database,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

    def create_database(self, name: str) -> str:
        """A fresh database ``name`` (dropped first if a previous run left it), owned by the
        plain role so that it can create tables there."""
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s", (name,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}" OWNER {PLAIN_USER}')
        return name


_RUNNING: list[PostgresServer] = []


@atexit.register
def _stop_leftovers() -> None:  # rule 4, for a run that never reached the fixture's teardown
    for server in list(_RUNNING):
        server.stop()


def _terminated(signum: int, frame: Any) -> None:
    # what pytest does on Ctrl-C: end the session, running every teardown (rule 4)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL for the whole test session (module docstring)."""
    server = PostgresServer()
    _RUNNING.append(server)
    previous = None
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        _RUNNING.remove(server)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
