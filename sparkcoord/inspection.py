"""Looking into a checkpoint directory: what ``sparkcoord inspect`` reports.

A checkpoint directory is either a :class:`~sparkcoord.spark.CoordinatedJob`'s
``checkpoint_dir`` (``spark/``: Spark's checkpoint location; ``coordination/<source>/``: one
directory per coordinated source) or one coordinated source's directory (``records/``,
``inbound/``, ``state/``; see :mod:`sparkcoord.runtime.storage` for the layout). For each
source the report holds:

* the restore point the next run would compute from Spark's logs (the newest batch in
  ``spark/offsets``, committed iff ``spark/commits`` has it, its epoch from our offset line) and
  the Spark batch -> epoch mapping;
* every checkpoint record: the coordinators' snapshots (size and first bytes; with ``decode``
  the state itself as JSON-able data, and its ``repr``) and the number of events each subtask
  receives in the epoch's batch;
* every inbound log: registrations, events per task attempt, its seal and whether it matches;
* every subtask's state files, its lineage marker and (with ``decode``) its newest state;
* the run in ``channel.json`` (never the channel secret) and the cause in
  ``last-failure.json``;
* ``problems``: every file that fails to decode or to verify, named, with the reason; the
  inspection goes on with the other files.

Rules:
  1. Read only: nothing is created, repaired or deleted (``CheckpointStorage`` creates its
     directories, so the files are read here through :mod:`sparkcoord.runtime.files`).
  2. Nothing is unpickled unless ``decode`` is true: unpickling runs code named in the file.
  3. The report is plain data (dicts, lists, strings, numbers, booleans, None), serialisable
     with :func:`json.dumps`; bytes appear only as sizes and hex prefixes. A decoded state
     (``decode``) is plain data too: :func:`plain_value` turns the unpickled object into it.
  4. A log whose last frame is cut short is damage when its batch committed (it has a seal,
     or Spark's commit log has a batch of its epoch) or when Spark's logs are not at hand to
     tell; it is expected of the running batch's log after a crash (a restore cuts the torn
     frame off, which no task was ever acknowledged).

Thread model: no state; any thread of any process (the ``sparkcoord inspect`` command calls it
from its main thread). Inspecting a directory a job is writing shows a moment's view; files
that change under the reader may be reported as problems.
"""

from __future__ import annotations

import json
import posixpath
import zlib
from collections.abc import Callable
from typing import Any

from sparkcoord.core.errors import CorruptRecord, SparkCoordError
from sparkcoord.core.ids import NO_EPOCH, TaskAttempt
from sparkcoord.core.inbound import (
    ClientRequestEntry,
    ClientResponseEntry,
    EventEntry,
    EventRunEntry,
    FinishedEntry,
    LogEntry,
    RegistrationEntry,
    RequestEntry,
    ResponseEntry,
    kept_at_rerun,
    operators_with_requests,
)
from sparkcoord.core.records import (
    decode_checkpoint,
    decode_log,
    decode_log_seal,
    decode_state_lineage,
    decode_subtask_state,
)
from sparkcoord.core.stored import StoredOnce, load_snapshot, snapshot_parts
from sparkcoord.core.text import plural
from sparkcoord.runtime.files import Files, files_for

__all__ = ["NotACheckpoint", "inspect_checkpoint", "plain_value", "render_text"]

#: the key of our offsets in Spark's offset log (``sparkcoord.spark.spec.MARKER``; not
#: imported from there: that module imports pyspark)
_MARKER = "sparkcoord"
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


