"""The ``sparkcoord`` command."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import sparkcoord


def _java_version() -> str:
    java = shutil.which("java")
    if java is None:
        return "not found (install OpenJDK 17)"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else java


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkcoord", description=sparkcoord.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=sparkcoord.__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demonstration pipeline on local Spark")
    demo.add_argument("--dir", default="sparkcoord-demo", help="work directory (wiped first)")
    demo.add_argument("--fast", type=int, default=200, help="numbers per subtask, fast coordinator")
    demo.add_argument("--slow", type=int, default=10, help="numbers per subtask, slow coordinator")
    sub.add_parser("env", help="show what sparkcoord runs on")
    args = parser.parse_args(argv)
    if args.command == "env":
        import pyspark
        print(f"sparkcoord {sparkcoord.__version__}")
        print(f"python     {sys.version.split()[0]} ({sys.executable})")
        print(f"pyspark    {pyspark.__version__}")
        print(f"java       {_java_version()}")
        return 0
    if args.command == "demo":
        from sparkcoord.demo import run_demo

        return 0 if run_demo(os.path.abspath(args.dir), args.fast, args.slow) else 1
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
