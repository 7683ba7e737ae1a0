"""The lake sink's coordinator (sparkcoord/sinks/coordinator.py) driven by hand as the runtime
drives it, on real Delta and Iceberg tables in tmp_path: the test thread plays the mailbox, the
commit worker runs on its own thread."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.committer import LedgerState
from sparkcoord.coordinator import Cancellable, CoordinatorContext, Withdrawn
from sparkcoord.sinks import CheckpointBehindTable
from sparkcoord.sinks.cleanup import list_data_files
from sparkcoord.sinks.coordinator import FileWritten, SinkCoordinator, SinkState
from sparkcoord.sinks.files import DataFile, TaskFileWriter
from sparkcoord.sinks.target import SinkTarget, TableShapeError
from tests.sinks.conftest import SCHEMA, rows
from tests.sinks.lakes import Lake

KINDS = ["delta", "iceberg"]
JOB = "job"


class FakeContext(CoordinatorContext):
    """The runtime's side: ``fail_job`` records, the mailbox is a queue the test runs."""

    def __init__(self) -> None:
        self.operator_id = "sink"
        self.parallelism = 2
        self.failures: list[BaseException | str] = []
        self.mailbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def fail_job(self, cause: BaseException | str) -> None:
        self.failures.append(cause)

    def run_in_coordinator_thread(self, action: Callable[[], None]) -> None:
        self.mailbox.put(action)

    def call_periodically(self, interval_s: float, action: Callable[[], None]) -> Cancellable:
        raise NotImplementedError

    def is_coordinator_thread(self) -> bool:
        return True

    def run_mailbox(self) -> None:
        while True:
            try:
                action = self.mailbox.get_nowait()
            except queue.Empty:
                return
            action()


class GatedSinkCoordinator(SinkCoordinator):
    """Each commit waits for ``gate`` first: a commit that is still running, on demand."""

    def __init__(self, context: CoordinatorContext, target: SinkTarget) -> None:
        super().__init__(context, target)
        self.gate = threading.Event()

    def _commit(self, epoch: int, files: Sequence[Any]) -> None:
        assert self.gate.wait(30)
        super()._commit(epoch, files)


class Table:
    """The sink's table in ``root``, its target, and the coordinators started on it."""

    def __init__(self, kind: str, root: Any) -> None:
        self.lake = Lake(kind, root)  # the Iceberg catalog "sinks" and namespace "lake"
        if kind == "delta":
            uri = f"{root}/table"
            self.target = SinkTarget("delta", uri, JOB, SCHEMA, uri)
        else:
            target = SinkTarget("iceberg", "lake.t", JOB, SCHEMA, "", catalog_name="sinks",
                                catalog={"uri": f"sqlite:///{root}/catalog.db",
                                         "warehouse": f"file://{root}/warehouse"})
            self.target = dataclasses.replace(
                target, location=target.committer().prepare_table())
        self.coordinators: list[SinkCoordinator] = []

    def start(self, checkpoint_id: int = -1, state: SinkState | None = None,
              cls: type[SinkCoordinator] = SinkCoordinator, *,
              committed: bool = False) -> tuple[Any, FakeContext]:
        """A coordinator restored from ``checkpoint_id``; ``committed``: its batch had
        committed in Spark (the runtime replays it: ``context.restored_committed``)."""
        context = FakeContext()
        context.restored_committed = committed
        coordinator = cls(context, self.target)
        coordinator.reset_to_checkpoint(checkpoint_id, state)
        coordinator.start()
        self.coordinators.append(coordinator)
        return coordinator, context

    def write(self, epoch: int, data: pa.Table, *, subtask: int = 0, attempt: int = 0,
              job_id: str = JOB, target_file_bytes: int = 1 << 30) -> list[DataFile]:
        writer = TaskFileWriter(self.target.location, job_id, epoch, subtask, attempt, SCHEMA,
                                target_file_bytes=target_file_bytes, row_group_rows=100)
        return writer.write_all([data])

    def read(self) -> pa.Table:
        """The table's rows sorted by id (none while a Delta table does not exist yet)."""
        if self.lake.kind == "delta":
            from deltalake.exceptions import TableNotFoundError

            try:
                return self.lake.read()
            except TableNotFoundError:
                return rows(0, 0)
        return self.lake.read()

    def data_files(self) -> set[str]:
        return set(list_data_files(self.target.location))


