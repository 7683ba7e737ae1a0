"""A Spark standalone cluster on this machine, started from the pyspark package.

The pip-installed pyspark ships ``bin/spark-class`` but not the ``sbin/start-*.sh`` scripts, so
:class:`LocalStandaloneCluster` runs the master and each worker as foreground JVMs with
``spark-class``: executors then run in their own JVMs (children of a worker) with their own
Python workers, which is what a real cluster does and local mode does not. ``sparkcoord
cluster`` starts one from the command line; the cluster tests and ``scripts/soak.py --scenario
cluster`` use the class.

Everything binds to ``host`` (loopback by default), ports are picked free at start, and the
logs of every process go to ``<work_dir>/logs``.

Thread model: one owner thread starts and stops the cluster; nothing here is shared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from sparkcoord.core.errors import SparkCoordError


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def standalone_session_builder(master_url: str, app_name: str = "sparkcoord", *,
                               host: str = "127.0.0.1", python: str = sys.executable,
                               executor_memory: str = "1g") -> Any:
    """A SparkSession builder whose driver runs here and talks to the standalone ``master_url``.

    Driver program thread, before the session exists. The driver binds to ``host``; executors'
    Python workers run ``python``; every task may be retried (``spark.task.maxFailures`` is 4
    on a cluster). Add your own settings to the builder before ``getOrCreate()``.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", python)
    return (SparkSession.builder.master(master_url).appName(app_name)
            .config("spark.driver.host", host)
            .config("spark.driver.bindAddress", host)
            .config("spark.executor.memory", executor_memory)
            .config("spark.pyspark.python", python)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false"))


class LocalStandaloneCluster:
    """A standalone master and ``workers`` workers as child processes of this one.

    Use it as a context manager, or call :meth:`start` and :meth:`stop` from the thread that
    owns it. ``python`` is the interpreter the executors' Python workers run (the one sparkcoord
    is installed in); the driver passes it to them as ``PYSPARK_PYTHON``.
    """

    def __init__(self, workers: int = 1, cores_per_worker: int = 2,
                 memory_per_worker: str = "2g", host: str = "127.0.0.1",
                 work_dir: str | None = None, python: str = sys.executable,
                 start_timeout_s: float = 90.0) -> None:
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, got workers={workers}")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.host = host
        self._own_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="sparkcoord-cluster-")
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.master_url = ""
        self.web_url = ""
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    # ------------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Start the master and the workers and wait until every worker is ALIVE (owner thread).

        Returns the master URL (``spark://host:port``). Raises :class:`SparkCoordError` with
        the tail of the failing process's log when the cluster does not come up in time.
        """
        from pyspark.find_spark_home import _find_spark_home

        spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
        logs = os.path.join(self.work_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        port, web = _free_port(self.host), _free_port(self.host)
        self.master_url = f"spark://{self.host}:{port}"
        self.web_url = f"http://{self.host}:{web}"
        self._launch("master", [spark_class, "org.apache.spark.deploy.master.Master",
                                "--host", self.host, "--port", str(port), "--webui-port", str(web)])
        for i in range(self.workers):
            work = os.path.join(self.work_dir, f"worker-{i}")
            os.makedirs(work, exist_ok=True)
            self._launch(f"worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", self.host, "--webui-port", str(_free_port(self.host)),
                "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
                "--work-dir", work])
        try:
            self._wait_until_alive()
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master (owner thread; idempotent)."""
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for _, proc in reversed(self._procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self._procs.clear()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> LocalStandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------------- session
    def session_builder(self, app_name: str = "sparkcoord") -> Any:
        """A SparkSession builder for a driver on this machine talking to this cluster.

        Driver program thread. See :func:`standalone_session_builder`.
        """
        return standalone_session_builder(self.master_url, app_name, host=self.host,
                                          python=self.python)

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications). Any thread."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as resp:
            result: dict[str, Any] = json.loads(resp.read().decode())
            return result

    # ------------------------------------------------------------------------- helpers
    def _launch(self, name: str, argv: list[str]) -> None:
        env = dict(os.environ, SPARK_LOCAL_IP=self.host, PYSPARK_PYTHON=self.python,
                   SPARK_LOG_DIR=os.path.join(self.work_dir, "logs"))
        log = open(os.path.join(self.work_dir, "logs", f"{name}.log"), "ab")
        try:
            # own process group: stop() signals the worker together with its executors
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        finally:
            log.close()
        self._procs.append((name, proc))

    def _wait_until_alive(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer from the master"
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise SparkCoordError(f"cluster {name} exited with {proc.returncode}:\n"
                                          f"{self._log_tail(name)}")
            try:
                status = self.status()
                alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
                if status.get("status") == "ALIVE" and len(alive) >= self.workers:
                    return
                last = f"master {status.get('status')}, {len(alive)}/{self.workers} workers alive"
            except OSError as exc:
                last = f"master status page not up: {exc}"
            time.sleep(0.5)
        raise SparkCoordError(f"the standalone cluster did not come up in {self.start_timeout_s}s "
                              f"({last}); master log:\n{self._log_tail('master')}")

    def _log_tail(self, name: str, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.work_dir, "logs", f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"