# ------------------------------------------------------------------------------ the report
def inspect_checkpoint(path: str, decode: bool = False) -> dict[str, Any]:
    """Everything stored under checkpoint directory ``path``, as JSON-serialisable data.

    ``path``: a ``CoordinatedJob``'s checkpoint_dir or one coordinated source's directory (a
    local path or any fsspec URL). ``decode``: unpickle coordinator snapshots and the newest
    subtask states; each then has ``"value"``, the state as plain data (:func:`plain_value`),
    and ``"repr"``, its ``repr()`` (this runs code from the files: only for checkpoints you
    trust, with the job's classes importable). Raises :class:`NotACheckpoint` when
    ``path`` is neither. Damaged files do not raise: they are listed under ``"problems"``.

    Called by the ``sparkcoord inspect`` command (its main thread) and by tools and tests (any
    thread, any process); it only reads.
    """
    files, root = files_for(path)
    names = _visible(files.names(root))
    problems: list[dict[str, Any]] = []
    spark_root: str | None = None
    if "coordination" in names or "spark" in names:
        kind = "job"
        coordination = posixpath.join(root, "coordination")
        source_roots = [(n, posixpath.join(coordination, n))
                        for n in sorted(_visible(files.names(coordination)))]
        if "spark" in names:
            spark_root = posixpath.join(root, "spark")
    elif names & {"records", "inbound", "state", "channel.json"}:
        kind = "source"
        source_roots = [(posixpath.basename(root), root)]
        parent = posixpath.dirname(root)
        if posixpath.basename(parent) == "coordination":  # inside a job's checkpoint_dir
            candidate = posixpath.join(posixpath.dirname(parent), "spark")
            if files.names(candidate):
                spark_root = candidate
    else:
        raise NotACheckpoint(_not_a_checkpoint(path, names))

    spark = _SparkLog.read(files, spark_root, problems) if spark_root is not None else None
    sources = [_inspect_source(files, name, source_root, spark, decode, problems)
               for name, source_root in source_roots]
    if spark is not None and kind == "job":
        known = {name for name, _ in source_roots}
        for name in sorted(spark.source_names() - known):
            problems.append(_problem(name, posixpath.join(root, "coordination", name),
                                     f"Spark's offset log ({spark.root}/offsets) holds offsets of "
                                     f"coordinated source {name!r}, but its coordination "
                                     f"directory is missing"))
    return {
        "url": path,
        "path": root,
        "kind": kind,
        "spark_checkpoint": spark_root,
        "decoded": decode,
        "sources": sources,
        "problems": problems,
    }


def _not_a_checkpoint(path: str, names: set[str]) -> str:
    expected = ("expected a CoordinatedJob's checkpoint_dir (with coordination/ and spark/) or "
                "one coordinated source's directory (with records/, inbound/ and state/)")
    if not names:
        return f"{path}: no such directory, or an empty one; {expected}"
    shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
    return f"{path} is not a sparkcoord checkpoint directory (it holds {shown}); {expected}"


def _visible(names: list[str]) -> set[str]:
    return {n for n in names if not n.startswith(".")}


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


def _epoch_of(name: str, suffix: str) -> int | None:
    if not name.endswith(suffix):
        return None
    stem = name[:len(name) - len(suffix)] if suffix else name
    return int(stem) if stem.lstrip("-").isdigit() else None


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


# ------------------------------------------------------------------------- Spark's logs
class _SparkLog:
    """Spark's offset and commit logs of the query (read once, shared by the sources)."""

    def __init__(self, root: str, offsets: dict[int, list[Any]], commits: set[int]) -> None:
        self.root = root
        self.offsets = offsets  # batch -> the parsed offset line of each source (None: none)
        self.commits = commits

    @classmethod
    def read(cls, files: Files, root: str, problems: list[dict[str, Any]]) -> _SparkLog:
        def problem(file: str, message: str) -> None:
            problems.append(_problem(None, file, message))

        offsets: dict[int, list[Any]] = {}
        directory = posixpath.join(root, "offsets")
        for name in files.names(directory):
            batch = _epoch_of(name, "")
            if batch is None:
                continue  # .crc and temporary files
            path = posixpath.join(directory, name)
            data = _read(files, path, problem)
            if data is None:
                continue  # purged by a running query since the listing, or unreadable
            try:
                lines = data.decode().splitlines()
            except UnicodeDecodeError as exc:
                problem(path, f"{path}: not text ({exc})")
                continue
            if not lines or lines[0] != "v1":
                problem(path, f"{path}: unknown offset log version {lines[:1]}, expected ['v1']")
                continue
            values: list[Any] = []
            for line in lines[2:]:
                try:
                    values.append(json.loads(line))
                except ValueError:
                    values.append(None)  # "-": a source without an offset in this batch
            offsets[batch] = values
        commits = {b for b in (_epoch_of(n, "") for n in
                               files.names(posixpath.join(root, "commits"))) if b is not None}
        return cls(root, offsets, commits)

    def source_names(self) -> set[str]:
        return {v[_MARKER] for values in self.offsets.values() for v in values
                if isinstance(v, dict) and isinstance(v.get(_MARKER), str)}

    def epoch(self, source: str, batch: int) -> int | None:
        for value in self.offsets.get(batch, ()):
            if isinstance(value, dict) and value.get(_MARKER) == source and "epoch" in value:
                try:
                    return int(value["epoch"])
                except (TypeError, ValueError):
                    return None
        return None

    def batches(self, source: str) -> list[dict[str, Any]]:
        """Each logged batch: its epoch of ``source``, whether it committed, whether the epoch
        is new in it (as a downstream operator decides: sparkcoord.spark.recipient)."""
        out = []
        for batch in sorted(self.offsets):
            epoch = self.epoch(source, batch)
            if batch == 0:
                previous: int | None = NO_EPOCH
            else:
                previous = self.epoch(source, batch - 1) if batch - 1 in self.offsets else None
            new = (None if epoch is None or previous is None
                   else epoch != previous and epoch != NO_EPOCH)
            out.append({"batch": batch, "epoch": epoch, "committed": batch in self.commits,
                        "new_epoch": new})
        return out