@pytest.fixture(params=KINDS)
def table(request: Any, tmp_path: Any) -> Iterator[Table]:
    t = Table(request.param, tmp_path)
    yield t
    for coordinator in t.coordinators:
        coordinator.close()


def report(coordinator: SinkCoordinator, files: list[DataFile], subtask: int = 0,
           attempt: int = 0) -> None:
    for f in files:
        coordinator.handle_event_from_operator(subtask, attempt, FileWritten(f))


def checkpoint(coordinator: SinkCoordinator, checkpoint_id: int) -> SinkState:
    result: Future[Any] = Future()
    coordinator.checkpoint_coordinator(checkpoint_id, result)
    context = coordinator.context
    assert isinstance(context, FakeContext)
    # a run's first checkpoint completes on the mailbox once the fence passed (rule 9)
    wait_until(lambda: (context.run_mailbox(), result.done())[1])
    state = result.result()
    assert isinstance(state, SinkState)
    return state


def settle(coordinator: SinkCoordinator, context: FakeContext) -> None:
    """Wait for the commits handed over, then run the mailbox (their done reports)."""
    ending = coordinator.run_ending()
    if ending is not None:
        wait_until(lambda: ending.done() or bool(context.failures))
        assert context.failures == []
        ending.result()
    context.run_mailbox()


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def paths(*groups: list[DataFile]) -> set[str]:
    return {f.path for group in groups for f in group}


def commit_epoch(table: Table, coordinator: SinkCoordinator, context: FakeContext, epoch: int,
                 data: pa.Table) -> list[DataFile]:
    """One whole epoch: the boundary, the batch's report, its commit, done reported."""
    checkpoint(coordinator, epoch)
    files = table.write(epoch, data)
    report(coordinator, files)
    coordinator.notify_checkpoint_complete(epoch)
    settle(coordinator, context)
    return files


def test_files_reported_in_a_batch_are_committed_after_its_checkpoint_completes_not_before(
        table: Table) -> None:
    coordinator, context = table.start()
    checkpoint(coordinator, 0)
    first = table.write(0, rows(0, 1000), subtask=0, target_file_bytes=4000)
    second = table.write(0, rows(0, 20, start=5000), subtask=1)
    assert len(first) > 1
    report(coordinator, first, 0)
    report(coordinator, second, 1)
    settle(coordinator, context)
    assert table.read().num_rows == 0  # the batch has not committed in Spark yet
    coordinator.notify_checkpoint_complete(0)
    settle(coordinator, context)
    epoch0 = pa.concat_tables([rows(0, 1000), rows(0, 20, start=5000)])
    assert table.read().equals(epoch0)
    state = checkpoint(coordinator, 1)
    assert state.committed_through == 0 and state.ledger.pending == {}
    report(coordinator, table.write(1, rows(1, 10)))
    settle(coordinator, context)
    assert table.read().equals(epoch0)
    coordinator.notify_checkpoint_complete(1)
    settle(coordinator, context)
    assert table.read().equals(pa.concat_tables([epoch0, rows(1, 10)]))
    assert context.failures == []


def test_a_subtask_reset_withdraws_its_files_and_the_cleanup_deletes_them_after_the_commit(
        table: Table) -> None:
    coordinator, context = table.start()
    checkpoint(coordinator, 0)
    kept = table.write(0, rows(0, 10), subtask=0)
    failed = table.write(0, rows(0, 10, start=100), subtask=1, attempt=0)
    report(coordinator, kept, 0, 0)
    report(coordinator, failed, 1, 0)
    coordinator.subtask_reset(1, 0)  # subtask 1's task failed; its retry writes the rows again
    retry = table.write(0, rows(0, 10, start=100), subtask=1, attempt=1)
    report(coordinator, retry, 1, 1)
    assert table.data_files() == paths(kept, failed, retry)
    coordinator.notify_checkpoint_complete(0)
    settle(coordinator, context)
    assert table.read().equals(pa.concat_tables([rows(0, 10), rows(0, 10, start=100)]))
    assert table.data_files() == paths(kept, retry)
    assert context.failures == []


