"""What the parts of the inspection share: limits of the report, reading a file as a problem
when it fails, and a payload's report (rules in the package docstring).

Thread model: none (pure functions; reads through the given files).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sparkcoord.core.errors import CorruptRecord, SparkCoordError
from sparkcoord.core.stored import StoredOnce, load_snapshot, snapshot_parts
from sparkcoord.runtime.files import Files

#: bytes of a payload shown as hex
_HEAD = 16
#: characters of a decoded value shown in the text report
_TEXT_VALUE = 400
#: the keys of channel.json that are reported; never "secret"
_CHANNEL_KEYS = ("run", "host", "port", "pid")


#: reports a problem: (file, message)
_Report = Callable[[str, str], None]


class NotACheckpoint(SparkCoordError):
    """The path is not a sparkcoord checkpoint directory (the command exits with 2)."""



def _problem(source: str | None, file: str, message: str) -> dict[str, Any]:
    return {"source": source, "file": file, "message": message}


def _read(files: Files, path: str, problem: _Report) -> bytes | None:
    """The file's bytes; None if it is gone (pruned since the listing: not a problem) or
    unreadable (a problem)."""
    try:
        return files.read(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        problem(path, f"{path}: cannot be read ({exc})")
        return None




def _payload(data: bytes | None, decode: bool,
             read_part: Callable[[str], StoredOnce[Any]] | None = None,
             ) -> dict[str, Any] | None:
    """Size and first bytes of a pickled payload, and the stored-once parts a snapshot refers
    to (``parts``: their names, core/stored.py); with ``decode`` also its value as plain data
    (:func:`plain_value`) and its ``repr`` (what the text report shows)."""
    if data is None:
        return None
    out: dict[str, Any] = {"size": len(data), "head_hex": data[:_HEAD].hex()}
    try:
        parts = snapshot_parts(data)
    except CorruptRecord as exc:
        out["decode_error"] = str(exc)
        return out
    if parts:
        out["parts"] = parts
    if decode:
        try:
            state = load_snapshot(data, read_part)  # noqa: S301 - asked for with --decode
        except Exception as exc:  # noqa: BLE001 - a missing class is not damage: show why
            out["decode_error"] = f"cannot unpickle: {type(exc).__name__}: {exc}"
        else:
            out["value"] = plain_value(state)
            out["repr"] = _repr(state)
    return out


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001 - a user's __repr__
        return f"<{type(value).__qualname__}: repr() raised {type(exc).__name__}: {exc}>"


def plain_value(value: Any) -> Any:
    """``value`` (an unpickled coordinator snapshot or subtask state) as plain data that
    :func:`json.dumps` writes and :func:`json.loads` reads back equal (NaN aside): what
    ``inspect_checkpoint(..., decode=True)`` reports as a state's ``"value"``.

    None, booleans, integers, floats and strings stay as they are; lists and tuples become
    lists; a dict stays a dict, its keys made strings as JSON makes them (``1`` -> ``"1"``,
    ``None`` -> ``"null"``; other keys: their ``repr``); a dataclass becomes a dict of its
    fields, a named tuple a dict of its fields; a set becomes a sorted list (sorted by
    ``repr`` when its items do not compare); anything else (bytes, enums, other classes, a
    container that holds itself, an object whose conversion raised) becomes its ``repr``
    text. Two keys that become the same string (``1`` and ``"1"``) keep the later value.

    Any thread; a pure function (nothing is unpickled here)."""
    return _plain(value, set())


def _plain(value: Any, path: set[int]) -> Any:
    import dataclasses

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, StoredOnce):  # a stored-once part stands for its value
        return _plain(value.value, path)
    if id(value) in path:  # a container that holds itself
        return _repr(value)
    path.add(id(value))
    try:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: _plain(getattr(value, f.name), path)
                    for f in dataclasses.fields(value)}
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return {str(name): _plain(item, path)
                    for name, item in zip(value._fields, value, strict=False)}
        if isinstance(value, (list, tuple)):
            return [_plain(item, path) for item in value]
        if isinstance(value, dict):
            return {_plain_key(k): _plain(v, path) for k, v in value.items()}
        if isinstance(value, (set, frozenset)):
            try:
                items = sorted(value)
            except TypeError:
                items = sorted(value, key=_repr)
            return [_plain(item, path) for item in items]
        return _repr(value)
    except Exception:  # noqa: BLE001 - a user's class (a dataclass field never set, ...)
        return _repr(value)
    finally:
        path.discard(id(value))


def _plain_key(key: Any) -> str:
    """A dict key as JSON writes it (``json.dumps`` turns these keys into strings too)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    return _repr(key)


def _visible(names: list[str]) -> set[str]:
    return {n for n in names if not n.startswith(".")}
