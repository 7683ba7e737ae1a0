"""A file source's schema when none is given: the first file's, as pyarrow reads it.

Runs in the user's driver program thread, when :class:`~sparkcoord.sources.files.stream.FileStream`
builds a source without ``.schema(...)``: lists the first file and reads its footer (parquet) or
its first MiB of lines (CSV, JSON lines).
"""

from __future__ import annotations

import io
from typing import Any

from sparkcoord.sources.files.lines import read_line_range
from sparkcoord.sources.files.listing import Lister, filesystem
from sparkcoord.sources.files.options import FileSourceOptions


def infer_schema(options: FileSourceOptions) -> Any:
    """The Arrow schema of the first file under ``options.url`` (driver program)."""
    fs, root = filesystem(options.url, options.storage_options)
    first = Lister(fs, root, recursive=options.recursive, glob=options.glob).after("", 1)
    if not first:
        raise ValueError(f"cannot infer the schema of {options.url!r}: it holds no "
                         f"{options.format} file yet; give the schema with .schema(...)")
    path = first[0].path
    if options.format == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as f:
            return pq.read_schema(f)
    with fs.open(path, "rb") as f:
        data = read_line_range(f, 0, min(first[0].size, 1 << 20), first[0].size)
    try:
        if options.format == "json":
            import pyarrow.json as pj

            # a line "null" would crash pyarrow (parsing.py rule 6); it is no record anyway
            lines = [line for line in data.splitlines(keepends=True)
                     if not line.lstrip().startswith(b"null")]
            return pj.read_json(io.BytesIO(b"".join(lines))).schema
        import pyarrow.csv as pc

        read = (pc.ReadOptions() if options.header
                else pc.ReadOptions(autogenerate_column_names=True))
        return pc.read_csv(io.BytesIO(data), read_options=read,
                           parse_options=pc.ParseOptions(delimiter=options.sep)).schema
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no file
        raise ValueError(f"cannot infer the schema of {options.url!r} from its first file "
                         f"{path}: {type(exc).__name__}: {exc}; give the schema with "
                         f".schema(...)") from exc