def _rerun_action(restore: dict[str, Any]) -> str:
    """What a restore to the uncommitted epoch of ``restore`` does with its inbound log, as
    the restore does it (``kept_at_rerun``; docs/decisions.md 36 and 38)."""
    epoch, batch, kept = restore["epoch"], restore["batch"], restore["kept_at_rerun"]
    rerun = f"Spark reruns batch {batch}"
    if kept is None:
        return (f"the next run restores snapshot {epoch}; inbound log {epoch} is missing or "
                f"unreadable, so no logged request is kept; {rerun}")
    if kept["kept_entries"] == 0:
        return (f"the next run restores snapshot {epoch}, truncates inbound log {epoch} "
                f"({plural(kept['logged_entries'], 'entry', 'entries')} dropped: no request "
                f"was answered in it) and {rerun}")
    what = []
    if kept["operators"]:
        what.append(f"every entry of {', '.join(kept['operators'])}, asked requests in it")
    if kept["client_entries"]:
        what.append(f"{kept['client_entries']} client request and answer entries")
    return (f"the next run restores snapshot {epoch}, keeps {kept['kept_entries']} of the "
            f"{kept['logged_entries']} entries of inbound log {epoch} ({' and '.join(what)}) "
            f"and hands them to the coordinators again, truncating the rest; {rerun}, whose "
            f"tasks get the logged answers")


def _restore_point(spark: _SparkLog | None, source: str) -> dict[str, Any]:
    if spark is None:
        return {"status": "unknown", "epoch": None, "batch": None, "committed": None,
                "action": "Spark's checkpoint location (spark/ next to coordination/) was not "
                          "found: the restore point cannot be told"}
    if not spark.offsets:
        return {"status": "fresh", "epoch": NO_EPOCH, "batch": None, "committed": True,
                "action": "Spark logged no batch: the next run starts fresh"}
    batch = max(spark.offsets)
    epoch = spark.epoch(source, batch)
    committed = batch in spark.commits
    if epoch is None:
        return {"status": "unknown", "epoch": None, "batch": batch, "committed": committed,
                "action": f"Spark's newest batch {batch} holds no offset of this source"}
    if epoch == NO_EPOCH:
        return {"status": "fresh", "epoch": NO_EPOCH, "batch": batch, "committed": committed,
                "action": "no epoch of this source was logged: the next run starts fresh"}
    if committed:
        return {"status": "committed", "epoch": epoch, "batch": batch, "committed": True,
                "action": f"the next run restores snapshot {epoch} and replays inbound log "
                          f"{epoch}"}
    # the action is completed from the inbound log: what the rerun keeps of it
    return {"status": "uncommitted", "epoch": epoch, "batch": batch, "committed": False,
            "action": f"the next run restores snapshot {epoch} and Spark reruns batch {batch}"}


