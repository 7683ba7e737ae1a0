"""Spark's Python processes for a coordinated source, started from compiled code
(docs/decisions/082-compiled-python-start.md).

Spark starts each Python process it needs (a query's source runner at every start and restart,
the daemon that forks the task workers, the data source planners) with
``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on ``PYTHONPATH``, and Spark's
core jar after them. With a pip-installed PySpark, ``SPARK_HOME`` is the installed package
itself, and that zip holds the package's modules again (the same files, plus Spark's tests),
without bytecode: every such process compiles the ~200 modules it imports from source (0.4 s
of a source runner's 0.6 s start on a 2-core machine), and every new task worker reads the
zip's directory again once per package it imported from it (``importlib.invalidate_caches``
when Spark adds its files directory: ~50 ms).

``sparkcoord-python`` (:func:`main`) is an interpreter launcher that leaves such redundant
entries out of ``PYTHONPATH`` and then replaces itself with its interpreter, with the same
arguments and the same process id (Spark stops a Python process by signalling that id, and
talks to it over its inherited descriptors).

Rules:
  1. An entry is left out only if it holds nothing the interpreter would not import the same
     from the rest of the path: ``<pkg>/python/lib/pyspark.zip`` where ``<pkg>`` is the
     ``pyspark`` package directory found on the path without any Spark zip or jar (the zip
     ships inside that package, from the same build); ``<pkg>/python/lib/py4j-<v>-src.zip``
     when the first py4j left on the path is a package directory of version ``<v>``;
     ``<pkg>/jars/spark-core_*.jar`` (the one jar Spark adds; it carries no Python module, a
     test checks the installed one). Then the path without them is checked again: its first
     ``pyspark`` must be ``<pkg>`` itself, or nothing is left out (another Spark's zip further
     on would otherwise be imported). Every other entry stays, in its order, empty ones too
     (an empty entry is the working directory).
  2. The launcher writes nothing to standard output (Spark's daemon reports its port there)
     and changes nothing but ``PYTHONPATH``; if working out the entries fails in any way, it
     says why in one line on standard error (Spark's log) and starts the interpreter with the
     environment as it got it.
  3. The driver gives the launcher to a coordinated source's Python functions
     (:func:`launched_python`) only where every process of the job runs the same
     installation: a classic session in local mode (``local``, ``local[...]``,
     ``local-cluster[...]``: one host) whose Python executable's directory holds
     ``sparkcoord-python`` and whose ``#!`` line names that executable (or another name of
     the same file in that directory: ``python`` and ``python3`` of one environment). Spark
     Connect sessions and clusters start Spark's processes as before;
     ``spark.sparkcoord.pythonLauncher=off`` switches it off.
  4. ``SparkContext.pythonExec`` is one attribute of the whole driver program: it is set and
     restored under one lock, so two threads making jobs at once cannot leave the launcher
     behind. A function another thread wraps in that instant without the lock gets the
     launcher too, which starts the same interpreter (rule 3).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
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
_SPARK_CORE_JAR = re.compile(r"spark-core_[^/\\]+\.jar")
_VERSION = re.compile(r"""__version__\s*=\s*['"](?P<version>[^'"]+)['"]""")
#: the second line of pip's ``/bin/sh`` form of a console script (for an interpreter path too
#: long for a ``#!`` line): three quotes, exec, the path, "$0" "$@"
_SH_EXEC = re.compile(r"^'{3}exec' \"(?P<path>[^\"]+)\" \"\$0\" \"\$@\"$")


def _package_dir(name: str, path: Sequence[str]) -> str | None:
    """The directory of the package ``name`` that importing it from ``path`` would load, found
    without importing it; None if there is none or the first one is inside a zip."""
    spec = PathFinder.find_spec(name, list(path))
    if spec is None or not spec.submodule_search_locations:
        return None
    home = os.path.realpath(list(spec.submodule_search_locations)[0])
    return home if os.path.isdir(home) else None


def _py4j_version(path: Sequence[str]) -> str | None:
    """The version of the py4j package directory on ``path``, read from its ``version.py``."""
    home = _package_dir("py4j", path)
    if home is None:
        return None
    try:
        with open(os.path.join(home, "version.py"), encoding="utf-8") as f:
            found = _VERSION.search(f.read())
    except (OSError, ValueError):
        return None
    return found.group("version") if found else None


def _is_spark_packaging(entry: str) -> bool:
    name = os.path.basename(entry)
    return (name == "pyspark.zip" or _PY4J_ZIP.fullmatch(name) is not None
            or _SPARK_CORE_JAR.fullmatch(name) is not None)


def redundant_entries(entries: Sequence[str], search_path: Sequence[str]) -> set[str]:
    """The entries of ``PYTHONPATH`` (``entries``) that rule 1 leaves out, given the
    interpreter's whole import path (``search_path``, which holds ``entries`` and the
    installation's own directories). Called by :func:`launch_environment` in the launcher
    process, before it replaces itself with the interpreter."""
    candidates = {e for e in entries if _is_spark_packaging(e)}
    if not candidates:
        return set()
    pyspark_home = _package_dir("pyspark", [p for p in search_path if p not in candidates])
    if pyspark_home is None:
        return set()
    lib = os.path.join(pyspark_home, "python", "lib")
    jars = os.path.join(pyspark_home, "jars")
    redundant: set[str] = set()
    py4j_zips: dict[str, str] = {}
    for entry in candidates:
        where = os.path.realpath(os.path.dirname(entry))
        name = os.path.basename(entry)
        if where == lib and name == "pyspark.zip":
            redundant.add(entry)
        elif where == lib and (m := _PY4J_ZIP.fullmatch(name)) is not None:
            py4j_zips[entry] = m.group("version")
        elif where == jars and _SPARK_CORE_JAR.fullmatch(name) is not None:
            redundant.add(entry)
    rest = [p for p in search_path if p not in redundant and p not in py4j_zips]
    for entry, version in py4j_zips.items():
        if _py4j_version(rest) == version:
            redundant.add(entry)
    if _package_dir("pyspark", [p for p in search_path if p not in redundant]) != pyspark_home:
        return set()  # another pyspark further on would be imported instead: leave it be
    return redundant


def launch_environment(environ: dict[str, str], search_path: Sequence[str]) -> dict[str, str]:
    """The environment the interpreter starts with: ``environ`` with rule 1's entries left
    out of ``PYTHONPATH`` (every other entry kept as it is, empty ones too), or ``environ``
    as it is if working them out fails (rule 2). Called by :func:`main` in the launcher
    process."""
    env = dict(environ)
    try:
        entries = env.get("PYTHONPATH", "").split(os.pathsep)
        redundant = redundant_entries([e for e in entries if e], search_path)
        if redundant:
            kept = [e for e in entries if e not in redundant]
            if kept:
                env["PYTHONPATH"] = os.pathsep.join(kept)
            else:
                del env["PYTHONPATH"]
    except Exception as exc:  # noqa: BLE001 - rule 2: start the interpreter as Spark asked
        # one line on standard error (Spark's log), never standard output (rule 2)
        print(f"sparkcoord-python: PYTHONPATH left as Spark set it, so PySpark is compiled "
              f"from its zip in this process: {type(exc).__name__}: {exc}", file=sys.stderr)
        return dict(environ)
    return env


def main() -> None:
    """The ``sparkcoord-python`` console script: Spark runs it where it would run the Python
    executable (``-m pyspark.daemon``, ``-m <module>``, ``-c <code>``, ``-VV``), in a process
    of its own. It replaces itself with its interpreter (same process id and descriptors), the
    same arguments following, in :func:`launch_environment`'s environment."""
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]],
              launch_environment(dict(os.environ), sys.path))


