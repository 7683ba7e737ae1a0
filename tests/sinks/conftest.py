"""Fixtures of the lake sink tests: a schema, rows that say which epoch wrote them, tables."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
                    ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC"))])


def rows(epoch: int, n: int, start: int = 0) -> pa.Table:
    """``n`` rows of ``epoch``, ids ``epoch * 10_000 + start ..``: a duplicate shows."""
    ids = [epoch * 10_000 + start + i for i in range(n)]
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    return pa.table({
        "id": ids,
        "name": [None if i % 7 == 3 else f"n{i % 13}" for i in ids],
        "score": [i / 4 for i in ids],
        "day": [datetime.date(2024, 1, 1) + datetime.timedelta(days=i % 30) for i in ids],
        "at": [base + datetime.timedelta(microseconds=1234 * i + 1) for i in ids],
    }, schema=SCHEMA)


@pytest.fixture
def catalog(tmp_path: Any) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("sinks", uri=f"sqlite:///{tmp_path}/catalog.db",
                     warehouse=f"file://{tmp_path}/warehouse")
    cat.create_namespace("lake")
    return cat


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from tests.s3_server import S3Server

    server = S3Server()
    try:
        yield server
    finally:
        server.stop()