# ------------------------------------------------------------------------------ a source
def _inspect_source(files: Files, name: str, root: str, spark: _SparkLog | None, decode: bool,
                    problems: list[dict[str, Any]]) -> dict[str, Any]:
    def problem(file: str, message: str) -> None:
        problems.append(_problem(name, file, message))

    channel = _channel(files, root, problem)
    failure = _failure(files, root, problem)
    if failure is not None and channel is not None:
        failure["of_latest_run"] = failure.get("run") == channel.get("run")
    restore = _restore_point(spark, name)
    batches = spark.batches(name) if spark is not None else []
    committed_epochs = {b["epoch"] for b in batches if b["committed"] and b["epoch"] is not None}
    records = _records(files, root, decode, problem)
    rerun = restore["epoch"] if restore["status"] == "uncommitted" else None
    logs = _inbound_logs(files, root, committed_epochs if spark is not None else None, rerun,
                         problem)
    states = _states(files, root, decode, problem)
    point = restore["epoch"]
    if rerun is not None:
        restore["kept_at_rerun"] = next((lg.get("kept_at_rerun") for lg in logs
                                         if lg["epoch"] == rerun), None)
        restore["action"] = _rerun_action(restore)
    if restore["status"] in ("committed", "uncommitted") and isinstance(point, int):
        if point not in {r["epoch"] for r in records}:
            problem(posixpath.join(root, "records", f"{point}.ckpt"),
                    f"{posixpath.join(root, 'records', f'{point}.ckpt')}: missing, but the next "
                    f"run restores epoch {point} (Spark batch {restore['batch']})")
        if restore["committed"] and point not in {lg["epoch"] for lg in logs}:
            problem(posixpath.join(root, "inbound", f"{point}.log"),
                    f"{posixpath.join(root, 'inbound', f'{point}.log')}: the inbound log of "
                    f"epoch {point} is missing, but the next run replays it (Spark committed "
                    f"batch {restore['batch']})")
    return {
        "name": name,
        "path": root,
        "channel": channel,
        "last_failure": failure,
        "restore_point": restore,
        "batches": batches,
        "record_epochs": [r["epoch"] for r in records],
        "records": records,
        "inbound_logs": logs,
        "states": states,
    }


def _json_file(files: Files, path: str, problem: _Report) -> dict[str, Any] | None:
    data = _read(files, path, problem)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError included
        problem(path, f"{path}: not valid JSON ({exc})")
        return None
    if not isinstance(value, dict):
        problem(path, f"{path}: holds a JSON {type(value).__name__}, expected an object")
        return None
    return value


def _channel(files: Files, root: str, problem: _Report) -> dict[str, Any] | None:
    info = _json_file(files, posixpath.join(root, "channel.json"), problem)
    if info is None:
        return None
    # a whitelist: the secret (and anything added later) is never copied into the report
    out: dict[str, Any] = {k: info[k] for k in _CHANNEL_KEYS
                           if isinstance(info.get(k), (str, int))}
    out["secret_present"] = "secret" in info
    return out


def _failure(files: Files, root: str, problem: _Report) -> dict[str, Any] | None:
    info = _json_file(files, posixpath.join(root, "last-failure.json"), problem)
    if info is None:
        return None
    return {"run": str(info.get("run")), "cause": str(info.get("cause"))}


def _records(files: Files, root: str, decode: bool, problem: _Report) -> list[dict[str, Any]]:
    directory = posixpath.join(root, "records")

    def read_part(name: str) -> StoredOnce[Any]:
        path = posixpath.join(root, "parts", name)
        try:
            return StoredOnce.read_back(name, files.read(path))
        except FileNotFoundError:
            raise CorruptRecord(f"state part {name} not found at {path}") from None
    out = []
    for epoch, name in sorted((e, n) for n in files.names(directory)
                              if (e := _epoch_of(n, ".ckpt")) is not None):
        path = posixpath.join(directory, name)
        data = _read(files, path, problem)
        if data is None:
            continue  # pruned since the listing, or unreadable (a problem)
        entry: dict[str, Any] = {"epoch": epoch, "file": path, "size": len(data)}
        out.append(entry)
        try:
            record = decode_checkpoint(data, path)
        except CorruptRecord as exc:
            entry["error"] = str(exc)
            problem(path, str(exc))
            continue
        if record.epoch != epoch:
            entry["error"] = f"{path}: holds epoch {record.epoch}, expected {epoch}"
            problem(path, entry["error"])
        entry["coordinators"] = [{"name": coordinator,
                                  "snapshot": _payload(snap, decode, read_part)}
                                 for coordinator, snap in record.snapshots.items()
                                 if not coordinator.startswith("\x00")]  # runtime entries
        entry["events"] = [{"subtask": str(sid), "operator": sid.operator, "index": sid.index,
                            "count": len(events)}
                           for sid, events in sorted(record.events.items()) if events]
        entry["event_count"] = record.event_count()
    return out


