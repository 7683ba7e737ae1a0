"""The ``sparkcoord`` command."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys

import sparkcoord


def _java_version() -> str:
    java = shutil.which("java")
    if java is None:
        return "not found (install OpenJDK 17)"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else java


def _run_cluster(args: argparse.Namespace) -> int:
    from sparkcoord.spark.cluster import LocalStandaloneCluster

    with LocalStandaloneCluster(args.workers, args.cores, args.memory, host=args.host) as cluster:
        print(f"master  {cluster.master_url}  (status page {cluster.web_url})")
        print(f"logs    {cluster.work_dir}/logs")
        print(f"try     sparkcoord demo --master {cluster.master_url}")
        print("Ctrl-C stops the workers, their executors and the master.", flush=True)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # sigwait takes them instead of handlers
        signal.sigwait(stop)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """``sparkcoord inspect`` (the command's main thread): the report as text or JSON on
    stdout; exit code 0 (no problem), 1 (problems found) or 2 (not a checkpoint directory)."""
    import json

    from sparkcoord.inspection import NotACheckpoint, inspect_checkpoint, render_text

    try:
        report = inspect_checkpoint(args.path, decode=args.decode)
    except NotACheckpoint as exc:
        print(f"sparkcoord inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report), end="")
    return 1 if report["problems"] else 0


def _tail(args: argparse.Namespace) -> int:
    """``sparkcoord tail`` (the command's main thread)."""
    from sparkcoord.sources.files.tail import run_tail

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"sparkcoord tail: --option {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        options[key] = value
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result = run_tail(args.path, args.format, args.out, args.checkpoint, schema=args.schema,
                      options=options, bounded=args.bounded)
    print(f"{result['rows']:,} rows read into {args.out}")
    return 0


def _cdc(args: argparse.Namespace) -> int:
    """``sparkcoord cdc`` (the command's main thread): exit code 0 (stopped by Ctrl-C, or a
    ``--bounded`` run done), 1 (the source or the job failed), 2 (bad arguments). Nothing it
    prints holds the URL's password."""
    from sparkcoord.core.errors import SparkCoordError
    from sparkcoord.sources.postgres.command import cdc_options, run_cdc
    from sparkcoord.sources.postgres.io.connection import redacted

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            shown = "password..." if "password" in item.lower() else repr(item)  # a typo's secret
            print(f"sparkcoord cdc: --option {shown} is not KEY=VALUE", file=sys.stderr)
            return 2
        options[key.strip()] = value
    try:
        cdc_options(args.url, args.tables, options)  # before Spark starts
    except ValueError as exc:
        print(f"sparkcoord cdc: {redacted(str(exc))}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        result = run_cdc(args.url, args.tables, args.out, args.checkpoint, options=options,
                         bounded=args.bounded)
    except (ValueError, SparkCoordError) as exc:
        print(f"sparkcoord cdc: {redacted(str(exc))}", file=sys.stderr)
        return 1
    print(f"{result['rows']:,} rows read into {args.out}")
    print(f"replication slot {result['slot']} holds WAL for this job until it runs again; when "
          f"you retire the job: SELECT pg_drop_replication_slot('{result['slot']}')")
    return 0


#: ``sparkcoord demo [which]``: the coordinators demo (sparkcoord/demo.py, the default) and the
#: PostgreSQL -> Delta pipeline with a driver kill (sparkcoord/demo_pipeline.py)
DEMOS = ("numbers", "pipeline")
_DEMO_OPTIONS = {"numbers": ("fast", "slow", "master"), "pipeline": ("rows", "seconds")}


def _demo_options_of_the_other(args: argparse.Namespace) -> str:
    """The options given that belong to the demo not chosen (``--rows`` for ``numbers``,
    ``--master`` for ``pipeline``), as ``--a, --b``; empty when none."""
    other = next(d for d in DEMOS if d != args.which)
    return ", ".join(f"--{name}" for name in _DEMO_OPTIONS[other]
                     if getattr(args, name) is not None)


def _demo_pipeline(args: argparse.Namespace, workdir: str) -> int:
    """``sparkcoord demo pipeline`` (the command's main thread, ``workdir`` prepared): exit
    code 0 on PASS, 1 otherwise, 130 when interrupted (Ctrl-C or SIGTERM: its PostgreSQL and
    its driver are stopped first)."""
    rows = 2000 if args.rows is None else args.rows
    seconds = 20.0 if args.seconds is None else args.seconds
    from sparkcoord.demo_pipeline import run_pipeline_demo

    try:
        return 0 if run_pipeline_demo(workdir, rows, seconds, prepared=True) else 1
    except KeyboardInterrupt:
        print("sparkcoord demo pipeline: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkcoord", description=sparkcoord.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=sparkcoord.__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a demonstration on local Spark: `demo` (or `demo numbers`), two "
                     "coordinators with injected failures; `demo pipeline`, PostgreSQL -> CDC "
                     "-> Delta with the driver killed in the middle")
    demo.add_argument("which", nargs="?", choices=DEMOS, default="numbers",
                      help="numbers (default): the coordinators demo; pipeline: a PostgreSQL "
                           "the demo starts, a writer, the CDC source into a Delta table by "
                           "key, the driver SIGKILLed and restarted, a verdict comparing both "
                           "tables row by row (needs PostgreSQL 15's server binaries, psycopg "
                           "and deltalake)")
    demo.add_argument("--dir", default="sparkcoord-demo",
                      help="work directory (wiped first; a non-empty one the demo did not "
                           "create is refused unless --force)")
    demo.add_argument("--force", action="store_true",
                      help="wipe --dir even if the demo did not create it")
    demo.add_argument("--fast", type=int, default=None,
                      help="numbers: numbers per subtask, fast coordinator (200)")
    demo.add_argument("--slow", type=int, default=None,
                      help="numbers: numbers per subtask, slow coordinator (10)")
    demo.add_argument("--master", default=None,
                      help="numbers: a standalone master URL (spark://host:port) instead of "
                           "local[2,4]")
    demo.add_argument("--rows", type=int, default=None,
                      help="pipeline: rows of the source table before the writer starts (2000)")
    demo.add_argument("--seconds", type=float, default=None,
                      help="pipeline: how long the writer writes (20); the driver is killed "
                           "after a third of it")
    cluster = sub.add_parser("cluster", help="start a Spark standalone cluster on this machine "
                                             "and keep it up until Ctrl-C")
    cluster.add_argument("--workers", type=int, default=2, help="number of workers")
    cluster.add_argument("--cores", type=int, default=1, help="cores per worker")
    cluster.add_argument("--memory", default="2g", help="memory per worker")
    cluster.add_argument("--host", default="127.0.0.1", help="address everything binds to")
    sub.add_parser("env", help="show what sparkcoord runs on")
    inspect = sub.add_parser(
        "inspect", help="show what a checkpoint directory holds (read only); exit code 1 if a "
                        "file is damaged or missing, 2 if the path is not a checkpoint directory")
    inspect.add_argument("path", help="a CoordinatedJob's checkpoint_dir, or one coordinated "
                                      "source's directory (coordination/<source>)")
    inspect.add_argument("--json", action="store_true", help="one JSON document instead of text")
    inspect.add_argument("--decode", action="store_true",
                         help="unpickle coordinator snapshots and the newest subtask states to "
                              "show their values. Unpickling runs code named in the files: use "
                              "it only on checkpoints you trust (the job's classes must be "
                              "importable)")
    tail = sub.add_parser(
        "tail", help="read the files of a directory (any fsspec URL) into a parquet sink with "
                     "the file source, showing progress, until Ctrl-C (or --bounded)")
    tail.add_argument("path", help="the directory to read (a local path, s3://bucket/prefix, ...)")
    tail.add_argument("--format", default="json", choices=["json", "csv", "parquet"])
    tail.add_argument("--out", required=True, help="the parquet sink's directory")
    tail.add_argument("--checkpoint", required=True, help="the job's checkpoint directory")
    tail.add_argument("--schema", default=None,
                      help="DDL schema (\"id long, name string\"); default: from the first file")
    tail.add_argument("--bounded", action="store_true",
                      help="read the files present at start, then stop")
    tail.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="a file source option, e.g. maxFilesPerTrigger=10 (repeatable)")
    cdc = sub.add_parser(
        "cdc", help="mirror PostgreSQL tables into a parquet sink with the change data capture "
                    "source (a snapshot, then the changes), showing progress, until Ctrl-C "
                    "(or --bounded); docs/cdc.md")
    cdc.add_argument("url", help="the database: postgresql://user@host:5432/db (a password in "
                                 "it stays in this program: Spark's processes need PGPASSWORD "
                                 "or a passfile)")
    cdc.add_argument("--tables", required=True,
                     help="the tables to capture: schema.table names separated by commas")
    cdc.add_argument("--out", required=True, help="the parquet sink's directory")
    cdc.add_argument("--checkpoint", required=True, help="the job's checkpoint directory")
    cdc.add_argument("--bounded", action="store_true",
                     help="read the snapshot and the changes committed before the run started, "
                          "then stop (an availableNow run)")
    cdc.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="a source option (startupMode=latest, chunkSize=50000, ...) or a libpq "
                          "keyword (sslmode=require, ...) (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "tail":
        return _tail(args)
    if args.command == "cdc":
        return _cdc(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "env":
        import pyspark
        print(f"sparkcoord {sparkcoord.__version__}")
        print(f"python     {sys.version.split()[0]} ({sys.executable})")
        print(f"pyspark    {pyspark.__version__}")
        print(f"java       {_java_version()}")
        return 0
    if args.command == "demo":
        from sparkcoord.demo import WorkDirNotOurs, prepare_workdir, run_demo, spark_log_settings

        wrong = _demo_options_of_the_other(args)
        if wrong:
            print(f"sparkcoord demo {args.which}: {wrong} belong(s) to the other demo",
                  file=sys.stderr)
            return 2
        if (args.rows is not None and args.rows < 1) or (args.seconds is not None
                                                         and args.seconds <= 0):
            print("sparkcoord demo pipeline: --rows must be >= 1 and --seconds > 0",
                  file=sys.stderr)
            return 2
        workdir = os.path.abspath(args.dir)
        try:
            prepare_workdir(workdir, args.force)  # before Spark starts: refuse in a second
        except WorkDirNotOurs as exc:
            print(f"sparkcoord demo: {exc}", file=sys.stderr)
            return 2
        if args.which == "pipeline":
            return _demo_pipeline(args, workdir)
        args.fast = 200 if args.fast is None else args.fast
        args.slow = 10 if args.slow is None else args.slow
        spark = None
        if args.master:
            from sparkcoord.spark.cluster import standalone_session_builder

            builder = standalone_session_builder(args.master, "sparkcoord-demo")
            for key, value in spark_log_settings(workdir).items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
        try:
            return 0 if run_demo(workdir, args.fast, args.slow, spark=spark, prepared=True) else 1
        finally:
            if spark is not None:
                spark.stop()
    if args.command == "cluster":
        return _run_cluster(args)
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
