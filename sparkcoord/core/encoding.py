"""Versioned encodings of the library's values in a checkpoint, and the one way to read them
back.

A checkpoint holds pickles of library values: coordinator states, subtask states, the
events, requests and answers in its logs, the specs in ``attached.pkl``. A plain pickle names
a class by its module path and restores its ``__dict__``, so moving a class or changing its
fields would make a checkpoint written before the change unreadable: an upgrade of sparkcoord
would break a running pipeline. Flink versions every serializer (``SimpleVersionedSerializer``,
one ``case`` per old version); here each library class whose instances a checkpoint holds is
*encoded*.

Rules:
  1. An encoded class is registered under a stable name (``"sinks.SinkState"``) and a version
     (:func:`encoded`). Its pickle is ``_decoded(name, version, fields)``: the fields by name
     (``dataclasses.fields``), never the class's module path, so the class can move or be
     renamed without changing what a checkpoint holds. ``sparkcoord.core.encoding._decoded``
     is the one library path such a pickle names; it never moves.
  2. A change to an encoded class's fields (added, removed, renamed, another meaning) adds a
     version: the class's ``version`` goes up by one and ``upgrades`` gains the function that
     turns the fields of the version before into the new one's. A version is never changed
     or removed. ``tests/fixtures/encodings.json`` lists every name's version and fields, and
     a test fails when the fields change without a new version.
  3. A field the fields of a pickle lack (written before the field existed, where no upgrade
     sets it) takes the field's default; a missing field without one is a
     :class:`~sparkcoord.core.errors.CorruptRecord` naming the class and the field.
  4. Pickles written before this module (sparkcoord 0.1.0; ``tests/fixtures/checkpoints``
     holds such checkpoints) name classes by module path and restore their ``__dict__`` (or
     slots): an encoded class takes those as the fields of its version 1, through
     ``__setstate__``. :data:`MOVED` maps each module path a class had in a released version
     to where it is now; every checkpoint pickle is read with :func:`loads`, whose
     unpickler looks names up there first. Moving a class that an old pickle names adds a
     line to :data:`MOVED`.
  5. A pickle naming an unknown encoded name, or a version newer than the code's, fails with
     :class:`EncodingTooNew`: a checkpoint written by a newer sparkcoord, named as such.
  6. A log item (an event, a request, an answer) that a retry or a replay sends again is the
     same item when its bytes equal the logged ones or, where they differ, when the two
     decode to values this code encodes to the same bytes (:func:`same_value`): an upgrade between the two runs may change
     an encoding, never a value (``core/histories.py`` rule 1; the inbox compares outside its
     lock: ``runtime/inbox.py`` rule 6).

Thread model: the registry is filled at import time (class decorators); encoding and decoding
run on any thread.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sparkcoord.core.errors import CorruptRecord

C = TypeVar("C", bound=type)

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


class EncodingTooNew(CorruptRecord):
    """A checkpoint names an encoding this sparkcoord does not know (rule 5)."""


@dataclasses.dataclass(frozen=True)
class Encoding:
    """One encoded class: its stable name, its current version, its upgrades (rule 2)."""

    name: str
    cls: type
    version: int
    #: version v -> the function turning the fields of v into those of v + 1
    upgrades: Mapping[int, Upgrade]
    #: a class that is not a dataclass: its own ``__setstate__``, which takes the fields
    restore: Callable[[Any, dict[str, Any]], None] | None = None
    #: the fields of version 1 in order (rule 4)
    first_fields: tuple[str, ...] = ()

    def field_names(self) -> tuple[str, ...]:
        """The fields of the current version (a class that is not a dataclass: none named)."""
        if self.restore is not None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.cls))


#: stable name -> its encoding (rule 1)
REGISTRY: dict[str, Encoding] = {}

#: rule 4: "module:QualName" a released sparkcoord pickled -> "module:QualName" now
MOVED: dict[str, str] = {}

#: rule 1: where each library encoding is registered, imported on first use: a process that
#: reads a checkpoint (``sparkcoord inspect --decode``, a user's script) need not have imported
#: the sources and sinks first. A test checks it lists every library encoding.
HOMES: dict[str, str] = {
    "committer.LedgerState": "sparkcoord.committer.ledger",
    "core.BatchRequested": "sparkcoord.core.control",
    "files.FileDiscoveryState": "sparkcoord.sources.files.discovery",
    "files.FileSplit": "sparkcoord.sources.files.split",
    "postgres.CdcEnumeratorState": "sparkcoord.sources.postgres.planning",
    "postgres.ChunkMap": "sparkcoord.sources.postgres.core.watermarks",
    "postgres.ChunkProgress": "sparkcoord.sources.postgres.core.watermarks",
    "postgres.NextChunk": "sparkcoord.sources.postgres.core.splits",
    "postgres.NextStreamRead": "sparkcoord.sources.postgres.core.splits",
    "postgres.PlannerState": "sparkcoord.sources.postgres.core.chunks",
    "postgres.PlanningState": "sparkcoord.sources.postgres.planning",
    "postgres.PostgresReaderState": "sparkcoord.sources.postgres.reader",
    "postgres.SnapshotChunk": "sparkcoord.sources.postgres.core.splits",
    "postgres.StagedChunk": "sparkcoord.sources.postgres.core.splits",
    "postgres.StreamBound": "sparkcoord.sources.postgres.core.splits",
    "postgres.StreamFilter": "sparkcoord.sources.postgres.core.watermarks",
    "postgres.StreamPosition": "sparkcoord.sources.postgres.core.watermarks",
    "postgres.StreamSplit": "sparkcoord.sources.postgres.core.splits",
    "postgres.TableName": "sparkcoord.sources.postgres.core.names",
    "sinks.ColumnStats": "sparkcoord.sinks.files",
    "sinks.CompactionAssigned": "sparkcoord.sinks.compaction",
    "sinks.CompactionState": "sparkcoord.sinks.compaction",
    "sinks.DataFile": "sparkcoord.sinks.files",
    "sinks.FileWritten": "sparkcoord.sinks.coordinator",
    "sinks.FilesCompacted": "sparkcoord.sinks.compaction",
    "sinks.SinkState": "sparkcoord.sinks.coordinator",
    "sinks.SinkTarget": "sparkcoord.sinks.target",
    "sources.AlignmentDecision": "sparkcoord.sources.alignment",
    "sources.AlignmentState": "sparkcoord.sources.alignment",
    "sources.BacklogState": "sparkcoord.sources.backlog",
    "sources.EnumeratorState": "sparkcoord.sources.state",
    "sources.NextSplit": "sparkcoord.sources.splits",
    "sources.NoSplitNow": "sparkcoord.sources.splits",
    "sources.ReaderState": "sparkcoord.sources.reader",
    "sources.SeenFiles": "sparkcoord.sources.files.seen",
    "sources.Split": "sparkcoord.sources.splits",
    "sources.SplitAlignmentState": "sparkcoord.sources.alignment",
    "sources.WatermarkReport": "sparkcoord.sources.alignment",
    "spark.OperatorSpec": "sparkcoord.spark.spec",
}


def encoded(name: str, version: int = 1, upgrades: Mapping[int, Upgrade] | None = None,
            first_fields: tuple[str, ...] | None = None) -> Callable[[C], C]:
    """Class decorator (above ``@dataclass``): register the class under ``name`` at
    ``version`` (rules 1-2). A dataclass is encoded by its fields; any other class by the
    dict its ``__getstate__`` returns and its ``__setstate__`` takes. Runs at import time of
    the class's module. ``first_fields``: from version 2 on, the fields of version 1 in their
    order (a 0.1.0 pickle of a frozen dataclass with slots holds its values by position)."""
    steps = dict(upgrades or {})
    if version > 1 and first_fields is None:
        raise ValueError(f"encoding {name!r} version {version}: give first_fields, the "
                         f"fields of version 1 in order (rule 4)")
    missing = [v for v in range(1, version) if v not in steps]
    if missing:
        raise ValueError(f"encoding {name!r} version {version}: no upgrade from version(s) "
                         f"{missing}")

    def register(cls: C) -> C:
        known = REGISTRY.get(name)
        if known is not None and known.cls is not cls:
            raise ValueError(f"encoding name {name!r} is taken by {known.cls.__qualname__}")
        plain = not dataclasses.is_dataclass(cls)
        own_setstate = cls.__dict__.get("__setstate__") if plain else None
        if plain and (own_setstate is None or "__getstate__" not in cls.__dict__):
            raise TypeError(f"encoding {name!r}: {cls.__qualname__} is neither a dataclass "
                            f"nor defines __getstate__ and __setstate__")
        fields = () if plain else tuple(f.name for f in dataclasses.fields(cls))
        encoding = Encoding(name, cls, version, steps, own_setstate,
                            first_fields if first_fields is not None else fields)
        REGISTRY[name] = encoding

        def __reduce_ex__(self: Any, protocol: Any) -> Any:
            if type(self) is not cls:  # a subclass of someone else's: pickled as before
                return object.__reduce_ex__(self, protocol)
            state = self.__getstate__() if plain else {f: getattr(self, f) for f in fields}
            return (_decoded, (name, version, state))

        def __setstate__(self: Any, state: Any) -> None:
            if plain:
                given = dict(state or {})
            elif type(self) is cls:
                given = _state_fields(encoding.first_fields, state)
            else:
                given = _state_fields(tuple(f.name for f in dataclasses.fields(self)), state)
            if type(self) is not cls:
                if own_setstate is not None:
                    own_setstate(self, given)
                    return
                for key, value in given.items():
                    object.__setattr__(self, key, value)
                return
            # rule 4: a pickle of sparkcoord 0.1.0, its state the fields of version 1
            _fill(self, encoding, _upgraded(encoding, 1, given))

        cls.__reduce_ex__ = __reduce_ex__  # type: ignore[assignment,method-assign]
        cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
        return cls
    return register


def _state_fields(names: tuple[str, ...], state: Any) -> dict[str, Any]:
    """The fields a plain pickle's state holds: ``__dict__``; ``(__dict__, slots)``; or, for
    a frozen dataclass with slots, the list of its field values in the order ``names``."""
    if isinstance(state, list):
        return dict(zip(names, state, strict=False))
    if isinstance(state, tuple) and len(state) == 2:
        return {**(state[0] or {}), **(state[1] or {})}
    return dict(state or {})


def _upgraded(encoding: Encoding, version: int, fields: dict[str, Any]) -> dict[str, Any]:
    for v in range(version, encoding.version):
        fields = encoding.upgrades[v](dict(fields))
    return fields


def _fill(obj: Any, encoding: Encoding, fields: Mapping[str, Any]) -> None:
    if encoding.restore is not None:
        encoding.restore(obj, dict(fields))
        return
    for f in dataclasses.fields(encoding.cls):
        if f.name in fields:
            value = fields[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise CorruptRecord(f"encoding {encoding.name!r}: the checkpoint's value of "
                                f"{encoding.cls.__qualname__} has no field {f.name!r} and it "
                                f"has no default (rule 3)")
        object.__setattr__(obj, f.name, value)  # frozen dataclasses too


def _decoded(name: str, version: int, fields: dict[str, Any]) -> Any:
    """Rule 1's constructor, named by every encoded pickle (do not move or rename)."""
    encoding = REGISTRY.get(name)
    if encoding is None and name in HOMES:
        importlib.import_module(HOMES[name])  # registers it (rule 1)
        encoding = REGISTRY.get(name)
    if encoding is None:
        raise EncodingTooNew(f"a checkpoint holds a value of encoding {name!r}, which this "
                             f"sparkcoord does not know: it was written by a newer sparkcoord "
                             f"(or one with an extension installed that is missing here)")
    if version > encoding.version:
        raise EncodingTooNew(f"a checkpoint holds {name!r} version {version}; this sparkcoord "
                             f"reads up to version {encoding.version}: it was written by a "
                             f"newer sparkcoord")
    cls: Any = encoding.cls
    obj = cls.__new__(cls)
    _fill(obj, encoding, _upgraded(encoding, version, dict(fields)))
    return obj