# --------------------------------------------------------------------------- inbound logs
def _inbound_logs(files: Files, root: str, committed_epochs: set[int] | None,
                  rerun: int | None, problem: _Report) -> list[dict[str, Any]]:
    """``committed_epochs``: the epochs whose batch Spark committed; None if not known.
    ``rerun``: the uncommitted epoch the next run restores (its log tells what it keeps)."""
    directory = posixpath.join(root, "inbound")
    names = set(files.names(directory))
    epochs: set[int] = set()
    for n in names:
        for suffix in (".log", ".sealed", ""):
            e = _epoch_of(n, suffix)
            if e is not None:
                epochs.add(e)
                break
    logs = (_inbound_log(files, directory, names, epoch, committed_epochs, epoch == rerun,
                         problem)
            for epoch in sorted(epochs))
    return [log for log in logs if log is not None]


def _inbound_log(files: Files, directory: str, names: set[str], epoch: int,
                 committed_epochs: set[int] | None, rerun: bool,
                 problem: _Report) -> dict[str, Any] | None:
    """The log of ``epoch``; None if it vanished since the listing (pruned) or cannot be read
    (then a problem says so). ``rerun``: the next run restores this uncommitted epoch; the
    log then also says what that restore keeps of it (``kept_at_rerun``)."""
    log_path = posixpath.join(directory, f"{epoch}.log")
    seal_path = posixpath.join(directory, f"{epoch}.sealed")
    seg_dir = posixpath.join(directory, str(epoch))
    out: dict[str, Any] = {"epoch": epoch, "file": log_path, "layout": "file", "size": 0}
    parts: list[tuple[str, bytes]] = []
    missing: str | None = None
    if f"{epoch}.log" in names:
        data = _read(files, log_path, problem)
        if data is None:
            return None
        parts = [(log_path, data)]
    elif str(epoch) in names:
        out.update(file=seg_dir, layout="segments")
        seg_names = files.names(seg_dir)
        segments = sorted(n for n in seg_names if n.endswith(".seg"))
        expected = [f"{i:012d}.seg" for i in range(len(segments))]
        if "begin" not in seg_names:
            missing = f"{seg_dir}: the log's begin object is missing"
        elif segments != expected:
            gap = sorted(set(expected) - set(segments))[:1] or expected[-1:]
            missing = (f"{seg_dir}: segment {gap[0]} of the inbound log of epoch {epoch} is "
                       f"missing (segments are numbered from 0 without gaps)")
        for n in segments:
            data = _read(files, posixpath.join(seg_dir, n), problem)
            if data is None:
                return None
            parts.append((posixpath.join(seg_dir, n), data))
        out["segments"] = len(segments)
    else:
        missing = (f"{log_path}: the inbound log of epoch {epoch} is missing, but its seal "
                   f"{seal_path} exists")
    if missing is not None:
        out["error"] = missing
        problem(out["file"], missing)

    sealed = f"{epoch}.sealed" in names
    committed = (True if sealed or (committed_epochs is not None and epoch in committed_epochs)
                 else None if committed_epochs is None else False)
    entries: list[LogEntry] = []
    length, crc = 0, 0
    frames_ok = True
    for i, (name, data) in enumerate(parts):
        length += len(data)
        crc = zlib.crc32(data, crc)
        try:
            entries.extend(decode_log(data, name)[0])
            continue
        except CorruptRecord as exc:
            error = str(exc)
        # a short last frame: a torn append, expected of a batch that never committed
        torn: list[LogEntry] | None = None
        if i == len(parts) - 1 and out["layout"] == "file":
            try:
                torn = decode_log(data, name, allow_torn_tail=True)[0]
            except CorruptRecord:
                torn = None
        if torn is not None and committed is False:
            out["torn_tail"] = True
            out["note"] = (f"the last frame is cut short (a crash during an append); the batch "
                           f"of epoch {epoch} did not commit, so a restore cuts that frame off "
                           f"(it was never acknowledged)")
            entries.extend(torn)
            continue
        frames_ok = False
        if torn is not None:
            entries.extend(torn)
            if committed is None:
                error += (f" (damage unless the batch of epoch {epoch} never committed: "
                          f"Spark's logs were not found to tell)")
        out["error"] = error
        problem(name, error)
        break
    out["size"] = length
    out["committed"] = committed
    out.update(_summarise(entries))
    if rerun and "error" not in out:
        # as the restore decides it (sparkcoord.core.inbound.kept_at_rerun; the torn last
        # frame, never acknowledged, is not among the entries)
        kept = kept_at_rerun(entries)
        out["kept_at_rerun"] = {
            "logged_entries": len(entries), "kept_entries": len(kept),
            "operators": sorted(operators_with_requests(entries)),
            "client_entries": sum(isinstance(e, (ClientRequestEntry, ClientResponseEntry))
                                  for e in kept)}

    seal: dict[str, Any] = {"present": sealed, "file": seal_path, "matches": None}
    seal_data = _read(files, seal_path, problem) if sealed else None
    if seal_data is not None:
        try:
            found = decode_log_seal(seal_data, seal_path)
        except CorruptRecord as exc:
            seal["error"] = str(exc)
            problem(seal_path, str(exc))
        else:
            seal.update(epoch=found.epoch, length=found.length, crc32=f"{found.crc32:#010x}")
            if missing is None and frames_ok:
                # the seal covers a prefix: client requests may follow it (decision 38)
                whole = b"".join(data for _, data in parts)
                head = whole[:found.length]
                seal["matches"] = (found.epoch, found.length, found.crc32) == (
                    epoch, len(head), zlib.crc32(head))
                if len(whole) > found.length:
                    seal["bytes_after"] = len(whole) - found.length
                if not seal["matches"]:
                    message = (f"{out['file']}: the inbound log of epoch {epoch} holds {length} "
                               f"bytes with CRC-32 {crc:#010x}, but its seal {seal_path} says "
                               f"epoch {found.epoch}, {found.length} bytes, CRC-32 "
                               f"{found.crc32:#010x} (frames are missing or the log was cut "
                               f"at a frame boundary)")
                    out["error"] = message
                    problem(out["file"], message)
    out["seal"] = seal
    return out


