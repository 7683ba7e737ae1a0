"""Where a lake sink writes: one Delta or Iceberg table, described by picklable values.

A :class:`SinkTarget` travels to the coordinator (in the source's runner process) and to every
task, so it holds no credential (the job's checkpoint directory keeps it: ``attached.pkl``).
Credentials of object stores and catalogs come from each process's environment
(``AWS_ACCESS_KEY_ID`` and the like, which fsspec, delta-rs and pyiceberg read themselves);
:func:`refuse_credentials` turns such an option away with an error that names it and says so.

Thread model: none (values); the committers it makes are used on one thread each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.sinks.files import check_job_id

FORMATS = ("delta", "iceberg")
MODES = ("append", "merge")

_SECRET = re.compile(r"secret|password|passwd|token|credential|access[_.-]?key|key[_.-]?id|"
                     r"session[_.-]?key|private", re.IGNORECASE)


def refuse_credentials(options: Mapping[str, Any], what: str) -> None:
    """Raise naming the first option of ``options`` that looks like a credential (driver
    program thread, when a sink is built): the option would be kept in the checkpoint."""
    for key in options:
        if _SECRET.search(str(key)):
            raise ValueError(
                f"{what} option {key!r} looks like a credential: a lake sink keeps its options "
                "in the job's checkpoint directory, so credentials come from the environment of "
                "every Spark process instead (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a "
                "profile, an instance role; the catalog's own environment variables)")


@dataclass(frozen=True)
class SinkTarget:
    """One table and how the sink writes it."""

    #: ``delta`` or ``iceberg``
    kind: str
    #: Delta: the table's URI; Iceberg: the table's identifier in the catalog (``db.table``)
    table: str
    job_id: str
    #: the table's ``pyarrow.Schema``: the DataFrame's (mode ``append``), the fields of its
    #: ``after`` struct (mode ``merge``)
    schema: Any
    #: where the tasks write data files: the Delta table's URI, the Iceberg table's location
    location: str
    #: fsspec (and delta-rs) options of ``location``, without credentials
    storage_options: Mapping[str, str] = field(default_factory=dict)
    #: Iceberg: the catalog's name and properties for ``pyiceberg.catalog.load_catalog``
    catalog_name: str = "default"
    catalog: Mapping[str, str] = field(default_factory=dict)
    target_file_bytes: int = 128 << 20
    #: ``append`` (the rows are the table's) or ``merge`` (the rows are a change stream,
    #: applied by key: ``changes.py``)
    mode: str = "append"
    #: the ``pyarrow.Schema`` of the rows the tasks write (None: ``schema``)
    input_schema: Any = None
    #: mode ``merge``: the key's column names
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ValueError(f"a lake sink writes {' or '.join(FORMATS)}, not {self.kind!r}")
        check_job_id(self.job_id)
        if self.target_file_bytes <= 0:
            raise ValueError(f"targetFileSize must be > 0, got {self.target_file_bytes}")
        if self.mode not in MODES:
            raise ValueError(f"option 'mode': use {' or '.join(MODES)}, not {self.mode!r}")
        if self.mode == "merge" and not self.keys:
            raise ValueError(f"{self.name}: mode 'merge' needs the key's columns")

    @property
    def rows_schema(self) -> Any:
        """The schema of the rows the tasks write."""
        return self.schema if self.input_schema is None else self.input_schema

    @property
    def name(self) -> str:
        """The table as errors and logs name it."""
        return f"{self.kind} table {self.table}"

    def committer(self, run_id: str | None = None) -> Any:
        """A committer of the table (``delta.py``, ``iceberg.py``) for one coordinator start
        (its ``run_id``; fresh by default)."""
        if self.kind == "delta":
            from sparkcoord.sinks.delta import DeltaCommitter

            return DeltaCommitter(self.location, self.job_id, self.schema, run_id=run_id,
                                  storage_options=dict(self.storage_options) or None)
        from sparkcoord.sinks.iceberg import IcebergCommitter

        return IcebergCommitter(self.load_catalog(), self.table, self.job_id, self.schema,
                                run_id=run_id)

    def load_catalog(self) -> Any:
        """The Iceberg catalog (any process; pyiceberg reads its environment too)."""
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog_name, **dict(self.catalog))