def test_a_restore_replaying_a_batch_the_table_already_holds_commits_that_epoch_once(
        table: Table) -> None:
    first, first_context = table.start()
    commit_epoch(table, first, first_context, 0, rows(0, 10))
    state = checkpoint(first, 1)
    assert state.committed_through == 0 and state.ledger.pending == {}
    files = table.write(1, rows(1, 20))
    report(first, files)
    first.notify_checkpoint_complete(1)
    first.run_ending().result(timeout=30)  # epoch 1 is in the table...
    first.close()  # ...and the driver died before its done report ran on the mailbox
    assert table.target.committer().table_epoch() == 1
    second, context = table.start(1, state, committed=True)
    report(second, files)  # the restore replays the batch's logged events
    second.notify_checkpoint_complete(1)
    settle(second, context)
    assert context.failures == []
    assert table.read().equals(pa.concat_tables([rows(0, 10), rows(1, 20)]))
    after = checkpoint(second, 2)
    assert after.committed_through == 1 and after.ledger.pending == {}
    assert paths(files) <= table.data_files()


def test_a_fresh_start_under_a_job_id_the_table_holds_fails_the_job_and_commits_nothing(
        table: Table) -> None:
    first, first_context = table.start()
    commit_epoch(table, first, first_context, 0, rows(0, 10))
    first.close()
    files = table.data_files()
    fresh, context = table.start()  # reset(-1): a new checkpoint, the same job id
    # rule 9: the run's first checkpoint is declined with the refusal, so its batch, the
    # first whose tasks would write, never runs
    with pytest.raises(CheckpointBehindTable):
        checkpoint(fresh, 0)
    cause = context.failures[0]
    assert isinstance(cause, CheckpointBehindTable) and cause.permanent
    assert table.target.table in str(cause)
    assert all(isinstance(c, CheckpointBehindTable) for c in context.failures)
    assert fresh.handle_client_request("status")["pending"] == []
    assert table.read().equals(rows(0, 10))
    assert table.data_files() == files


def test_the_orphan_sweep_at_start_deletes_only_our_unheld_files_of_final_epochs(
        table: Table) -> None:
    first, first_context = table.start()
    committed = commit_epoch(table, first, first_context, 0, rows(0, 10))
    first.close()
    orphan = table.write(1, rows(1, 10))  # a failed attempt's file: never reported
    pending = table.write(2, rows(2, 10))  # reported; its commit not done at checkpoint 3
    foreign = table.write(1, rows(1, 10), job_id="other")
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(table.target.location)
    stray = "data/part-00000-spark.parquet"
    fs.pipe_file(f"{root.rstrip('/')}/{stray}", b"not ours")
    state = SinkState(LedgerState({2: tuple(pending)}), committed_through=0)
    coordinator, context = table.start(3, state)  # the batch of 3 did not commit: it reruns
    rerun = table.write(3, rows(3, 10))
    report(coordinator, rerun)
    coordinator.notify_checkpoint_complete(3)
    settle(coordinator, context)
    assert context.failures == []
    assert table.data_files() == paths(committed, pending, foreign, rerun) | {stray}
    assert not paths(orphan) & table.data_files()
    assert table.read().equals(pa.concat_tables([rows(0, 10), rows(2, 10), rows(3, 10)]))


def test_run_ending_is_none_without_a_worker_and_completes_once_the_pending_commit_is_done(
        table: Table) -> None:
    coordinator, context = table.start(cls=GatedSinkCoordinator)
    assert coordinator.run_ending() is None  # no checkpoint yet: no commit worker
    checkpoint(coordinator, 0)
    idle = coordinator.run_ending()
    assert idle is not None
    idle.result(timeout=30)  # nothing handed over
    report(coordinator, table.write(0, rows(0, 10)))
    coordinator.notify_checkpoint_complete(0)
    ending = coordinator.run_ending()
    assert ending is not None
    time.sleep(0.2)
    assert not ending.done()  # the commit waits at the gate
    assert table.read().num_rows == 0
    coordinator.gate.set()
    ending.result(timeout=30)
    assert table.read().equals(rows(0, 10))
    context.run_mailbox()
    assert checkpoint(coordinator, 1).committed_through == 0
    restored, _ = table.start(1, SinkState(committed_through=0))
    assert restored.run_ending() is None


