"""``sparkcoord cdc``: mirror PostgreSQL tables into parquet files with the PostgreSQL source (a
snapshot, then the change stream), with a live progress line, until Ctrl-C (or, with
``--bounded``, an ``availableNow`` run: the snapshot and the changes committed before the run
started).

Rules:
  1. The arguments are checked before Spark starts (:func:`cdc_options`): a bad option is an
     error naming it within a second, not after a session came up.
  2. Nothing shown holds a password: the URL is always shown through
     :func:`~sparkcoord.sources.postgres.io.connection.redacted`, the options never.
  3. The rows count is the sum of the batches' input rows over the whole run
     (:class:`sparkcoord.sources.console.RowCount`), not only over the newest progress
     reports Spark keeps (100).
  4. With a Spark session of its own (local mode: Spark's processes are this process's
     children and inherit its environment), a password given in the URL or the options is
     exported as ``PGPASSWORD`` for the session's lifetime, unless ``PGPASSWORD`` is set
     already: what the user would do by hand (docs/cdc.md). Given a session, the command only
     says how, when it sees neither ``PGPASSWORD`` nor a passfile (:func:`pgpassword_note`).

Thread model: the command's main thread checks the arguments, builds and watches the job; the
job runs on its handle's thread (sparkcoord.spark.job.JobHandle).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sparkcoord.sources.postgres.io.connection import redacted

#: the coordinated source's (and its operator's) name: ``job.request(SOURCE, "status")``
SOURCE = "postgres"


def cdc_options(url: str | None, tables: str | Sequence[str],
                options: dict[str, str] | None = None) -> dict[str, str]:
    """The source's options for ``tables`` and ``options`` (source options and libpq keywords),
    checked as the source will check them (rule 1): a ``ValueError`` naming what is wrong,
    never holding a password. Called by ``sparkcoord cdc`` and :func:`run_cdc` on the
    command's main thread, before Spark starts."""
    from sparkcoord.sources.postgres.stream import parse_cdc_options

    given = dict(options or {})
    if any(key.lower() == "tables" for key in given):
        raise ValueError("give the tables with --tables, not as an option")
    names = tables if isinstance(tables, str) else ",".join(tables)
    merged = {"tables": names, **given}
    _, connection = parse_cdc_options(merged)
    try:
        from sparkcoord.sources.postgres.io.connection import ConnectionOptions

        ConnectionOptions.parse(url, connection)
    except ImportError:
        raise ValueError("the PostgreSQL source needs psycopg: pip install "
                         "'sparkcoord[postgres]'") from None
    return merged


def run_cdc(url: str | None, tables: str | Sequence[str], out: str, checkpoint: str, *,
            options: dict[str, str] | None = None, bounded: bool = False,
            spark: Any = None, console: Any = None) -> dict[str, Any]:
    """Mirror ``tables`` of the database at ``url`` into parquet files under ``out`` (the
    ``key``, ``before`` and ``after`` structs kept as they are), the job's checkpoints under
    ``checkpoint``; until Ctrl-C, or with ``bounded`` one ``availableNow`` run. Returns the
    rows read, the restarts, the replication slot's and the publication's names and the
    source's last status. Starts a local[2,4] session unless given one. Called by ``sparkcoord
    cdc`` (or a program) on its main thread, which it blocks."""
    from rich.console import Console

    from sparkcoord.sources.postgres.stream import parse_cdc_options

    merged = cdc_options(url, tables, options)
    parsed, connection = parse_cdc_options(merged)
    console = console or Console()
    own = spark is None
    # rule 4: a session of the command's own is local mode: its processes are children of
    # this one and inherit its environment, as if the user had exported PGPASSWORD
    password = _given_password(url, connection) if own else None
    exported = password is not None and not os.environ.get("PGPASSWORD")
    if password is not None and exported:
        os.environ["PGPASSWORD"] = password
    try:
        return _run(url, merged, parsed, out, checkpoint, bounded, spark, console, own)
    finally:
        if exported:
            os.environ.pop("PGPASSWORD", None)


def _given_password(url: str | None, connection: dict[str, str]) -> str | None:
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions

    secrets = dict(ConnectionOptions.parse(url, connection).secrets)
    return secrets["password"].reveal() if "password" in secrets else None