def _summarise(entries: list[LogEntry]) -> dict[str, Any]:
    """Registrations in log order, and the events of each task attempt (counts, sequences)."""
    registrations = []
    events: dict[TaskAttempt, dict[str, Any]] = {}
    total = 0
    kinds = {"requests": 0, "responses": 0, "client_requests": 0, "client_responses": 0}
    finishes = []
    for entry in entries:
        a = entry.attempt
        if isinstance(entry, FinishedEntry):
            # a task attempt ended its batch having sent this many items (decision 47)
            finishes.append({"subtask": str(a.subtask), "attempt": a.number, "run": a.run,
                             "items": entry.seq})
            continue
        if isinstance(entry, (RequestEntry, ResponseEntry, ClientRequestEntry,
                              ClientResponseEntry)):
            kinds[{RequestEntry: "requests", ResponseEntry: "responses",
                   ClientRequestEntry: "client_requests",
                   ClientResponseEntry: "client_responses"}[type(entry)]] += 1
            continue
        if isinstance(entry, RegistrationEntry):
            registrations.append({"subtask": str(a.subtask), "operator": a.subtask.operator,
                                  "index": a.subtask.index, "attempt": a.number, "run": a.run,
                                  "epoch": a.epoch})
            continue
        if isinstance(entry, EventRunEntry):
            first, count = entry.first_seq, len(entry.payloads)
        else:
            assert isinstance(entry, EventEntry)
            first, count = entry.seq, 1
        total += count
        row = events.setdefault(a, {"subtask": str(a.subtask), "operator": a.subtask.operator,
                                    "index": a.subtask.index, "attempt": a.number, "run": a.run,
                                    "epoch": a.epoch, "count": 0, "first_seq": first,
                                    "last_seq": first})
        row["count"] += count
        row["first_seq"] = min(row["first_seq"], first)
        row["last_seq"] = max(row["last_seq"], first + count - 1)
    return {"entries": len(entries), "registrations": registrations,
            "events": list(events.values()), "event_count": total, **kinds,
            "finishes": finishes}


