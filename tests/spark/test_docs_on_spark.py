"""The examples of docs/spark.md and docs/sources.md that need Spark run as written (issue 14
item 8): each ```python block is executed in a fresh namespace, in a temporary working
directory (the examples use relative paths), with the tests' session as ``spark``."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from tests.spark.helpers import sink_rows
from tests.test_docs_examples import python_blocks

pytestmark = pytest.mark.spark


def test_the_job_example_of_spark_md_runs_and_ends_exactly_once(
        spark, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    block = python_blocks("spark.md")[0]
    namespace: dict[str, object] = {"__name__": "__main__"}  # classes pickled by value
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "docs/spark.md", "exec"), namespace)  # noqa: S102
    handle = namespace["handle"]
    assert handle.exception() is None and not handle.running  # type: ignore[attr-defined]
    assert handle.report.failures == []  # type: ignore[attr-defined]
    rows = sink_rows(spark, str(tmp_path / "out"))
    by_subtask: dict[int, list[int]] = {}
    for r in rows:
        by_subtask.setdefault(r.subtask, []).append(r.value)
    # each subtask got its coordinator's numbers once, in order, from 0 on
    assert sorted(by_subtask) == [0, 1], by_subtask
    for values in by_subtask.values():
        assert sorted(values) == list(range(len(values))) and len(values) > 0, values
    assert "RunReport(" in out.getvalue()


def test_the_read_files_example_of_sources_md_runs_as_written(
        spark, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.makedirs("events")
    with open("events/part-0.json", "w") as f:
        f.writelines(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(100))
    blocks = python_blocks("sources.md")
    namespace: dict[str, object] = {"__name__": "__main__", "spark": spark}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "docs/sources.md", "exec"), namespace)  # noqa: S102
    handle = namespace["handle"]
    assert handle.exception() is None and not handle.running  # type: ignore[attr-defined]
    printed = out.getvalue()
    assert "'finished':" in printed and "'pending':" in printed, printed
    # the storage options fragment builds a source on the same job
    exec(compile(blocks[1], "docs/sources.md", "exec"), namespace)  # noqa: S102
