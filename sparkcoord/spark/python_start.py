"""Spark's Python processes for a coordinated source, started from compiled code (decision 82).

Spark starts each Python process it needs (a query's source runner at every start and restart,
the daemon that forks the task workers, the data source planners) with
``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on ``PYTHONPATH``, and Spark's
own jar after them. With a pip-installed PySpark, ``SPARK_HOME`` is the installed package
itself, so that zip is a second copy of the package beside it, without bytecode: every such
process compiles the ~200 modules it imports from source (0.4 s of a source runner's 0.6 s
start on a 2-core machine), and every new task worker reads the zip's directory again once
per package it imported from it (``importlib.invalidate_caches`` when Spark adds its files
directory: ~50 ms).

``sparkcoord-python`` (:func:`main`) is an interpreter launcher that leaves such redundant
entries out of ``PYTHONPATH`` and then replaces itself with its interpreter, with the same
arguments and the same process id (Spark stops a Python process by signalling that id, and
talks to it over its inherited descriptors).

Rules:
  1. An entry is left out only if it holds nothing the interpreter would not import the same
     from the rest of the path: ``<pkg>/python/lib/pyspark.zip`` where ``<pkg>`` is the
     ``pyspark`` package found on the rest of the path (the zip ships inside that package: the
     same release, the same sources); ``<pkg>/python/lib/py4j-<v>-src.zip`` when the py4j
     found on the rest of the path is version ``<v>``; ``<pkg>/jars/*.jar`` (Spark's jars
     carry no Python module; a test checks the installed ones). Every other entry stays, in its
     order; with no ``pyspark`` package on the rest of the path nothing is left out.
  2. The launcher writes nothing to standard output or error (Spark's daemon reports its port
     on standard output) and changes nothing but ``PYTHONPATH``.
  3. The driver gives the launcher to a coordinated source (:func:`launched_python`) only
     where every process of the job runs the same installation: a classic session in local
     mode whose Python executable's directory holds ``sparkcoord-python`` (installed there
     with sparkcoord, so its interpreter is that environment's). Spark Connect sessions and
     clusters start Spark's processes as before; ``spark.sparkcoord.pythonLauncher=off``
     switches it off everywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.machinery import PathFinder
from typing import Any

from sparkcoord.spark.session import is_connect, session_setting

#: the console script (pyproject.toml's [project.scripts])
LAUNCHER = "sparkcoord-python"
#: the Spark setting that switches the launcher off (``off``) or leaves the choice to the
#: driver (``auto``, the default)
LAUNCHER_SETTING = "spark.sparkcoord.pythonLauncher"

_PY4J_ZIP = re.compile(r"py4j-(?P<version>[^/\\]+)-src\.zip")
_VERSION = re.compile(r"""__version__\s*=\s*['"](?P<version>[^'"]+)['"]""")


def _package_dir(name: str, path: Sequence[str]) -> str | None:
    """The directory of the package ``name`` that importing it from ``path`` would load, found
    without importing it."""
    spec = PathFinder.find_spec(name, list(path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _py4j_version(path: Sequence[str]) -> str | None:
    """The version of the py4j package on ``path``, read from its ``version.py``."""
    home = _package_dir("py4j", path)
    if home is None:
        return None
    try:
        with open(os.path.join(home, "version.py"), encoding="utf-8") as f:
            found = _VERSION.search(f.read())
    except OSError:
        return None
    return found.group("version") if found else None


def redundant_entries(entries: Sequence[str], search_path: Sequence[str]) -> set[str]:
    """The entries of ``PYTHONPATH`` (``entries``) that rule 1 leaves out, given the
    interpreter's whole import path (``search_path``, which holds ``entries`` and the
    installation's own directories). Called by :func:`main` in the launcher process, before
    it replaces itself with the interpreter."""
    candidates = {e for e in entries if _is_spark_packaging(e)}
    if not candidates:
        return set()
    rest = [p for p in search_path if p not in candidates]
    pyspark_home = _package_dir("pyspark", rest)
    if pyspark_home is None:
        return set()
    lib = os.path.join(pyspark_home, "python", "lib")
    jars = os.path.join(pyspark_home, "jars")
    redundant = set()
    for entry in candidates:
        where = os.path.realpath(os.path.dirname(entry))
        name = os.path.basename(entry)
        if where == lib and name == "pyspark.zip":
            redundant.add(entry)
        elif where == lib and (m := _PY4J_ZIP.fullmatch(name)) is not None:
            if m.group("version") == _py4j_version(rest):
                redundant.add(entry)
        elif where == jars and name.endswith(".jar"):
            redundant.add(entry)
    return redundant


def _is_spark_packaging(entry: str) -> bool:
    name = os.path.basename(entry)
    return (name == "pyspark.zip" or _PY4J_ZIP.fullmatch(name) is not None
            or name.endswith(".jar"))


def main() -> None:
    """The ``sparkcoord-python`` console script: Spark runs it where it would run the Python
    executable (``-m pyspark.daemon``, ``-m <module>``, ``-c <code>``), in a process of its
    own. It leaves rule 1's entries out of ``PYTHONPATH`` and replaces itself with its
    interpreter, the same arguments following."""
    env = dict(os.environ)
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    redundant = redundant_entries(entries, sys.path)
    if redundant:
        kept = [e for e in entries if e not in redundant]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], env)


def launcher_for(spark: Any) -> str | None:
    """The launcher the job's Python processes may start through (rule 3), or None. Called by
    :func:`launched_python` on the driver program thread."""
    setting = session_setting(spark, LAUNCHER_SETTING, "auto").strip().lower()
    if setting not in ("auto", "off"):
        raise ValueError(f"{LAUNCHER_SETTING} is {setting!r}: it takes 'auto' (the default: "
                         f"start a local session's Python processes from compiled code) or "
                         f"'off'")
    if setting == "off" or is_connect(spark):
        return None
    context = getattr(spark, "sparkContext", None)
    if context is None or not str(context.master).startswith("local"):
        return None
    executable = shutil.which(str(context.pythonExec))
    if executable is None:
        return None
    launcher = os.path.join(os.path.dirname(os.path.abspath(executable)), LAUNCHER)
    return launcher if os.access(launcher, os.X_OK) else None


@contextmanager
def launched_python(spark: Any) -> Iterator[str | None]:
    """Within it, a Python function or data source registered on ``spark`` takes the launcher
    (:func:`launcher_for`) as its interpreter; PySpark reads ``SparkContext.pythonExec`` when
    it wraps one. Called by :class:`~sparkcoord.spark.job.CoordinatedJob` on the driver program
    thread around its source's registration; another thread registering a function in that
    instant gets the launcher too, which starts the same interpreter."""
    launcher = launcher_for(spark)
    if launcher is None:
        yield None
        return
    context = spark.sparkContext
    before = context.pythonExec
    context.pythonExec = launcher
    try:
        yield launcher
    finally:
        context.pythonExec = before
