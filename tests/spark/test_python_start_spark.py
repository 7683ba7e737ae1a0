"""Decision 82 on real Spark (local[2,4]): a coordinated source's runner (where its
coordinator lives), its task workers and a downstream operator's (``mapInArrow``) workers
import PySpark from the installed package, compiled, through the launcher; with
``spark.sparkcoord.pythonLauncher=off`` from Spark's zip, as any Python process Spark starts
does."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord.coordinator import OperatorCoordinator
from sparkcoord.operator import RecipientOperator, SubtaskOperator
from sparkcoord.spark import CoordinatedJob, OperatorSpec
from sparkcoord.spark.python_start import LAUNCHER_SETTING
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark


class WhereCoordinator(OperatorCoordinator):
    """Answers a client request with where its process imported PySpark from."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        pass

    def handle_client_request(self, request: Any) -> Any:
        import pyspark

        return pyspark.__file__

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(None)


class WhereReporter(SubtaskOperator):
    """One row in the first batch: where its task's worker imported PySpark from."""

    def process(self) -> Any:
        if self.context.epoch == 0:
            import pyspark

            yield (pyspark.__file__, self.context.subtask)


class WhereDownstream(RecipientOperator):
    """Passes on where the source's task imported PySpark from, and where its own did."""

    def process_input(self, rows: list[dict[str, Any]]) -> Any:
        import pyspark

        for row in rows:
            yield (row["path"], pyspark.__file__)


def _where(spark: Any, root: str) -> tuple[str, set[str]]:
    """Where the source runner imported PySpark from, and the source's and the downstream
    operator's tasks."""
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    df = job.sources([OperatorSpec("where", WhereCoordinator, WhereReporter, 2)],
                     "path string, subtask int", name="where",
                     recipients=[OperatorSpec("down", WhereCoordinator, WhereDownstream, 2)])
    df = job.apply(df, "down", "path string, downstream string", source="where")
    out = os.path.join(root, "out")
    handle = job.start(df.writeStream.format("parquet").option("path", out)
                       .trigger(processingTime="0 seconds"), timeout_s=120)
    try:
        deadline = time.monotonic() + 120
        while len(sink_rows(spark, out)) < 2:
            assert handle.running and time.monotonic() < deadline, handle.last_failure
            time.sleep(0.2)
        runner = job.request("where", "pyspark")
    finally:
        handle.stop()
    rows = sink_rows(spark, out)
    return runner, {r.path for r in rows} | {r.downstream for r in rows}


def test_the_source_runner_and_its_tasks_import_the_installed_pyspark_not_sparks_zip(
        spark, tmp_path) -> None:
    import pyspark

    installed = pyspark.__file__  # this driver imports the installed package
    assert "pyspark.zip" not in installed
    runner, tasks = _where(spark, str(tmp_path / "launched"))
    assert runner == installed and tasks == {installed}
    # the user's own Python functions are Spark's as before: from the zip
    from pyspark.sql.functions import udf

    where_udf = udf(lambda _: __import__("pyspark").__file__, "string")
    assert "pyspark.zip" in spark.range(1).select(where_udf("id")).first()[0]
    spark.conf.set(LAUNCHER_SETTING, "off")
    try:
        runner, tasks = _where(spark, str(tmp_path / "plain"))
    finally:
        spark.conf.unset(LAUNCHER_SETTING)
    assert "pyspark.zip" in runner and all("pyspark.zip" in t for t in tasks)
