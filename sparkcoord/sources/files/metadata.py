"""Rule 7 of :mod:`sparkcoord.sources.files`: Spark's file metadata column ``_metadata``.

Its type (:func:`metadata_field`) is made in the user's driver program thread when
:class:`~sparkcoord.sources.files.stream.FileStream` builds the source, and again by the reader; its
values (:func:`file_url`, :func:`row_group_bytes`, :class:`SplitMetadata`) by the reader, in a
Spark task's thread on an executor, once per split. Functions of their arguments; nothing here
is shared between threads.
"""

from __future__ import annotations

from typing import Any

#: the column of rule 7, under Spark's name for its hidden file metadata column
METADATA_COLUMN = "_metadata"
#: what :func:`file_url` leaves unencoded in a path: what java.net.URI leaves in one (Spark's
#: ``file_path`` is a Hadoop ``Path`` URI), so the same file gives Spark's text
_URI_SAFE = "/!$&'()*+,;=:@-._~"


def metadata_field() -> Any:
    """The ``StructField`` of rule 7: Spark's ``_metadata`` fields, names, types and
    nullability (``file_path``, ``file_name``, ``file_size``, ``file_block_start``,
    ``file_block_length``, ``file_modification_time``), then ``row_group`` (an int, null for
    CSV and JSON). Called by :class:`~sparkcoord.sources.files.stream.FileStream` (driver program
    thread) and by the reader (task thread)."""
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructField(METADATA_COLUMN, StructType([
        StructField("file_path", StringType(), False),
        StructField("file_name", StringType(), False),
        StructField("file_size", LongType(), False),
        StructField("file_block_start", LongType(), False),
        StructField("file_block_length", LongType(), False),
        StructField("file_modification_time", TimestampType(), False),
        StructField("row_group", IntegerType(), True),
    ]), False)


def file_url(url: str, path: str) -> str:
    """Spark's ``file_path`` of a file: ``path`` (as fsspec lists it under the source's
    ``url``) as a percent-encoded URL: ``file:/data/a%20b.json`` for a local file (Spark's
    form, one slash), ``s3://bucket/key`` with the scheme the user wrote (``s3a`` stays
    ``s3a``). A filesystem whose paths drop the host (sftp, ftp) gets it back from ``url``.
    Never any ``user:password@``: it is stripped wherever it came from. Reader (task thread),
    once per split."""
    from urllib.parse import quote, urlsplit, urlunsplit

    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file", "local"):
        return "file:" + quote(path, safe=_URI_SAFE)
    if "://" in path:  # a filesystem whose paths are URLs (http): as it is
        full = path
    elif path.startswith("/"):
        parts = urlsplit(url)
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        full = f"{scheme}://{host}{quote(path, safe=_URI_SAFE)}"
    else:  # object stores: the bucket is the path's first part
        full = f"{scheme}://{quote(path, safe=_URI_SAFE)}"
    parts = urlsplit(full)
    if "@" in parts.netloc:
        full = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return full


def row_group_bytes(row_group: Any) -> tuple[int, int]:
    """Where a parquet row group (``pyarrow`` ``RowGroupMetaData``) lies in its file: the
    offset of its first page and its length up to the end of its last column chunk. Reader
    (task thread), from the footer it read to read the row group."""
    first, last = None, 0
    for i in range(row_group.num_columns):
        chunk = row_group.column(i)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            start = min(start, chunk.dictionary_page_offset)
        first = start if first is None else min(first, start)
        last = max(last, start + chunk.total_compressed_size)
    return (0, 0) if first is None else (first, last - first)


class SplitMetadata:
    """The ``_metadata`` column of one split's record batches (rule 7): one struct value,
    repeated to each batch's length (a C++ fill; the last length is kept, as most batches of a
    split have ``batchRows`` rows). Made by the reader in its task thread, once per split."""

    def __init__(self, arrow_type: Any, value: dict[str, Any]) -> None:
        import pyarrow as pa

        self._pa = pa
        self.scalar = pa.scalar(value, type=arrow_type)
        self._last: Any = None

    def column(self, rows: int) -> Any:
        if self._last is None or len(self._last) != rows:
            self._last = self._pa.repeat(self.scalar, rows)
        return self._last
