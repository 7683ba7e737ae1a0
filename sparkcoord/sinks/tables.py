"""What both table formats share, and what the sink's coordinator asks of a format: the
storage options each library names its own way, the check of an existing table's shape, and
the :class:`TableCommitter` protocol that the formats implement (``formats/delta/``,
``formats/iceberg/``).

It imports neither format, and both import it, so ``target.py`` (which picks a format) sits
above the formats and the formats above this module: no import circle.

Thread model: pure functions and a protocol; a committer is used on one thread (the sink's
commit worker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from sparkcoord.sinks.changes import Reduced
from sparkcoord.sinks.fencing import NO_EPOCH, Decision
from sparkcoord.sinks.files import DataFile


class TableCommitter(Protocol):
    """One table's committer for one coordinator start (``SinkTarget.committer``), called on
    the sink coordinator's commit worker thread (``coordinator.py`` rules 3-10)."""

    #: the compaction swaps the last commit left out (an input no longer in the table)
    left_out: list[Any]

    def open(self, last_committed: int = NO_EPOCH, pending: Iterable[int] = ()) -> int:
        """Check the table against the restored checkpoint (fencing rule 2); the table's
        newest epoch of this job."""
        ...

    def prepare_table(self) -> str:
        """The table's location, where the tasks write, the table made first where its
        format needs it before the tasks write (Iceberg). The driver program, when a sink is
        built."""
        ...

    def commit(self, epoch: int, files: Sequence[DataFile],
               swaps: Sequence[Any] = ()) -> Decision:
        """Mode ``append``: commit ``epoch``'s files (and compaction swaps) once."""
        ...

    def merge(self, epoch: int, load: Callable[[], Reduced], keys: Sequence[str]
              ) -> Decision:
        """Mode ``merge``: apply ``epoch``'s reduced changes by ``keys`` once."""
        ...

    def table_epoch(self) -> int:
        """The newest epoch of this job the table holds."""
        ...

    def referenced_paths(self) -> set[str]:
        """The data files the table references (relative to its location)."""
        ...


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