def script_interpreter(script: str) -> str | None:
    """The interpreter a console script runs: its ``#!`` line, or the ``exec`` line of pip's
    ``/bin/sh`` form; None for anything else (a shim, a wrapper script). Called by
    :func:`launcher_for`."""
    try:
        with open(script, encoding="utf-8") as f:
            first, second = f.readline().strip(), f.readline().strip()
    except (OSError, ValueError):
        return None
    if not first.startswith("#!"):
        return None
    line = first[2:].strip()
    if line == "/bin/sh":
        m = _SH_EXEC.match(second)
        return m.group("path") if m else None
    return line if line.startswith("/") and " " not in line else None


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
    found = shutil.which(str(context.pythonExec))
    if found is None:
        return None
    executable = os.path.abspath(found)
    launcher = os.path.join(os.path.dirname(executable), LAUNCHER)
    if not os.access(launcher, os.X_OK):
        return None
    interpreter = script_interpreter(launcher)
    # the same directory, compared unresolved (an environment's python is a link to its base
    # interpreter, which would run without the environment), and the same file
    if interpreter is None or os.path.dirname(interpreter) != os.path.dirname(executable):
        return None
    try:
        return launcher if os.path.samefile(interpreter, executable) else None
    except OSError:
        return None


#: rule 4: ``SparkContext.pythonExec`` is swapped by one thread at a time
_SWAP = threading.RLock()


@contextmanager
def launched_python(spark: Any) -> Iterator[str | None]:
    """Within it, a Python function or data source registered on ``spark`` takes the launcher
    (:func:`launcher_for`) as its interpreter; PySpark reads ``SparkContext.pythonExec`` when
    it wraps one. Called by :class:`~sparkcoord.spark.job.CoordinatedJob` on the driver program
    thread, around its source's registration and ``apply``'s ``mapInArrow`` (rule 4)."""
    launcher = launcher_for(spark)
    if launcher is None:
        yield None
        return
    context = spark.sparkContext
    with _SWAP:
        before = context.pythonExec
        context.pythonExec = launcher
        try:
            yield launcher
        finally:
            context.pythonExec = before
