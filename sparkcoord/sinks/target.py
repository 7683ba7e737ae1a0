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

from sparkcoord.core.encoding import encoded
from sparkcoord.sinks.compaction import DEFAULT_MAX_FILES
from sparkcoord.sinks.files import check_job_id
from sparkcoord.sinks.tables import (  # re-exported: their home before sinks/tables.py
    TableCommitter,
    TableShapeError,
    check_table_schema,
    storage_options_for,
)

FORMATS = ("delta", "iceberg")
MODES = ("append", "merge")

_SECRET = re.compile(r"secret|password|passwd|token|credential|authorization|bearer|"
                     r"private|(^|[_.-])(sas|key)($|[_.-])|access[_.-]?key|key[_.-]?id|"
                     r"account[_.-]?key|master[_.-]?key|sas[_.-]?key|service[_.-]?account",
                     re.IGNORECASE)
#: a URL with a password in it (``scheme://user:password@host``)
_USERINFO = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def refuse_credentials(options: Mapping[str, Any], what: str) -> None:
    """Raise naming the first option of ``options`` that looks like a credential, by its name
    or by a password in a URL value (driver program thread, when a sink is built): the option
    would be kept in the checkpoint. The value is never repeated."""
    for key, value in options.items():
        if isinstance(value, Mapping):  # fsspec's nested options (``client_kwargs``)
            refuse_credentials({f"{key}.{k}": v for k, v in value.items()}, what)
            continue
        if _SECRET.search(str(key)) or _USERINFO.search(str(value)):
            raise ValueError(
                f"{what} option {key!r} looks like a credential: a lake sink keeps its options "
                "in the job's checkpoint directory, so credentials come from the environment of "
                "every Spark process instead (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                "AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_APPLICATION_CREDENTIALS, a profile, an "
                "instance role; a catalog's own configuration file and environment variables)")


@encoded("sinks.SinkTarget")
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
    #: fsspec's options of ``location``, without credentials: the tasks write and the
    #: coordinator lists and deletes data files with them (``storage_options_for``)
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    #: delta-rs's options of ``location`` (the same settings in its names), without
    #: credentials: the Delta committer's
    delta_options: Mapping[str, str] = field(default_factory=dict)
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
    #: rewrite small files of earlier epochs into files of the target size
    #: (``compaction.py``; mode ``append``), at most this many files into one
    compaction: bool = False
    compaction_max_files: int = DEFAULT_MAX_FILES

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
        if self.compaction and self.mode != "append":
            raise ValueError(f"{self.name}: option 'compaction' works in mode 'append' only "
                             f"(in mode {self.mode!r} the table format's own writer makes "
                             f"the files: compact them with its optimize)")
        if self.compaction_max_files < 2:
            raise ValueError(f"{self.name}: option 'compactionMaxFiles' must be >= 2, got "
                             f"{self.compaction_max_files}")

    @property
    def rows_schema(self) -> Any:
        """The schema of the rows the tasks write."""
        return self.schema if self.input_schema is None else self.input_schema

    @property
    def name(self) -> str:
        """The table as errors and logs name it."""
        return f"{self.kind} table {self.table}"

    def committer(self, run_id: str | None = None) -> TableCommitter:
        """A committer of the table (``formats/delta/``, ``formats/iceberg/``) for one
        coordinator start (its ``run_id``; fresh by default)."""
        if self.kind == "delta":
            from sparkcoord.sinks.formats.delta.commit import DeltaCommitter

            return DeltaCommitter(self.location, self.job_id, self.schema, run_id=run_id,
                                  storage_options=dict(self.delta_options) or None,
                                  fsspec_options=dict(self.storage_options))
        from sparkcoord.sinks.formats.iceberg.commit import IcebergCommitter

        return IcebergCommitter(self.load_catalog(), self.table, self.job_id, self.schema,
                                run_id=run_id)

    def load_catalog(self) -> Any:
        """The Iceberg catalog (any process; pyiceberg reads its environment too)."""
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog_name, **dict(self.catalog))


__all__ = ["FORMATS", "MODES", "SinkTarget", "TableCommitter", "TableShapeError",
           "check_table_schema", "refuse_credentials", "storage_options_for"]
