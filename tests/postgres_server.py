"""A real PostgreSQL 15 server for tests: ``sparkcoord.testing.postgres.PostgresServer`` (made
with ``initdb`` in a temporary directory, on 127.0.0.1 and a unix socket, ``wal_level=logical``,
as the ``postgres`` user when run as root, stopped and removed afterwards whatever the tests
did; its rules are there) with the tests' two roles, and the session fixture.

  * The roles: ``cdc_admin``, a superuser with a password, and ``cdc_plain``, without
    REPLICATION and without superuser, both over TCP; the bootstrap superuser ``postgres``
    through the trusted unix socket. :meth:`PostgresServer.create_database` makes databases
    owned by ``cdc_plain``.
  * The fixture stops the server in a ``finally``; a SIGTERM (a CI timeout) becomes a
    KeyboardInterrupt while the server runs, so pytest ends the session running every teardown.
    The binaries: ``pg_config --bindir`` or ``/usr/lib/postgresql/15/bin``; without them the
    fixture fails with what to install (Debian's ``postgresql-15``, which ``.ci/run``
    installs).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkcoord.testing import postgres
from sparkcoord.testing.postgres import (
    BOOTSTRAP_USER,
    Role,
    free_port,
    postgres_bindir,
    sigterm_as_interrupt,
)

__all__ = ["ADMIN_PASSWORD", "ADMIN_USER", "BOOTSTRAP_USER", "PLAIN_PASSWORD", "PLAIN_USER",
           "PostgresServer", "Role", "free_port", "postgres_bindir", "postgres_server"]

#: a superuser with a password, over TCP
ADMIN_USER, ADMIN_PASSWORD = "cdc_admin", "s3cr3t-pw"
#: a role without REPLICATION and without superuser, over TCP
PLAIN_USER, PLAIN_PASSWORD = "cdc_plain", "s3cr3t-pw-plain"


class PostgresServer(postgres.PostgresServer):
    """The tests' server: a temporary directory, the two roles (module docstring)."""

    def __init__(self) -> None:
        self.admin = Role(ADMIN_USER, ADMIN_PASSWORD, "SUPERUSER")
        self.plain = Role(PLAIN_USER, PLAIN_PASSWORD)
        super().__init__(roles=[self.admin, self.plain])

    def create_database(self, name: str, owner: str = PLAIN_USER) -> str:
        """A fresh database ``name`` (dropped first if a previous run left it), owned by the
        plain role so that it can create tables there."""
        return super().create_database(name, owner)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL for the whole test session (module docstring)."""
    with sigterm_as_interrupt(), PostgresServer() as server:
        yield server
