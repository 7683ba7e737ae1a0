"""What the driver program may ask of its ``SparkSession``, classic or Spark Connect.

A Spark Connect session (``SparkSession.builder.remote("sc://...")``) is a thin client: it has
no ``sparkContext`` and no JVM, and its working directory is not the server's. The job runner
therefore reads settings through ``spark.conf`` only and resolves nothing against a working
directory it cannot see (docs/decisions/042-spark-connect.md). Thread model: the user's driver
program thread.
"""

from __future__ import annotations

import os
from typing import Any


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM on this side)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # the Connect client's extra dependencies are not installed
        return False
    return isinstance(spark, ConnectSession)


def session_setting(spark: Any, key: str, default: str) -> str:
    """A Spark setting as the session sees it, through ``spark.conf`` (both kinds of session;
    a static setting such as ``spark.speculation`` reads the same)."""
    value = spark.conf.get(key, default)
    return default if value is None else str(value)


def resolve_location(spark: Any, location: str, what: str) -> str:
    """``location`` as every process of the job must see it: a URL unchanged (without a
    trailing slash); a relative path made absolute against this program's working directory
    on a classic session, where the driver program is the driver. Through Spark Connect the
    server resolves paths against its own working directory, which a client cannot know, so a
    relative path is refused naming ``what`` it was meant for."""
    if "://" in location:
        return location.rstrip("/")
    if os.path.isabs(location):
        return os.path.normpath(location)
    if is_connect(spark):
        raise ValueError(
            f"{what} {location!r} is a relative path, but this is a Spark Connect session: "
            f"the server (its source runner and executors) would resolve it against its own "
            f"working directory, which this client cannot see. Pass an absolute path on "
            f"storage the server reaches, or a URL")
    return os.path.abspath(location)


def struct_of(spark: Any, schema: Any) -> Any:
    """The ``StructType`` that ``spark.createDataFrame([], schema).schema`` gives for
    ``schema`` (a ``StructType`` is returned as it is; a DDL string such as ``"id long, name
    string"`` is parsed). On a classic session a struct DDL is parsed with one call to Spark's
    parser (``DataType.fromDDL``, ~3 ms) instead of making an empty DataFrame (~20 ms, on every
    source a program builds); anything else, and a Spark Connect session, go through
    ``createDataFrame`` as before (a string with a char or varchar column too: it is refused
    there). Driver program thread."""
    from pyspark.sql.types import DataType, StructType
    from pyspark.sql.utils import is_remote

    if isinstance(schema, StructType):
        return schema
    # fromDDL parses through the active Connect session once any Connect session was made in
    # this process (is_remote): then only createDataFrame is sure to ask ``spark``
    if isinstance(schema, str) and not is_connect(spark) and not is_remote():
        parsed = DataType.fromDDL(schema)
        # createDataFrame refuses char and varchar columns: such a string fails there, as before
        if isinstance(parsed, StructType) and not _has_char_type(parsed):
            return parsed
    return spark.createDataFrame([], schema).schema


def _has_char_type(data_type: Any) -> bool:
    from pyspark.sql.types import ArrayType, CharType, MapType, StructType, VarcharType

    if isinstance(data_type, (CharType, VarcharType)):
        return True
    if isinstance(data_type, StructType):
        return any(_has_char_type(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _has_char_type(data_type.elementType)
    if isinstance(data_type, MapType):
        return _has_char_type(data_type.keyType) or _has_char_type(data_type.valueType)
    return False
