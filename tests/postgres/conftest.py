"""The PostgreSQL source's tests: one real server for the session (tests/postgres_server.py),
a fresh database per test module, and connections as the superuser ``cdc_admin`` or the plain
role ``cdc_plain`` through the source's own connection options."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkcoord.sources.postgres.io.connection import ConnectionOptions
from tests import postgres_server as server_module
from tests.postgres_server import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    PLAIN_PASSWORD,
    PLAIN_USER,
    PostgresServer,
)

#: the session's server (tests/postgres_server.py), a fixture for every test here
postgres_server = server_module.postgres_server


@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of this module's own (so slots, publications and tables never meet); its
    slots are dropped after the module, so the session's server never runs out of them."""
    name = postgres_server.create_database("t_" + request.module.__name__.rsplit(".", 1)[-1])
    yield name
    postgres_server.drop_slots(name)


@pytest.fixture(scope="module")
def admin_options(postgres_server: PostgresServer, database: str) -> ConnectionOptions:
    return ConnectionOptions.parse(postgres_server.url(database, ADMIN_USER),
                                   {"password": ADMIN_PASSWORD})


@pytest.fixture(scope="module")
def plain_options(postgres_server: PostgresServer, database: str) -> ConnectionOptions:
    return ConnectionOptions.parse(postgres_server.url(database, PLAIN_USER),
                                   {"password": PLAIN_PASSWORD})


@pytest.fixture
def admin(admin_options: ConnectionOptions) -> Iterator[Any]:
    """A superuser session with the source's session settings (connection.py rule 5)."""
    conn = admin_options.connect()
    try:
        yield conn
    finally:
        conn.close()