def _run(url: str | None, merged: dict[str, str], parsed: Any, out: str, checkpoint: str,
         bounded: bool, spark: Any, console: Any, own: bool) -> dict[str, Any]:
    from sparkcoord.sources.console import command_session, watch
    from sparkcoord.sources.postgres.stream import PostgresCDC, default_slot_name
    from sparkcoord.spark.job import CoordinatedJob

    with command_session(spark, "sparkcoord-cdc") as (spark, stop):
        job = CoordinatedJob(spark, checkpoint)
        slot = parsed.slot or default_slot_name(job.checkpoint_dir, SOURCE)
        publication = parsed.publication or slot
        console.print(header(url, parsed_names(merged), out, job.checkpoint_dir, slot,
                             bounded), markup=False, highlight=False)
        note = None if own else pgpassword_note(url, merged)
        if note:
            console.print(note, markup=False, highlight=False)
        df = PostgresCDC(job).options(**merged).load(url, name=SOURCE)
        writer = df.writeStream.format("parquet").option("path", out)
        writer = writer.trigger(availableNow=True) if bounded else writer.trigger(
            processingTime="0 seconds")
        handle = job.start(writer)
        target = parsed_names(merged)
        rows, status = watch(handle, SOURCE, stop, console,
                             lambda rows, status, restarts: progress_text(
                                 target, out, rows, status, restarts))
        return {"rows": rows, "restarts": handle.restarts, "last_status": status,
                "slot": slot, "publication": publication}


def parsed_names(options: dict[str, str]) -> str:
    """The captured tables as the source names them (``public.orders, public.customers``), for
    the header and the progress line. Called by :func:`run_cdc` on the command's main
    thread."""
    from sparkcoord.sources.postgres.core.names import parse_tables

    return ", ".join(str(t) for t in parse_tables(options["tables"]))


def header(url: str | None, tables: str, out: str, checkpoint: str, slot: str,
           bounded: bool) -> str:
    """The lines ``sparkcoord cdc`` shows before it runs: where it reads (the URL without its
    password, rule 2), what, where to, and the slot that holds WAL for the job. Called on the
    command's main thread."""
    source = redacted(url) if url else "the database of libpq's environment (PG* variables)"
    until = ("the snapshot and the changes committed before now, then stop" if bounded else
             "the snapshot, then the changes, until Ctrl-C")
    return (f"{source}: {tables} -> {out}\n"
            f"reads {until}; checkpoint {checkpoint}; replication slot {slot}")


def progress_text(tables: str, out: str, rows: int, status: dict[str, Any],
                  restarts: int) -> str:
    """The progress line: tables, sink, rows so far, and the source's phase from its status
    (``job.request("postgres", "status")``: enumerator.py). Called on the command's main
    thread."""
    from sparkcoord.sources.postgres.core.pgoutput import lsn_to_text

    phase = status.get("phase")
    if not status:
        where = "starting"
    elif phase == "setting up":
        where = "setting up the slot and the publication"
        if status.get("waiting"):  # enumerator.py rule 8: what the slot's creation waits for
            blockers = status.get("blocking_pids") or ()
            where += (": the slot's creation waits for transaction(s) holding a transaction "
                      f"id to end (pid {', '.join(map(str, blockers))}; see the WARNING)")
    elif phase == "snapshot":
        planned = f"{status.get('chunks_planned', 0)}" + (
            "" if status.get("planning_done") else "+")
        where = f"snapshot: {status.get('chunks_finished', 0)} of {planned} chunks read"
    elif phase == "hand-over":
        where = (f"snapshot done ({status.get('chunks_finished', 0)} chunks); handing over to "
                 "the stream")
    else:
        confirmed = int(status.get("confirmed_lsn") or 0)
        where = f"{phase}" + (f"; slot confirmed at {lsn_to_text(confirmed)}" if confirmed
                              else "")
    return (f"{tables} -> {out}: {rows:,} rows; {where}"
            + (f"; {restarts} restart(s)" if restarts else ""))


def pgpassword_note(url: str | None, options: dict[str, str]) -> str | None:
    """A hint when a password was given but Spark's processes will have none (they connect with
    libpq's environment: connection.py rule 2): None when ``PGPASSWORD`` or a passfile is
    there. Called by ``sparkcoord cdc`` on its main thread, before Spark starts."""
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions
    from sparkcoord.sources.postgres.stream import parse_cdc_options

    _, connection = parse_cdc_options(options)
    if not ConnectionOptions.parse(url, connection).secrets:
        return None
    passfile = os.environ.get("PGPASSFILE") or os.path.expanduser("~/.pgpass")
    if os.environ.get("PGPASSWORD") or os.path.isfile(passfile):
        return None
    return ("note: the password given in the URL or the options stays in this program; "
            "Spark's processes connect with libpq's environment: export PGPASSWORD (or use "
            "a passfile, PGPASSFILE or ~/.pgpass) before running this command (docs/cdc.md)")