# -------------------------------------------------------------------------- subtask state
def _states(files: Files, root: str, decode: bool, problem: _Report) -> list[dict[str, Any]]:
    base = posixpath.join(root, "state")
    out = []
    for operator in sorted(_visible(files.names(base))):
        op_dir = posixpath.join(base, operator)
        for index in sorted(i for i in (_epoch_of(n, "") for n in files.names(op_dir))
                            if i is not None):
            out.append(_subtask_states(files, posixpath.join(op_dir, str(index)), operator,
                                       index, decode, problem))
    return out


def _subtask_states(files: Files, directory: str, operator: str, index: int, decode: bool,
                    problem: _Report) -> dict[str, Any]:
    names = files.names(directory)
    entry: dict[str, Any] = {"subtask": f"{operator}[{index}]", "operator": operator,
                             "index": index, "path": directory, "lineage": None}
    if "lineage" in names:
        path = posixpath.join(directory, "lineage")
        data = _read(files, path, problem)
        try:
            entry["lineage"] = None if data is None else decode_state_lineage(data, path)
        except CorruptRecord as exc:
            problem(path, str(exc))
    good: dict[int, bytes] = {}
    epochs = sorted(e for e in (_epoch_of(n, ".state") for n in names) if e is not None)
    for epoch in epochs:
        path = posixpath.join(directory, f"{epoch}.state")
        data = _read(files, path, problem)
        if data is None:
            continue
        try:
            found, state = decode_subtask_state(data, path)
        except CorruptRecord as exc:
            problem(path, str(exc))
            continue
        if found != epoch:
            problem(path, f"{path}: holds epoch {found}, expected {epoch}")
            continue
        good[epoch] = state
    entry["epochs"] = epochs
    entry["newest"] = None
    if good:
        newest = max(good)
        entry["newest"] = {"epoch": newest, "state": _payload(good[newest], decode)}
    return entry


# ---------------------------------------------------------------------------------- text
def render_text(report: dict[str, Any]) -> str:
    """The report of :func:`inspect_checkpoint` as plain text for a person.

    Called by the ``sparkcoord inspect`` command (its main thread) and by tools and tests (any
    thread)."""
    lines: list[str] = []
    add = lines.append
    what = ("a CoordinatedJob's checkpoint_dir" if report["kind"] == "job"
            else "a coordinated source's directory")
    add(f"checkpoint {report['url']} ({what})")
    add(f"Spark's checkpoint: {report['spark_checkpoint'] or 'not found'}")
    if not report["sources"]:
        add("no coordinated source (coordination/ is empty or missing)")
    for source in report["sources"]:
        add("")
        _render_source(source, add)
    add("")
    problems = report["problems"]
    if problems:
        add(f"PROBLEMS ({len(problems)})")
        for p in problems:
            where = f"[{p['source']}] " if p["source"] else ""
            add(f"  {where}{p['message']}")
    else:
        add("no problems found")
    return "\n".join(lines) + "\n"