class _Bytes:
    """The file-like view of a pickle's bytes that ``pickle.Unpickler`` reads (``read``,
    ``readline``, ``readinto``): the core imports no ``io``."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = bytes(data)
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else min(len(self._data), self._at + size)
        out = self._data[self._at:end]
        self._at = end
        return out

    def readline(self) -> bytes:
        cut = self._data.find(b"\n", self._at)
        return self.read(-1 if cut < 0 else cut + 1 - self._at)

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        moved = MOVED.get(f"{module}:{name}")
        if moved is not None:
            module, name = moved.split(":", 1)
        return super().find_class(module, name)


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Unpickle a checkpoint's (or a log item's) bytes with rule 4's moved names. Called by
    the runtime and the tools wherever a checkpoint's pickle is read, on any thread. Only for
    bytes of the job's own checkpoint or of an authenticated peer: unpickling runs code."""
    if not MOVED:
        return pickle.loads(data)
    return _Unpickler(_Bytes(data)).load()


def same_value(logged: bytes, given: bytes) -> bool:
    """Rule 6: whether two encodings of a log item stand for the same value (bytes first,
    then decoded and compared). Called by the inbox on a channel thread, outside its lock
    (``runtime/inbox.py`` rule 6), when a re-sent item's bytes differ from the logged ones."""
    if logged == given:
        return True
    try:  # this code's encodings of the two decoded values: ``==`` would trust a user's
        # ``__eq__`` (one that compares an id only) and equal ``1`` and ``True``
        return (pickle.dumps(loads(logged), pickle.HIGHEST_PROTOCOL)
                == pickle.dumps(loads(given), pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - what does not decode is not the same value
        return False


def named_globals(data: bytes) -> set[str]:
    """The ``module:name`` of every class or function a pickle names, read without
    unpickling (``pickletools``). Tests and tools call it to check rule 1: what the library
    writes names ``_decoded``, not its classes' paths."""
    import pickletools  # tests and tools only: kept off the executors' imports

    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(f"{strings[-2]}:{strings[-1]}")
        elif op.name == "GLOBAL":
            found.add(str(arg).replace(" ", ":"))
    return found
