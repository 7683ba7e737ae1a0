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


#: The S3 settings a lake sink's storage options may name, by every name a user may know
#: them by (s3fs's, delta-rs's / the AWS environment's, pyiceberg's; case-insensitive), and
#: each library's own name: (fsspec, delta-rs, pyiceberg FileIO). The libraries spell them
#: differently and ignore names they do not know, so a setting given once in one library's
#: spelling would silently not reach the others (the tasks writing to the endpoint, the
#: committer to AWS). ``None``: that library takes it from elsewhere (s3fs and pyarrow take
#: http from the endpoint's scheme). The credentials are here for the committers' direct
#: users (tests, programs without a checkpoint): a lake sink refuses them before this.
_S3_SETTINGS: dict[tuple[str, ...], tuple[str | None, str, str | None]] = {
    ("endpoint_url", "endpoint", "aws_endpoint_url", "aws_endpoint", "aws_endpoint_url_s3",
     "s3.endpoint"): ("endpoint_url", "AWS_ENDPOINT_URL", "s3.endpoint"),
    ("region", "region_name", "aws_region", "aws_default_region", "s3.region"):
        ("client_kwargs.region_name", "AWS_REGION", "s3.region"),
    ("allow_http", "aws_allow_http"): (None, "AWS_ALLOW_HTTP", None),
    ("access_key_id", "aws_access_key_id", "key", "s3.access-key-id"):
        ("key", "AWS_ACCESS_KEY_ID", "s3.access-key-id"),
    ("secret_access_key", "aws_secret_access_key", "secret", "s3.secret-access-key"):
        ("secret", "AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
    ("session_token", "aws_session_token", "token", "s3.session-token"):
        ("token", "AWS_SESSION_TOKEN", "s3.session-token"),
}
_S3_NAMES = {alias: names for aliases, names in _S3_SETTINGS.items() for alias in aliases}
#: which of a setting's names :func:`storage_options_for` gives each library
_LIBRARY = {"fsspec": 0, "delta": 1, "iceberg": 2}


def storage_options_for(library: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A lake sink's storage ``options`` as ``library`` (``fsspec``, ``delta`` or ``iceberg``)
    names them (pure; the driver program thread when a sink is built, a Delta committer on its
    commit worker thread). Rules, so one mapping serves s3fs, delta-rs and pyiceberg's FileIO:

    1. An S3 setting of :data:`_S3_SETTINGS` (endpoint, region, allow_http...), by any of its
       names, becomes the library's name for it; two names of one setting with different
       values are an error. delta-rs refuses an ``http://`` endpoint without ``allow_http``:
       given an http endpoint, it gets ``AWS_ALLOW_HTTP=true`` (the others allow it anyway).
    2. ``fsspec.<name>`` and ``delta.<name>``: ``<name>``, for that library only.
    3. Any other name starting with ``aws_`` is delta-rs's (object_store's configuration
       keys): delta-rs only.
    4. Anything else: fsspec and delta-rs as given (a library ignores names it does not
       know); pyiceberg's FileIO takes only rule 1's (its other properties are the catalog's,
       ``catalog.<key>``).

    delta-rs takes strings only: its values are ``str`` (``true``/``false`` for a bool)."""
    if library not in _LIBRARY:
        raise ValueError(f"storage options for {library!r}: use fsspec, delta or iceberg")
    which = _LIBRARY[library]
    out: dict[str, Any] = {}
    settings: dict[tuple[str | None, str, str | None], tuple[str, Any]] = {}
    for key, value in options.items():
        lowered = key.lower()
        names = _S3_NAMES.get(lowered)
        if names is None and lowered == "client_kwargs" and isinstance(value, Mapping):
            for sub in ("endpoint_url", "region_name"):  # s3fs's own spelling of rule 1
                if sub in value:
                    _setting(settings, _S3_NAMES[sub], f"client_kwargs.{sub}", value[sub])
            rest = {k: v for k, v in value.items() if k not in ("endpoint_url", "region_name")}
            if rest and library == "fsspec":
                out["client_kwargs"] = rest
            continue
        if names is not None:  # rule 1
            _setting(settings, names, key, value)
            continue
        prefix, _, name = key.partition(".")
        if prefix.lower() in ("fsspec", "delta") and name:  # rule 2
            if prefix.lower() == library:
                out[name] = value
        elif lowered.startswith("aws_"):  # rule 3
            if library == "delta":
                out[key] = value
        elif library != "iceberg":  # rule 4
            out[key] = value
    for names, (_, value) in settings.items():
        own = names[which]
        if own is None:
            continue
        if own.startswith("client_kwargs."):
            out.setdefault("client_kwargs", {})[own.partition(".")[2]] = value
        else:
            out[own] = value
    if library == "delta":
        endpoint = settings.get(_S3_NAMES["endpoint_url"])
        if endpoint is not None and str(endpoint[1]).lower().startswith("http://"):
            out.setdefault("AWS_ALLOW_HTTP", "true")  # rule 1
        out = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in out.items()}
    return out


def _setting(settings: dict[Any, tuple[str, Any]], names: Any, key: str, value: Any) -> None:
    """Record ``key``'s value of the setting ``names`` (rule 1), refusing a second name of it
    with another value: which one would win is not obvious. Values are not repeated (one
    could be a credential, given to a committer directly)."""
    seen = settings.get(names)
    if seen is not None and str(seen[1]) != str(value):
        raise ValueError(f"storage options {seen[0]!r} and {key!r} name the same setting with "
                         "different values: give one")
    settings[names] = (key, value)


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

    def committer(self, run_id: str | None = None) -> Any:
        """A committer of the table (``delta.py``, ``iceberg.py``) for one coordinator start
        (its ``run_id``; fresh by default)."""
        if self.kind == "delta":
            from sparkcoord.sinks.delta import DeltaCommitter

            return DeltaCommitter(self.location, self.job_id, self.schema, run_id=run_id,
                                  storage_options=dict(self.delta_options) or None,
                                  fsspec_options=dict(self.storage_options))
        from sparkcoord.sinks.iceberg import IcebergCommitter

        return IcebergCommitter(self.load_catalog(), self.table, self.job_id, self.schema,
                                run_id=run_id)

    def load_catalog(self) -> Any:
        """The Iceberg catalog (any process; pyiceberg reads its environment too)."""
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog_name, **dict(self.catalog))


def _family(kind: Any) -> str:
    import pyarrow as pa

    t = pa.types
    for name, test in (("integer", t.is_integer), ("floating", t.is_floating),
                       ("decimal", t.is_decimal), ("boolean", t.is_boolean),
                       ("date", t.is_date), ("timestamp", t.is_timestamp), ("time", t.is_time),
                       ("struct", t.is_struct), ("map", t.is_map)):
        if test(kind):
            return name
    if t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        return "string"
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_binary_view(kind):
        return "binary"
    if t.is_list(kind) or t.is_large_list(kind) or t.is_list_view(kind):
        return "list"
    return str(kind)


class TableShapeError(ValueError):
    """An existing table's columns are not the ones the sink writes."""


def check_table_schema(table: str, ours: Any, theirs: Any) -> None:
    """Raise naming ``table`` and the columns when an existing table's schema (``theirs``)
    is not the sink's (``ours``): other column names, or a column of another kind (integer,
    string, timestamp... width and time zone aside). The committers call it when they open
    a table that exists: a commit of files of another shape would make every read fail."""
    names, their_names = list(ours.names), list(theirs.names)
    if names != their_names:
        missing = [n for n in their_names if n not in names]
        extra = [n for n in names if n not in their_names]
        raise TableShapeError(
            f"table {table} has columns {their_names}, the DataFrame written {names}"
            + (f" (not written: {missing})" if missing else "")
            + (f" (not in the table: {extra})" if extra else "")
            + ": write a DataFrame with the table's columns, or another table")
    wrong = [f"{n}: {theirs.field(n).type} in the table, {ours.field(n).type} written"
             for n in names if _family(ours.field(n).type) != _family(theirs.field(n).type)]
    if wrong:
        raise TableShapeError(f"table {table}: column types differ ({'; '.join(wrong)})")
