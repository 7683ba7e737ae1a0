"""A real PostgreSQL 15 server of a program's own: made with ``initdb`` in a directory (a
temporary one unless given), listening on 127.0.0.1 (a free port) and on a unix socket inside
that directory, with logical decoding on (``wal_level=logical``), and stopped and its
directory removed afterwards, whatever happened. The tests' server (tests/postgres_server.py)
and ``sparkcoord demo pipeline`` are this class.

Rules:
  1. The binaries come from ``pg_config --bindir`` or ``/usr/lib/postgresql/15/bin``; when
     neither has ``initdb`` starting fails with what to install (Debian's ``postgresql-15``).
  2. ``initdb`` and ``postgres`` refuse to run as root. Under root every server command runs
     as the ``postgres`` system user (``runuser -u postgres --``) and the server's directory
     belongs to that user; a given directory the ``postgres`` user cannot reach (under a
     directory only root may enter) is refused at start with a ``PermissionError``.
  3. TCP connections need a password (scram-sha-256); the unix socket trusts everyone, so the
     roles and databases are set up through it as the bootstrap superuser. The roles given to
     the constructor are created at start.
  4. :meth:`PostgresServer.stop` stops the server (``pg_ctl stop -m fast``, then ``-m
     immediate``, then SIGKILL of the postmaster) and removes its directory; it is idempotent,
     and it runs at interpreter exit for a server still running then. Use the server as a
     context manager (or ``try``/``finally``) and turn SIGTERM into ``KeyboardInterrupt``
     (:func:`sigterm_as_interrupt`), so a failure, Ctrl-C or a SIGTERM leaves no postgres
     process behind. Only a SIGKILL of the program can leave one.

Durability is off (``fsync``, ``full_page_writes``): a server that does not crash loses
nothing, and it is much faster. ``synchronous_commit`` stays on: logical decoding reads
flushed WAL only, so a reader can peek right after its commit.

Thread model: a server is started, restarted and stopped by one thread (the test session's, the
demo's main thread); :meth:`PostgresServer.connect` and :meth:`PostgresServer.url` from any.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the bootstrap superuser (initdb -U), reached through the trusted unix socket
BOOTSTRAP_USER = "postgres"

SETTINGS = {
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
        "(apt-get install postgresql-15)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Role:
    """A login role created at start: ``attributes`` as ``CREATE ROLE`` takes them
    (``SUPERUSER``, ``REPLICATION``, ...), LOGIN and the password always."""

    name: str
    password: str
    attributes: str = ""


class PostgresServer:
    """One server (module docstring): :meth:`start`, then :meth:`url` and :meth:`connect`
    reach it, :meth:`stop` ends it; ``with PostgresServer(...) as server`` does both."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 roles: Sequence[Role] = ()) -> None:
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
        if root is None:
            self.root = Path(tempfile.mkdtemp(prefix="sparkcoord-pg-"))
        else:
            self.root = Path(root).absolute()
            self.root.mkdir(parents=True, exist_ok=False)
        self.data = self.root / "data"
        self.socket_dir = str(self.root)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.roles = {role.name: role for role in roles}
        self._started = False

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def _reachable(self) -> None:
        """Rule 2: the ``postgres`` user must be able to write its directory."""
        if not self.as_root:
            return
        probe = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-w", str(self.root)],
                               capture_output=True, timeout=30, check=False)
        if probe.returncode != 0:
            raise PermissionError(
                f"running as root, the server runs as the 'postgres' user, who cannot reach "
                f"{self.root} (a directory above it lets only its owner in): pick a directory "
                f"every user may enter")

    def start(self) -> None:
        """initdb, the settings, ``pg_ctl start``, the roles (rules 1-3). The caller's thread."""
        _RUNNING.add(self)
        if self._owner is not None:
            os.chown(self.root, *self._owner)
        self._reachable()
        # only the server's user (and root) may reach the trusted socket; the bootstrap
        # superuser's TCP password is random (a fixed one let any local user in as
        # superuser, and a superuser runs programs: COPY ... FROM PROGRAM)
        os.chmod(self.root, 0o700)
        pwfile = self.root / "bootstrap.pw"
        pwfile.write_text(secrets.token_urlsafe(24) + "\n")
        if self._owner is not None:
            os.chown(pwfile, *self._owner)
        self._run("initdb", "-D", str(self.data), "-U", BOOTSTRAP_USER, "-E", "UTF8",
                  "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256",
                  f"--pwfile={pwfile}", "--no-sync")
        pwfile.unlink()
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# sparkcoord.testing.postgres\n")
            conf.write(f"port = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.socket_dir}'\n")
            for name, value in SETTINGS.items():
                conf.write(f"{name} = {value}\n")
        self._started = True  # from here on, stop() has something to stop
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            for role in self.roles.values():
                password = role.password.replace("'", "''")
                conn.execute(f'CREATE ROLE "{role.name}" LOGIN {role.attributes} '
                             f"PASSWORD '{password}'")

    def restart(self, down_s: float = 0.0, mode: str = "fast") -> None:
        """Stop the server, stay down ``down_s`` seconds, start it again on the same port and
        data: a PostgreSQL restart in the middle of a test (the server's starting thread).
        ``mode`` is ``pg_ctl stop``'s: ``fast`` ends every session and shuts down cleanly;
        ``immediate`` stops every process at once, as a crash does, so the start replays the
        WAL and answers "not yet accepting connections" meanwhile (nothing is lost: only the
        server's processes die, not the machine's page cache)."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"restart mode must be 'fast' or 'immediate', got {mode!r}")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "stop", "-m", mode)
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
        _RUNNING.discard(self)

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
        role = self.roles.get(user)
        return psycopg.connect(host=self.host, port=self.port, dbname=database, user=user,
                               password=role.password if role else None,
                               autocommit=autocommit, **kw)

    def drop_slots(self, database: str) -> None:
        """Drop the replication slots of ``database`` that no session holds (slots are the
        server's, not the database's: ``max_replication_slots`` counts them all)."""
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s AND NOT active",
                                        (database,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

    def create_database(self, name: str, owner: str = BOOTSTRAP_USER) -> str:
        """A fresh database ``name`` (dropped first, with its slots, if a previous run left
        it), owned by ``owner`` so that it can create tables there."""
        with self.connect(BOOTSTRAP_USER, via_socket=True) as conn:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s", (name,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
        return name


#: servers started and not stopped yet (rule 4's interpreter exit)
_RUNNING: set[PostgresServer] = set()


@atexit.register
def _stop_leftovers() -> None:  # rule 4, for a program that never reached its stop()
    for server in list(_RUNNING):
        server.stop()


def _terminated(signum: int, frame: Any) -> None:
    # what Python does on Ctrl-C: unwind, running every finally (rule 4)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM (a CI timeout, ``kill``) raises ``KeyboardInterrupt`` in the main
    thread, as Ctrl-C does, so ``finally`` blocks stop the server (rule 4). Does nothing off
    the main thread or when SIGTERM already has a handler."""
    previous = None
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