def test_a_withdrawn_history_takes_the_file_out_of_the_epochs_commit(table: Table) -> None:
    coordinator, context = table.start()
    checkpoint(coordinator, 0)
    kept = table.write(0, rows(0, 10))
    dropped = table.write(0, rows(0, 10, start=100))
    report(coordinator, kept + dropped, 0, 0)
    # the retry (attempt 1) adopted the history and finished without sending the second file
    coordinator.handle_items_withdrawn(
        0, 1, [Withdrawn(item=FileWritten(f), is_request=False) for f in dropped])
    coordinator.notify_checkpoint_complete(0)
    settle(coordinator, context)
    assert table.read().equals(rows(0, 10))
    assert table.data_files() == paths(kept)
    assert context.failures == []


def test_the_status_request_says_what_is_committed_pending_and_how_long_commits_took(
        table: Table) -> None:
    coordinator, context = table.start()
    status = coordinator.handle_client_request("status")
    assert status["committed_through"] == -1 and status["commits"] == 0
    commit_epoch(table, coordinator, context, 0, rows(0, 10))
    checkpoint(coordinator, 1)
    report(coordinator, table.write(1, rows(1, 10)))
    status = coordinator.handle_client_request("status")
    assert status["committed_through"] == 0 and status["pending"] == []
    assert status["commits"] == 1 and len(status["commit_s"]) == 1
    assert status["commit_s"][0] > 0 and status["job_id"] == JOB
    with pytest.raises(ValueError, match="answers 'status'"):
        coordinator.handle_client_request("stats")


def test_a_rerun_epoch_another_writer_committed_is_refused_and_its_files_are_kept(
        table: Table) -> None:
    # found by review: an uncommitted restore's rerun epoch counted as "pending in the
    # checkpoint", so a copy of the checkpoint that committed it first was taken for us, our
    # commit skipped, and the cleanup deleted the other writer's committed file
    first, first_context = table.start()
    commit_epoch(table, first, first_context, 0, rows(0, 5))
    state = checkpoint(first, 1)  # batch 1 never commits: the driver is killed
    first.close()
    other, other_context = table.start(1, state)  # a copy of the checkpoint runs batch 1
    report(other, table.write(1, rows(1, 7, start=100)))
    other.notify_checkpoint_complete(1)
    settle(other, other_context)
    other.close()
    before = table.read()
    ours, context = table.start(1, state)  # the first job restarts at its uncommitted epoch
    report(ours, table.write(1, rows(1, 3, start=200)))
    ours.notify_checkpoint_complete(1)
    wait_until(lambda: bool(context.failures))
    # the table is ahead of what this checkpoint knows: refused at the fence's opening
    assert isinstance(context.failures[0], CheckpointBehindTable), context.failures
    assert "another job runs under the same job id" in str(context.failures[0])
    assert table.read().equals(before)  # every referenced file still there: readable


def test_an_existing_table_of_other_columns_fails_the_job_naming_them_and_commits_nothing(
        table: Table) -> None:
    # found by review: files of another shape were committed and every read then failed
    first, first_context = table.start()
    commit_epoch(table, first, first_context, 0, rows(0, 5))
    first.close()
    other = pa.schema([pa.field(f.name, pa.string()) for f in SCHEMA])
    wrong = SinkCoordinator(FakeContext(), dataclasses.replace(table.target, schema=other))
    wrong.reset_to_checkpoint(0, None)
    wrong.start()
    table.coordinators.append(wrong)
    with pytest.raises(TableShapeError):  # rule 9: declined before its batch writes
        checkpoint(wrong, 1)
    context = wrong.context
    assert isinstance(context.failures[0], TableShapeError), context.failures
    assert "column types differ" in str(context.failures[0])
    assert table.read().equals(rows(0, 5))


def merge_target(uri: str) -> SinkTarget:
    """A Delta table at ``uri`` merged by key from test_changes' change rows."""
    from tests.sinks.test_changes import ROW
    from tests.sinks.test_changes import SCHEMA as CHANGES

    return SinkTarget("delta", uri, JOB, pa.schema(list(ROW)), uri, mode="merge",
                      input_schema=CHANGES, keys=("id",))


