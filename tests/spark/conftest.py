"""One local Spark session for the Spark tests: ``local[2,4]`` so that tasks can be retried."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2,4]")
               .appName("sparkcoord-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def executor_password(spark: Any) -> Iterator[None]:
    """PGPASSWORD in the environment of Spark's Python processes started from now on (what
    ``spark.executorEnv.PGPASSWORD`` does; the PostgreSQL source's tests, decision 64)."""
    from tests.postgres_server import ADMIN_PASSWORD

    environment = spark.sparkContext.environment
    environment["PGPASSWORD"] = ADMIN_PASSWORD
    try:
        yield
    finally:
        environment.pop("PGPASSWORD", None)
        from sparkcoord.spark.source import CoordinatedSource

        spark.dataSource.register(CoordinatedSource)  # later jobs: without it
