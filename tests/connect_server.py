"""A real Spark Connect server for tests, started from the pyspark package (its jars ship the
server) on loopback, in local mode ``local[2,4]`` so that tasks can be retried."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConnectServer:
    """``spark-submit --class SparkConnectServer`` as a child process on 127.0.0.1.

    Its Python workers (the coordinated source's runner, the tasks) run this interpreter, and
    its working directory is ``workdir``: a different one from the test's, as a remote
    server's would be.
    """

    def __init__(self, workdir: str, master: str = "local[2,4]") -> None:
        import pyspark

        self.port = _free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        home = os.path.dirname(pyspark.__file__)
        env = dict(os.environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # the tests' own coordinators and operators (tests.spark...) must import on the server
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
        self.log_path = os.path.join(workdir, "connect-server.log")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            [os.path.join(home, "bin", "spark-submit"), "--class", SERVER_CLASS,
             "--name", "sparkcoord-connect-tests", "--master", master,
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={self.port}",
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", "spark.sql.streaming.stopTimeout=30s"],
            cwd=workdir, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self._wait_until_listening(timeout_s=180)

    def _wait_until_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with "
                                   f"{self._process.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the Spark Connect server did not listen within {timeout_s} s: "
                           f"{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-chars:]

    def session(self) -> Any:
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).getOrCreate()

    def stop(self) -> None:
        if self._process.poll() is None:
            # the whole group: the JVM and the Python workers it started
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._log.close()
