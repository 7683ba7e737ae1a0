"""``sparkcoord inspect`` on the checkpoint directory a real run left (local Spark)."""

from __future__ import annotations

import json
import os

import pytest

from sparkcoord.cli import main
from sparkcoord.inspection import inspect_checkpoint
from tests.spark.helpers import numbers_job, sink_rows

pytestmark = pytest.mark.spark
N = 6


def digits(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def all_committed(spark_checkpoint: str) -> bool:
    offsets = digits(os.path.join(spark_checkpoint, "offsets"))
    return bool(offsets) and offsets[-1] in digits(os.path.join(spark_checkpoint, "commits"))


def test_inspect_maps_every_spark_batch_to_its_epoch_and_finds_a_real_runs_checkpoint_intact(
        spark, tmp_path, capsys) -> None:
    job, df = numbers_job(spark, str(tmp_path), total=N)
    out = str(tmp_path / "out")
    # as tests.spark.helpers.run_until_rows, but also until Spark's commit log has the newest
    # batch: the sink's rows become visible just before Spark writes the commit, and a stop in
    # between would leave the newest batch uncommitted (a restore point this test does not want)
    writer = (df.writeStream.format("parquet").option("path", out)
              .trigger(processingTime="0 seconds"))
    job.run(writer, until=lambda: len(sink_rows(spark, out)) >= 2 * N
            and all_committed(job.spark_checkpoint), poll_s=0.5, timeout_s=240)
    assert len(sink_rows(spark, out)) == 2 * N
    offsets = digits(os.path.join(job.spark_checkpoint, "offsets"))
    commits = set(digits(os.path.join(job.spark_checkpoint, "commits")))
    assert offsets, "Spark logged no batch"

    report = inspect_checkpoint(job.checkpoint_dir)
    assert report["kind"] == "job" and report["spark_checkpoint"] == job.spark_checkpoint
    assert report["problems"] == []
    [source] = report["sources"]
    assert source["name"] == "numbers"

    # the batch -> epoch mapping covers every batch Spark logged, with our epoch in each
    batches = source["batches"]
    assert [b["batch"] for b in batches] == offsets
    assert [b["committed"] for b in batches] == [b in commits for b in offsets]
    epochs = [b["epoch"] for b in batches]
    # Spark's first batch may carry epoch -1 (nothing sealed yet: decision 15)
    assert all(isinstance(e, int) and e >= -1 for e in epochs) and max(epochs) >= 0
    assert epochs == sorted(epochs)
    assert [b["new_epoch"] for b in batches] == [
        e != -1 and (i == 0 or e != epochs[i - 1]) for i, e in enumerate(epochs)]

    # the restore point is what the next run computes: the newest batch, committed
    restore = source["restore_point"]
    newest = offsets[-1]
    assert restore["batch"] == newest and restore["epoch"] == epochs[-1] == max(epochs)
    assert restore["committed"] is (newest in commits)
    assert restore["status"] == ("committed" if newest in commits else "uncommitted")
    assert restore["committed"] is True, f"batch {newest} did not commit before the stop"

    # every record decodes; the restore point has one; the run id is there, the secret never
    assert source["record_epochs"] and restore["epoch"] in source["record_epochs"]
    for record in source["records"]:
        assert "error" not in record
        assert [c["name"] for c in record["coordinators"]] == ["numbers"]
    assert source["channel"] is not None and source["channel"]["run"]
    assert "secret" not in source["channel"]
    assert source["last_failure"] is None
    assert sorted(s["subtask"] for s in source["states"]) == ["numbers[0]", "numbers[1]"]

    decoded = inspect_checkpoint(job.checkpoint_dir, decode=True)
    newest_record = decoded["sources"][0]["records"][-1]
    snapshot = newest_record["coordinators"][0]["snapshot"]
    assert snapshot["value"]["next"] == [N, N]  # the state as data (its repr for the text)
    assert f"'next': [{N}, {N}]" in snapshot["repr"]

    assert main(["inspect", job.checkpoint_dir]) == 0
    assert "no problems found" in capsys.readouterr().out
    assert main(["inspect", job.checkpoint_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report
