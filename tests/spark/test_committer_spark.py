"""Commits once per committed batch on real Spark (issue 25 item 7, docs/committer.md): the
docs' manifest committer and wrapping example run as written; with a fail_job in the middle
and a committer that fails its first calls, every file is still in exactly one manifest."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
from typing import Any

import pytest

from tests.spark.files_kill_job import failing_enumerator
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "committer.md"
FILES = 7


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def write_files(data: pathlib.Path, negative: bool = False) -> list[str]:
    """``FILES`` JSON-lines files of ten ids each (odd ids negative with ``negative``)."""
    data.mkdir()
    paths = []
    for f in range(FILES):
        path = data / f"part-{f:03d}.json"
        ids = range(f * 10, f * 10 + 10)
        path.write_text("".join(json.dumps({"id": -i if negative and i % 2 else i}) + "\n"
                                for i in ids))
        paths.append(str(path))
    return paths


def manifests(directory: pathlib.Path) -> dict[int, list[str]]:
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            body = json.loads((directory / name).read_text())
            out[body["epoch"]] = body["files"]
    return out


def test_the_manifest_committer_of_the_docs_lists_every_file_once_after_its_batch(
        spark, tmp_path) -> None:
    data, manifest_dir = tmp_path / "data", tmp_path / "manifests"
    paths = write_files(data)
    manifest_dir.mkdir()
    namespace: dict[str, Any] = {"spark": spark, "checkpoint": str(tmp_path / "ckpt"),
                                 "data": str(data), "out": str(tmp_path / "out"),
                                 "manifests": str(manifest_dir)}
    exec(compile(blocks()[0], str(DOC), "exec"), namespace)  # noqa: S102
    assert namespace["report"].failures == []
    listed = manifests(manifest_dir)
    # 2 files per trigger: several batches, each file in exactly one manifest
    assert len(listed) >= FILES // 2, listed
    names = [os.path.basename(f) for files in listed.values() for f in files]
    assert sorted(names) == sorted(os.path.basename(p) for p in paths), listed
    assert sorted(r.id for r in sink_rows(spark, str(tmp_path / "out"))) == list(
        range(FILES * 10))


def test_a_failing_committer_and_a_fail_job_still_list_every_file_in_exactly_one_manifest(
        spark, tmp_path) -> None:
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    data, manifest_dir, markers = tmp_path / "data", tmp_path / "manifests", tmp_path / "m"
    write_files(data)
    manifest_dir.mkdir()
    calls = str(tmp_path / "calls")

    def publish(epoch: int, splits: Any) -> None:  # runs in the source's runner process
        with open(calls, "a") as log:
            log.write(f"{epoch}\n")
        if sum(1 for _ in open(calls)) <= 2:
            raise OSError("the manifest store is down")  # the first two calls fail
        path = manifest_dir / f"manifest-{epoch:06d}.json"
        if not path.exists():
            path.write_text(json.dumps({"epoch": epoch,
                                        "files": sorted({p for s in splits
                                                         for p in s.paths})}))

    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    spec, struct = (FileStream(job).format("json").schema("id long")
                    .options(bounded="true", maxFilesPerTrigger="2").committer(publish)
                    .operator_spec(str(data)))
    spec = dataclasses.replace(spec, coordinator=functools.partial(
        failing_enumerator, marker_dir=str(markers), at=3, **spec.coordinator.keywords))
    df = job.sources([spec], struct, name="files")
    report = job.run(df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                     .trigger(availableNow=True), timeout_s=240)
    assert report.restarts == 1 and os.listdir(markers) == ["fail_job"], report
    listed = [os.path.basename(f) for files in manifests(manifest_dir).values() for f in files]
    assert sorted(listed) == [f"part-{f:03d}.json" for f in range(FILES)], listed
    assert sorted(r.id for r in sink_rows(spark, str(tmp_path / "out"))) == list(
        range(FILES * 10))


def test_the_wrapping_example_of_the_docs_runs_its_reader_and_enumerator(
        spark, tmp_path) -> None:
    from sparkcoord.spark import CoordinatedJob

    data = tmp_path / "data"
    write_files(data, negative=True)
    namespace: dict[str, Any] = {"spark": spark, "data": str(data),
                                 "job": CoordinatedJob(spark, str(tmp_path / "ckpt"))}
    exec(compile("from sparkcoord.sources import FileStream\n" + blocks()[1], str(DOC),
                 "exec"), namespace)  # noqa: S102
    job, out = namespace["job"], str(tmp_path / "out")
    report = job.run(namespace["wrapped"].writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    ids = sorted(r.id for r in sink_rows(spark, out))
    assert ids == [i for i in range(FILES * 10) if i % 2 == 0], ids  # negatives dropped


def test_an_available_now_run_reports_done_only_after_its_last_commit_returned(
        spark, tmp_path) -> None:
    # Spark stops the source only after the query ended, so a run used to report done while
    # its last batch's commit still ran (or never ran, when the runner was gone first): a
    # commit that takes a while must be done, and its manifest written, when run() returns
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    data, manifest_dir = tmp_path / "data", tmp_path / "manifests"
    write_files(data)
    manifest_dir.mkdir()

    def publish(epoch: int, splits: Any) -> None:  # runs in the source's runner process
        import time

        time.sleep(2.0)  # a slow store: widens the window the run used to end in
        (manifest_dir / f"manifest-{epoch:06d}.json").write_text(json.dumps(
            {"epoch": epoch, "files": sorted({p for s in splits for p in s.paths})}))

    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("json").schema("id long")
          .options(maxFilesPerTrigger="4").committer(publish).load(str(data)))
    report = job.run(df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                     .trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    listed = [os.path.basename(f) for files in manifests(manifest_dir).values() for f in files]
    assert sorted(listed) == [f"part-{f:03d}.json" for f in range(FILES)], listed