def stage_changes(uri: str) -> list[DataFile]:
    """Epoch 0's staged change rows (two reads of key 10), as subtask 0 writes them."""
    from tests.sinks.test_changes import SCHEMA as CHANGES
    from tests.sinks.test_changes import changes

    return TaskFileWriter(uri, JOB, 0, 0, 0, CHANGES, row_group_rows=10).write_all(
        [changes(("r", 10, None, 1, "a"), ("r", 10, None, 2, "b"))])


def fresh(target: SinkTarget, cls: type[SinkCoordinator] = SinkCoordinator
          ) -> tuple[SinkCoordinator, FakeContext]:
    """A coordinator of ``target`` started with nothing checkpointed."""
    return restored(target, -1, None, cls)


def restored(target: SinkTarget, checkpoint_id: int, state: SinkState | None,
             cls: type[SinkCoordinator] = SinkCoordinator
             ) -> tuple[SinkCoordinator, FakeContext]:
    """A coordinator of ``target`` started from ``state``, checkpoint ``checkpoint_id``'s (a
    restore after a restart)."""
    context = FakeContext()
    coordinator = cls(context, target)
    coordinator.reset_to_checkpoint(checkpoint_id, state)
    coordinator.start()
    return coordinator, context


def test_a_merge_epoch_committed_and_cleaned_but_not_reported_is_skipped_after_a_restore(
        tmp_path: Any) -> None:
    # the cleanup after a merge deletes its staged files; a restore that commits the epoch
    # again must see it in the table without reading them (it retried forever before)
    uri = f"{tmp_path}/merged"
    target = merge_target(uri)
    first, first_context = fresh(target)
    state = checkpoint(first, 0)
    staged = stage_changes(uri)
    report(first, staged)
    first.notify_checkpoint_complete(0)
    settle(first, first_context)
    first.close()  # the done report never reached a checkpoint: the restored one has it pending
    assert not (set(list_data_files(uri)) & paths(staged))  # the cleanup deleted them
    second_context = FakeContext()
    second_context.restored_committed = True
    second = SinkCoordinator(second_context, target)
    second.reset_to_checkpoint(0, state)
    second.start()
    report(second, staged)  # the replay of batch 0's reports
    second.notify_checkpoint_complete(0)
    settle(second, second_context)
    second.close()
    from deltalake import DeltaTable

    assert sorted(DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()) == [1, 2]


class BrokenStoreCoordinator(SinkCoordinator):
    """Every commit fails as a store that went away would."""

    def _commit(self, epoch: int, files: Sequence[Any]) -> None:
        raise OSError(f"store unavailable (epoch {epoch})")


def test_a_commit_that_keeps_failing_fails_the_job_naming_the_epoch_and_the_error(
        table: Table, monkeypatch: Any) -> None:
    import functools

    import sparkcoord.sinks.coordinator as module
    from sparkcoord.committer import CommitStuck, CommitWorker

    # the worker's thresholds shrunk: stuck after 3 failures, however short the time
    monkeypatch.setattr(module, "CommitWorker", functools.partial(
        CommitWorker, retry_delay_s=0.01, max_retry_delay_s=0.01, stuck_after_s=0.0,
        stuck_after_failures=3))
    coordinator, context = table.start(cls=BrokenStoreCoordinator)
    checkpoint(coordinator, 0)
    report(coordinator, table.write(0, rows(0, 10)))
    coordinator.notify_checkpoint_complete(0)
    wait_until(lambda: bool(context.failures))
    cause = context.failures[0]
    assert isinstance(cause, CommitStuck)
    assert "'sink'" in str(cause) and "epoch 0" in str(cause)
    assert "store unavailable" in str(cause)
    assert coordinator.handle_client_request("status")["pending"] == [0]  # still pending


class KilledBeforeCleanup(SinkCoordinator):
    """The commit lands; the process dies before the cleanup after it (``lake-committed``)."""

    def _sweep(self, final_through: int, held: set[str],
               epochs: tuple[int, int] | None = None) -> None:
        if epochs is not None:
            raise SystemExit("killed")  # ends the commit worker's thread here
        super()._sweep(final_through, held, epochs)


