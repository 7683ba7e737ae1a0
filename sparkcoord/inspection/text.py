"""The inspection report as text (what ``sparkcoord inspect`` prints without ``--json``).

Thread model: none (a pure function of the report).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkcoord.inspection.common import _HEAD, _TEXT_VALUE


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
    lease = source.get("lease")
    if lease is None:
        add("  lease          none (no driver program took it)")
    else:
        state = "held" if lease["held"] else "free"
        add(f"  lease          {state}: {lease['holder']}; {lease['reason']}")
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
