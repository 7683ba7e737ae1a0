"""What a coordinated source's task loads into Spark's Python worker.

PySpark's worker daemon runs a full ``gc.collect()`` after every task, so every object a
worker's imports leave behind is walked once per task (decision 32). A task of a coordinated
source (unpickle the reader and the partition, run the subtask) must therefore not import
fsspec or the driver's service, storage and job runner. Each check runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

DRIVER_ONLY = ["fsspec", "asyncio", "sparkcoord.runtime.service", "sparkcoord.runtime.inbox",
               "sparkcoord.runtime.inbox_attempts", "sparkcoord.runtime.storage",
               "sparkcoord.runtime.inbound_logs",
               "sparkcoord.spark.driver", "sparkcoord.spark.job", "sparkcoord.spark.supervisor",
               "sparkcoord.spark.handle", "sparkcoord.spark.requests", "sparkcoord.spark.failures",
               "sparkcoord.spark.progress", "sparkcoord.runtime.holder",
               "sparkcoord.runtime.holder_context", "sparkcoord.runtime.holder_checkpoints",
               "sparkcoord.runtime.service_restore", "sparkcoord.runtime.service_checkpoints"]


def modules_after(script: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)
                          + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         check=True, capture_output=True, text=True, timeout=120)
    return set(out.stdout.split())


def test_a_subtask_task_runs_without_importing_fsspec_or_the_drivers_modules(tmp_path) -> None:
    from pyspark import cloudpickle

    from sparkcoord.examples.steady import SCHEMA, SteadyCoordinator, SteadyOperator
    from sparkcoord.spark.source import CoordinatedStreamReader
    from sparkcoord.spark.spec import CoordinatedPartition, OperatorSpec, SourceSpec

    spec = SourceSpec("steady", str(tmp_path / "coordination"),
                      [OperatorSpec("steady", SteadyCoordinator, SteadyOperator, 2)], SCHEMA,
                      checkpoint_interval_s=0)
    # A real driver side in this process with a sealed epoch: the task talks to it once, at
    # its end, to say it finished (docs/protocol.md [every-attempt-finishes])
    driver = CoordinatedStreamReader(spec)
    try:
        start = driver.initialOffset()
        part = driver.partitions(start, driver.latestOffset(start))[1]
        assert isinstance(part, CoordinatedPartition) and part.index == 1 and part.events
        reader = cloudpickle.dumps(CoordinatedStreamReader(spec))
        partition = cloudpickle.dumps(part)
        expected = [("steady", 1, v, v, part.epoch) for v in range(len(part.events))]
        loaded = modules_after(f"""
            import pickle
            reader = pickle.loads({reader!r})
            rows = list(reader.read(pickle.loads({partition!r})))
            assert rows == {expected!r}, rows
        """)
    finally:
        driver.stop()
    assert "sparkcoord.spark.subtask" in loaded  # the task really ran the subtask runtime
    assert not loaded & set(DRIVER_ONLY), sorted(loaded & set(DRIVER_ONLY))


def test_a_stateful_subtask_writes_and_restores_its_state_without_fsspec(tmp_path) -> None:
    url = str(tmp_path / "job")
    loaded = modules_after(f"""
        from sparkcoord.core.ids import SubtaskId
        from sparkcoord.runtime.subtask_state import SubtaskStateStore
        store = SubtaskStateStore.for_url({url!r}, retain=1)
        sid = SubtaskId("op", 3)
        for epoch in range(5):
            store.read_before(sid, epoch)
            store.write(sid, epoch, b"state%d" % epoch)
        assert store.read_before(sid, 4) == (3, b"state3")
        assert sorted(store.epochs(sid)) == [3, 4], store.epochs(sid)
    """)
    assert "fsspec" not in loaded


def test_the_driver_still_reads_what_a_worker_wrote(tmp_path) -> None:
    from sparkcoord.core.ids import SubtaskId
    from sparkcoord.runtime.storage import CheckpointStorage
    from sparkcoord.runtime.subtask_state import SubtaskStateStore

    url = f"file://{tmp_path}/job"
    SubtaskStateStore.for_url(url).write(SubtaskId("op", 0), 2, b"from a worker")
    assert CheckpointStorage(url).read_subtask_state(SubtaskId("op", 0), 3) == (2, b"from a worker")


def test_a_driver_side_on_a_local_checkpoint_directory_does_not_import_fsspec(tmp_path) -> None:
    # fsspec's import is ~25 ms of every source runner's start and restart (decision 85)
    from pyspark import cloudpickle

    from sparkcoord.examples.steady import SCHEMA, SteadyCoordinator, SteadyOperator
    from sparkcoord.spark.spec import OperatorSpec, SourceSpec

    spec = SourceSpec("steady", str(tmp_path / "coordination"),
                      [OperatorSpec("steady", SteadyCoordinator, SteadyOperator, 2)], SCHEMA,
                      checkpoint_interval_s=0)
    loaded = modules_after(f"""
        import pickle
        from sparkcoord.spark.source import CoordinatedStreamReader
        driver = CoordinatedStreamReader(pickle.loads({cloudpickle.dumps(spec)!r}))
        start = driver.initialOffset()
        end = driver.latestOffset(start)
        assert end["epoch"] > start["epoch"], (start, end)
        assert len(driver.partitions(start, end)) == 2
        driver.stop()
    """)
    assert "sparkcoord.runtime.storage" in loaded  # the driver side really ran
    assert "fsspec" not in loaded


def test_a_remote_checkpoint_directory_still_gives_tools_its_fsspec_filesystem(tmp_path) -> None:
    from sparkcoord.runtime.storage import CheckpointStorage

    local = CheckpointStorage(str(tmp_path / "job"))
    memory = CheckpointStorage("memory://footprint/job")
    assert local.fs.exists(f"{local.root}/records")
    assert type(memory.fs).__name__ == "MemoryFileSystem"
    assert memory.fs.exists(f"{memory.root}/records")
