"""One coordinated source's directory, read for the inspection: records and their state parts,
inbound logs and their seals, subtask states, the channel and failure reports, and the
driver program's lease (``core/lease.py``).

Thread model: none.
"""

from __future__ import annotations

import json
import posixpath
import time
import zlib
from typing import Any

from sparkcoord.core.entries import (
    ClientRequestEntry,
    ClientResponseEntry,
    EventEntry,
    EventRunEntry,
    FinishedEntry,
    LogEntry,
    RegistrationEntry,
    RequestEntry,
    ResponseEntry,
)
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import TaskAttempt
from sparkcoord.core.inbound import kept_at_rerun, operators_with_requests
from sparkcoord.core.lease import LeaseHolder, may_take_over
from sparkcoord.core.records import (
    decode_checkpoint,
    decode_log,
    decode_log_seal,
    decode_state_lineage,
    decode_subtask_state,
)
from sparkcoord.core.stored import StoredOnce
from sparkcoord.inspection.common import (
    _CHANNEL_KEYS,
    _payload,
    _problem,
    _read,
    _Report,
    _visible,
)
from sparkcoord.inspection.spark_log import _rerun_action, _restore_point, _SparkLog
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import Files
from sparkcoord.runtime.layout import epoch_in
from sparkcoord.runtime.lease import generations, lease_path, process_alive, this_process


def _inspect_source(files: Files, name: str, root: str, spark: _SparkLog | None, decode: bool,
                    problems: list[dict[str, Any]]) -> dict[str, Any]:
    def problem(file: str, message: str) -> None:
        problems.append(_problem(name, file, message))

    channel = _channel(files, root, problem)
    lease = _lease(files, root, problem)
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
            path = posixpath.join(root, layout.RECORDS, layout.record_name(point))
            problem(path, f"{path}: missing, but the next "
                    f"run restores epoch {point} (Spark batch {restore['batch']})")
        if restore["committed"] and point not in {lg["epoch"] for lg in logs}:
            path = posixpath.join(root, layout.INBOUND, layout.log_name(point))
            problem(path, f"{path}: the inbound log of "
                    f"epoch {point} is missing, but the next run replays it (Spark committed "
                    f"batch {restore['batch']})")
    return {
        "name": name,
        "path": root,
        "channel": channel,
        "lease": lease,
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
    info = _json_file(files, posixpath.join(root, layout.CHANNEL_INFO), problem)
    if info is None:
        return None
    # a whitelist: the secret (and anything added later) is never copied into the report
    out: dict[str, Any] = {k: info[k] for k in _CHANNEL_KEYS
                           if isinstance(info.get(k), (str, int))}
    out["secret_present"] = "secret" in info
    return out


def _lease(files: Files, root: str, problem: _Report) -> dict[str, Any] | None:
    """The holder of the lease's highest generation (lease rule 1), and whether a run
    started now would take it over (lease rule 2, judged from this process: on the holder's
    machine by its process, elsewhere by its last renewal); None if no run took a lease."""
    present = generations(files, root)
    if not present:
        return None
    path = lease_path(root, present[-1])
    data = _read(files, path, problem)
    if data is None:
        return None
    try:
        holder = LeaseHolder.decode(data, path)
    except CorruptRecord as exc:
        problem(path, str(exc))
        return None
    me = this_process()
    now = time.time()
    alive = process_alive(holder.identity) if holder.identity.same_machine(me) else None
    verdict = may_take_over(holder, me, now, alive, held_here=False)
    return {"generation": holder.generation, "host": holder.host, "pid": holder.pid,
            "run": holder.run, "since": holder.since, "renewed": holder.renewed,
            "ttl_s": holder.ttl_s, "released": holder.released,
            "held": not verdict.take, "reason": verdict.reason,
            "holder": holder.describe(now)}


def _failure(files: Files, root: str, problem: _Report) -> dict[str, Any] | None:
    info = _json_file(files, posixpath.join(root, layout.FAILURE_REPORT), problem)
    if info is None:
        return None
    return {"run": str(info.get("run")), "cause": str(info.get("cause"))}


def _records(files: Files, root: str, decode: bool, problem: _Report) -> list[dict[str, Any]]:
    directory = posixpath.join(root, layout.RECORDS)

    def read_part(name: str) -> StoredOnce[Any]:
        path = posixpath.join(root, layout.PARTS, name)
        try:
            return StoredOnce.read_back(name, files.read(path))
        except FileNotFoundError:
            raise CorruptRecord(f"state part {name} not found at {path}") from None
    out = []
    for epoch, name in sorted((e, n) for n in files.names(directory)
                              if (e := epoch_in(n, layout.RECORD_SUFFIX)) is not None):
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
    directory = posixpath.join(root, layout.INBOUND)
    names = set(files.names(directory))
    epochs: set[int] = set()
    for n in names:
        for suffix in (layout.LOG_SUFFIX, layout.SEAL_SUFFIX, ""):
            e = epoch_in(n, suffix)
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
    log_path = posixpath.join(directory, layout.log_name(epoch))
    seal_path = posixpath.join(directory, layout.seal_name(epoch))
    seg_dir = posixpath.join(directory, str(epoch))
    out: dict[str, Any] = {"epoch": epoch, "file": log_path, "layout": "file", "size": 0}
    parts: list[tuple[str, bytes]] = []
    missing: str | None = None
    if layout.log_name(epoch) in names:
        data = _read(files, log_path, problem)
        if data is None:
            return None
        parts = [(log_path, data)]
    elif str(epoch) in names:
        out.update(file=seg_dir, layout="segments")
        seg_names = files.names(seg_dir)
        segments = sorted(n for n in seg_names if n.endswith(layout.SEGMENT_SUFFIX))
        expected = [layout.segment_name(i) for i in range(len(segments))]
        if layout.SEGMENTS_BEGIN not in seg_names:
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

    sealed = layout.seal_name(epoch) in names
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
                # the seal covers a prefix: client requests may follow it (docs/protocol.md
                # [log-seal])
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
            # a task attempt ended its batch having sent this many items (docs/protocol.md
            # [every-attempt-finishes])
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
    base = posixpath.join(root, layout.STATE)
    out = []
    for operator in sorted(_visible(files.names(base))):
        op_dir = posixpath.join(base, operator)
        for index in sorted(i for i in (epoch_in(n, "") for n in files.names(op_dir))
                            if i is not None):
            out.append(_subtask_states(files, posixpath.join(op_dir, str(index)), operator,
                                       index, decode, problem))
    return out


def _subtask_states(files: Files, directory: str, operator: str, index: int, decode: bool,
                    problem: _Report) -> dict[str, Any]:
    names = files.names(directory)
    entry: dict[str, Any] = {"subtask": f"{operator}[{index}]", "operator": operator,
                             "index": index, "path": directory, "lineage": None}
    if layout.LINEAGE in names:
        path = posixpath.join(directory, layout.LINEAGE)
        data = _read(files, path, problem)
        try:
            entry["lineage"] = None if data is None else decode_state_lineage(data, path)
        except CorruptRecord as exc:
            problem(path, str(exc))
    good: dict[int, bytes] = {}
    epochs = sorted(e for e in (epoch_in(n, layout.STATE_SUFFIX) for n in names) if e is not None)
    for epoch in epochs:
        path = posixpath.join(directory, layout.state_name(epoch))
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