def test_a_merge_epoch_pending_in_a_later_checkpoint_has_its_staged_files_deleted_after_a_restore(
        tmp_path: Any) -> None:
    uri = f"{tmp_path}/merged"
    target = merge_target(uri)
    first, context = fresh(target, KilledBeforeCleanup)
    checkpoint(first, 0)
    staged = stage_changes(uri)
    report(first, staged)
    first.notify_checkpoint_complete(0)  # the merge of 0 goes to the worker...
    state = checkpoint(first, 1)  # ...and checkpoint 1 is taken while it is pending
    assert list(state.ledger.pending) == [0]
    wait_until(lambda: target.committer().table_epoch() == 0)  # merged, then the "kill"
    first.close()
    assert paths(staged) <= set(list_data_files(uri))
    # epoch 0 pending, at or below the sweep's bound
    second, second_context = restored(target, 1, state)
    checkpoint(second, 2)
    settle(second, second_context)
    assert second_context.failures == []
    assert not paths(staged) & set(list_data_files(uri))  # kept forever before the fix
    second.close()


def test_a_commit_whose_value_is_out_of_range_fails_the_job_at_once_naming_table_and_epoch(
        table: Table, monkeypatch: Any) -> None:
    import sparkcoord.sinks.coordinator as module

    def overflowing(*_: Any, **__: Any) -> Any:
        raise OverflowError("date value out of range")

    # what a statistic past datetime.max did before it was left out (issue 43 finding 1)
    monkeypatch.setattr("sparkcoord.sinks.delta.add_action", overflowing)
    monkeypatch.setattr("sparkcoord.sinks.iceberg.iceberg_data_file", overflowing)
    coordinator, context = table.start()
    checkpoint(coordinator, 0)
    report(coordinator, table.write(0, rows(0, 10)))
    coordinator.notify_checkpoint_complete(0)
    wait_until(lambda: bool(context.failures))
    cause = context.failures[0]
    # the first failure, not the worker's CommitStuck after minutes of retries
    assert isinstance(cause, module.ValueOutOfRange), cause
    assert "epoch 0" in str(cause) and table.target.name in str(cause)
    assert "date value out of range" in str(cause)
    assert coordinator.handle_client_request("status")["pending"] == [0]
    assert table.read().num_rows == 0


def test_files_deleted_before_their_epochs_commit_fail_the_job_naming_them_and_commit_nothing(
        table: Table) -> None:
    import os

    from sparkcoord.sinks.coordinator import FilesMissing

    coordinator, context = table.start()
    commit_epoch(table, coordinator, context, 0, rows(0, 10))
    checkpoint(coordinator, 1)
    files = table.write(1, rows(1, 30)) + table.write(1, rows(1, 30, start=100), subtask=1)
    report(coordinator, files[:1])
    report(coordinator, files[1:], subtask=1)
    # a maintenance that deletes unreferenced files (VACUUM retaining 0 hours) runs now
    location = table.target.location.removeprefix("file://")
    os.remove(f"{location}/{files[0].path}")
    coordinator.notify_checkpoint_complete(1)
    wait_until(lambda: bool(context.failures))
    cause = context.failures[0]
    assert isinstance(cause, FilesMissing) and cause.permanent
    assert files[0].path in str(cause) and "epoch 1" in str(cause)
    assert f"1 of the {len(files)} data file(s)" in str(cause)
    assert table.read().equals(rows(0, 10))  # the table does not reference a missing file
    assert coordinator.handle_client_request("status")["pending"] == [1]


def test_an_epoch_the_table_holds_is_not_refused_when_maintenance_removed_its_files_since(
        table: Table) -> None:
    import os

    first, first_context = table.start()
    commit_epoch(table, first, first_context, 0, rows(0, 10))
    state = checkpoint(first, 1)
    files = table.write(1, rows(1, 20))
    report(first, files)
    first.notify_checkpoint_complete(1)
    first.run_ending().result(timeout=30)  # epoch 1 is in the table...
    first.close()  # ...and the driver died before its done report ran on the mailbox
    location = table.target.location.removeprefix("file://")
    os.remove(f"{location}/{files[0].path}")  # replaced and vacuumed since, say
    second, context = table.start(1, state, committed=True)
    report(second, files)  # the restore replays the batch's logged events
    second.notify_checkpoint_complete(1)
    settle(second, context)
    assert context.failures == []
    assert checkpoint(second, 2).committed_through == 1