def _render_source(source: dict[str, Any], add: Callable[[str], None]) -> None:
    add(f"source {source['name']}  ({source['path']})")
    channel = source["channel"]
    if channel is None:
        add("  run            unknown (no channel.json)")
    else:
        where = (f"{channel['host']}:{channel['port']}" if "host" in channel and "port" in channel
                 else "?")
        add(f"  run            {channel.get('run', '?')}  (channel {where}, pid "
            f"{channel.get('pid', '?')})")
    failure = source["last_failure"]
    if failure is None:
        add("  last failure   none recorded")
    else:
        latest = " (the latest run)" if failure.get("of_latest_run") else ""
        add(f"  last failure   run {failure['run']}{latest}:")
        for line in failure["cause"].splitlines() or [""]:
            add(f"                 {line}")
    restore = source["restore_point"]
    if restore["status"] in ("committed", "uncommitted"):
        add(f"  restore point  epoch {restore['epoch']}, Spark batch {restore['batch']} "
            f"{restore['status']}: {restore['action']}")
    else:
        add(f"  restore point  {restore['status']}: {restore['action']}")
    add(f"  record epochs  {_epochs(source['record_epochs'])}")

    if source["batches"]:
        add("  Spark batch -> epoch")
        for b in source["batches"]:
            epoch = "-" if b["epoch"] is None else b["epoch"]
            new = {True: "new epoch", False: "same epoch", None: "new epoch?"}[b["new_epoch"]]
            state = "committed" if b["committed"] else "NOT committed"
            add(f"    batch {b['batch']:>5}  epoch {epoch!s:>5}  {new:<10}  {state}")

    add("  records")
    if not source["records"]:
        add("    none")
    for r in source["records"]:
        head = f"    epoch {r['epoch']}  {r['file']}  {r['size']} bytes"
        if "coordinators" not in r:
            add(f"{head}  DAMAGED")
            continue
        add(head + ("  DAMAGED" if "error" in r else ""))
        for c in r["coordinators"]:
            add(f"      {c['name']}: snapshot {_payload_text(c['snapshot'])}")
        counts = ", ".join(f"{e['subtask']} {e['count']}" for e in r["events"]) or "none"
        add(f"      events to subtasks: {counts} ({r['event_count']} in all)")

    add("  inbound logs")
    if not source["inbound_logs"]:
        add("    none")
    for lg in source["inbound_logs"]:
        seal = lg["seal"]
        if not seal["present"]:
            seal_text = "no seal"
        elif "error" in seal:
            seal_text = "seal DAMAGED"
        elif seal["matches"] is None:
            seal_text = "sealed (not compared: the log is damaged)"
        else:
            seal_text = "sealed, matches" if seal["matches"] else "sealed, does NOT match"
        damaged = "  DAMAGED" if "error" in lg else ""
        add(f"    epoch {lg['epoch']}  {lg['file']}  {lg['size']} bytes, {lg['entries']} "
            f"entries, {seal_text}{damaged}")
        for reg in lg["registrations"]:
            add(f"      registered {reg['subtask']} attempt {reg['attempt']} (run {reg['run']})")
        for ev in lg["events"]:
            add(f"      events of {ev['subtask']} attempt {ev['attempt']} (run {ev['run']}): "
                f"{ev['count']} (seq {ev['first_seq']}..{ev['last_seq']})")
        if lg.get("requests") or lg.get("client_requests"):
            add(f"      requests {lg['requests']} (answered {lg['responses']}), client "
                f"requests {lg['client_requests']} (answered {lg['client_responses']})")
        if "note" in lg:
            add(f"      note: {lg['note']}")

    add("  subtask states")
    if not source["states"]:
        add("    none")
    for s in source["states"]:
        lineage = "none" if s["lineage"] is None else f"since {s['lineage']}"
        add(f"    {s['subtask']}  epochs {_epochs(s['epochs'])}  lineage {lineage}")
        if s["newest"] is not None:
            add(f"      newest: epoch {s['newest']['epoch']}, "
                f"{_payload_text(s['newest']['state'])}")


def _epochs(epochs: list[int]) -> str:
    return ", ".join(map(str, epochs)) if epochs else "none"


def _payload_text(payload: dict[str, Any] | None) -> str:
    if payload is None:
        return "none"
    text = f"{payload['size']} bytes ({payload['head_hex']}"
    text += "...)" if payload["size"] > _HEAD else ")"
    if "repr" in payload:
        value = payload["repr"]
        if len(value) > _TEXT_VALUE:
            value = f"{value[:_TEXT_VALUE]}... ({len(value)} characters; --json shows all)"
        text += f" = {value}"
    elif "decode_error" in payload:
        text += f": {payload['decode_error']}"
    return text
