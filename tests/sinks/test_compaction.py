"""Compaction (sparkcoord/sinks/compaction.py): the planner alone, then the sink's coordinator
driven by hand on real Delta and Iceberg tables with the tasks' rewrite played by the test
(``compaction.rewrite``, what a sink task runs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkcoord.coordinator import SubtaskGateway
from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.sinks.compaction import (
    CompactionAssigned,
    CompactionPlanner,
    FilesCompacted,
    bin_paths,
    rewrite,
)
from sparkcoord.sinks.coordinator import SinkCoordinator, SinkState
from sparkcoord.sinks.files import ColumnStats, DataFile
from tests.sinks.conftest import SCHEMA, rows
from tests.sinks.test_sink_coordinator import (
    FakeContext,
    Table,
    checkpoint,
    paths,
    report,
    settle,
)

# ---------------------------------------------------------------------------- the planner


def small(name: str, size: int) -> DataFile:
    return DataFile(f"data/{name}.parquet", 1, size, (("id", ColumnStats(0, 1, 1, 8)),))


def test_a_bin_closes_at_the_target_size_and_what_is_left_waits_for_more_small_files() -> None:
    planner = CompactionPlanner(1000)
    planner.files_committed([small(f"f{i}", 300) for i in range(5)])
    state = planner.checkpoint_taken(0, parallelism=4)
    assert [f.path for f in planner.bin_for(0, 0)] == [f"data/f{i}.parquet" for i in range(4)]
    assert planner.bin_for(0, 1) == () and planner.bin_for(1, 0) == ()
    assert [f.path for f in state.small] == ["data/f4.parquet"]
    assert list(state.plans) == [0]


def test_files_of_half_the_target_or_more_are_never_planned() -> None:
    planner = CompactionPlanner(1000)
    planner.files_committed([small("big", 500), small("bigger", 2000), small("s", 499)])
    assert planner.small_files == 1


def test_a_bin_closes_at_max_files_and_each_subtask_gets_at_most_one() -> None:
    planner = CompactionPlanner(10**9, max_files=3)
    planner.files_committed([small(f"f{i}", 10) for i in range(10)])
    planner.checkpoint_taken(5, parallelism=2)
    assert [len(planner.bin_for(5, s)) for s in range(3)] == [3, 3, 0]
    assert planner.small_files == 4


def test_a_bin_whose_batch_committed_without_its_swap_is_given_back_first_in_line() -> None:
    planner = CompactionPlanner(100)
    planner.files_committed([small(f"f{i}", 40) for i in range(6)])
    planner.checkpoint_taken(0, parallelism=2)
    swapped, unswapped = planner.bin_for(0, 0), planner.bin_for(0, 1)
    assert len(swapped) == 3 and len(unswapped) == 3
    planner.files_committed([small("late", 40)])
    planner.batch_committed(0, [bin_paths(swapped)])  # subtask 1 got no task in that batch
    planner.checkpoint_taken(1, parallelism=1)
    assert planner.bin_for(1, 0) == unswapped  # given back, ahead of the newer file
    assert planner.small_files == 1


def test_a_plan_is_part_of_the_checkpoint_and_stands_when_that_checkpoint_is_taken_again() -> None:
    planner = CompactionPlanner(100)
    planner.files_committed([small(f"f{i}", 40) for i in range(3)])
    state = planner.checkpoint_taken(3, parallelism=1)
    assert planner.bin_for(3, 0)
    restored = CompactionPlanner(100, state=state)
    restored.files_committed([small(f"more{i}", 40) for i in range(3)])
    restored.restored(3)
    restored.checkpoint_taken(3, parallelism=2)  # a re-take after the restore plans nothing new
    assert restored.bin_for(3, 0) == planner.bin_for(3, 0)
    assert restored.bin_for(3, 1) == ()


def test_a_restore_drops_the_plans_of_epochs_before_its_checkpoint_without_giving_them_back(
        ) -> None:
    planner = CompactionPlanner(100)
    planner.files_committed([small(f"f{i}", 40) for i in range(6)])
    state = planner.checkpoint_taken(2, parallelism=2)
    assert planner.bin_for(2, 1)
    restored = CompactionPlanner(100, state=state)
    restored.restored(3)  # the batch of 2 committed: its swaps may be in the table already
    restored.batch_committed(3, [])
    assert restored.small_files == 0 and restored.bin_for(2, 0) == ()


def test_a_checkpoint_id_that_does_not_grow_is_an_error_naming_both() -> None:
    planner = CompactionPlanner(100)
    planner.checkpoint_taken(4, parallelism=1)
    with pytest.raises(CheckpointIdRegression, match="4.*4"):
        planner.checkpoint_taken(4, parallelism=1)


# ------------------------------------------------------------- the coordinator on tables

TARGET = 12_000  # bytes: a 10-row file of SCHEMA is ~1.8 KB, so a bin holds 7


@pytest.fixture(params=["delta", "iceberg"])
def lake(request: Any, tmp_path: Any) -> Iterator[Table]:
    t = Table(request.param, tmp_path)
    t.target = dataclasses.replace(t.target, compaction=True, target_file_bytes=TARGET)
    yield t
    for coordinator in t.coordinators:
        coordinator.close()


class Gateway(SubtaskGateway):
    """A subtask's gateway that keeps what the coordinator sent."""

    def __init__(self, subtask: int) -> None:
        self.subtask, self.attempt = subtask, 0
        self.sent: list[Any] = []

    def send_event(self, event: Any) -> Any:
        self.sent.append(event)
        return None


def start(table: Table, *args: Any, **kwargs: Any) -> tuple[Any, FakeContext, list[Gateway]]:
    """``table.start`` and the gateways of its two subtasks, as the runtime hands them."""
    coordinator, context = table.start(*args, **kwargs)
    gateways = [Gateway(i) for i in range(context.parallelism)]
    for g in gateways:
        coordinator.execution_attempt_ready(g.subtask, 0, g)
    return coordinator, context, gateways


def bin_of(gateways: list[Gateway], epoch: int, subtask: int = 0) -> tuple[str, ...]:
    """The bin the coordinator sent ``subtask`` for ``epoch`` (empty: none)."""
    got = [e for e in gateways[subtask].sent if e.epoch == epoch]
    assert len(got) <= 1 and all(isinstance(e, CompactionAssigned) for e in got)
    return got[0].inputs if got else ()


def current_files(table: Table) -> set[str]:
    """The data files of the table's current version, relative to its location."""
    if table.lake.kind == "delta":
        from deltalake import DeltaTable

        adds = pa.table(DeltaTable(table.target.location).get_add_actions())
        return {str(p) for p in adds.column("path").to_pylist()}
    t = table.target.load_catalog().load_table(table.target.table)
    prefix = table.target.location.rstrip("/") + "/"
    return {str(p).replace("file://", "").replace(prefix.replace("file://", ""), "")
            for p in t.inspect.files().column("file_path").to_pylist()}


def small_epoch(table: Table, coordinator: SinkCoordinator, context: FakeContext,
                gateways: list[Gateway], epoch: int, *, compact_with: int | None = 0,
                fail_after: bool = False) -> tuple[list[DataFile], FilesCompacted | None]:
    """One epoch of 10 rows from subtask 0 and, if it has a bin, subtask ``compact_with``'s
    rewrite of it, as a sink task does after its rows (``task.py`` rule 6)."""
    checkpoint(coordinator, epoch)
    files = table.write(epoch, rows(epoch, 10))
    report(coordinator, files)
    swap = None
    if compact_with is not None:
        got = bin_of(gateways, epoch, compact_with)
        if got:
            swap = rewrite(table.target.location, table.target.job_id, epoch, compact_with, 0,
                           SCHEMA, got, target_file_bytes=TARGET)
            coordinator.handle_event_from_operator(compact_with, 0, swap)
    if not fail_after:
        coordinator.notify_checkpoint_complete(epoch)
        settle(coordinator, context)
    return files, swap


def until_a_bin(table: Table, coordinator: SinkCoordinator, context: FakeContext,
                gateways: list[Gateway]) -> tuple[int, tuple[str, ...], SinkState, list[DataFile]]:
    """Small epochs committed one by one until a checkpoint sends subtask 0 a bin: that
    epoch, its bin, its checkpointed state and its files (reported, the batch still runs)."""
    for epoch in range(12):
        state = checkpoint(coordinator, epoch)
        files = table.write(epoch, rows(epoch, 10))
        report(coordinator, files)
        got = bin_of(gateways, epoch)
        if got:
            return epoch, got, state, files
        coordinator.notify_checkpoint_complete(epoch)
        settle(coordinator, context)
    raise AssertionError("no bin was planned in 12 epochs of small files")


def expected(epochs: range) -> pa.Table:
    return pa.concat_tables([rows(e, 10) for e in epochs])


def test_small_files_of_earlier_epochs_are_swapped_for_one_file_in_a_later_epochs_commit(
        lake: Table) -> None:
    coordinator, context, gateways = start(lake)
    swaps = [small_epoch(lake, coordinator, context, gateways, e)[1] for e in range(12)]
    done = [s for s in swaps if s is not None]
    assert done, "no bin was planned in 12 epochs of small files"
    assert context.failures == []
    assert lake.read().equals(expected(range(12)))  # no row lost or doubled by a swap
    current = current_files(lake)
    for swap in done:
        assert len(swap.outputs) == 1 and paths(list(swap.outputs)) <= current
        assert not set(swap.inputs) & current
        # replaced, not deleted: an older version of the table still reads them
        assert set(swap.inputs) <= lake.data_files()
    assert len(current) < 12
    status = coordinator.handle_client_request("status")
    assert status["small_files"] is not None and status["small_files"] < 12


def test_a_swap_whose_input_is_no_longer_in_the_table_is_left_out_and_its_output_deleted(
        lake: Table) -> None:
    coordinator, context, gateways = start(lake)
    for e in range(8):
        _, swap = small_epoch(lake, coordinator, context, gateways, e, compact_with=None)
        assert swap is None
    checkpoint(coordinator, 8)
    got = bin_of(gateways, 8)
    assert got
    # someone else removes one of the bin's files from the table meanwhile
    victim = got[0]
    if lake.lake.kind == "delta":
        from deltalake import DeltaTable

        DeltaTable(lake.target.location).delete(f"id = {first_id(victim)}")
    else:
        t = lake.target.load_catalog().load_table(lake.target.table)
        t.delete(f"id = {first_id(victim)}")
    swap = rewrite(lake.target.location, lake.target.job_id, 8, 0, 0, SCHEMA, got,
                   target_file_bytes=TARGET)
    coordinator.handle_event_from_operator(0, 0, swap)
    coordinator.notify_checkpoint_complete(8)
    settle(coordinator, context)
    assert context.failures == []
    want = expected(range(8)).filter(pc.field("id") != first_id(victim))
    assert lake.read().equals(want)  # the deleted row did not come back through the swap
    assert not paths(list(swap.outputs)) & lake.data_files()


def first_id(path: str) -> int:
    """The first row id of a file ``Table.write`` wrote (``rows``: epoch * 10,000)."""
    epoch = int(path.split(".e", 1)[1].split(".", 1)[0])
    return epoch * 10_000


def test_a_retried_subtask_gets_the_same_bin_and_only_the_retrys_rewrite_is_swapped_in(
        lake: Table) -> None:
    coordinator, context, gateways = start(lake)
    epoch, got, _, _ = until_a_bin(lake, coordinator, context, gateways)
    failed = rewrite(lake.target.location, lake.target.job_id, epoch, 0, 0, SCHEMA, got,
                     target_file_bytes=TARGET)
    coordinator.handle_event_from_operator(0, 0, failed)
    coordinator.subtask_reset(0, epoch)  # the task failed after reporting; Spark retries it
    # (the retry gets the same sealed event: the runtime's part, core/valve.py rule 3)
    report(coordinator, lake.write(epoch, rows(epoch, 10), attempt=1))
    retry = rewrite(lake.target.location, lake.target.job_id, epoch, 0, 1, SCHEMA, got,
                    target_file_bytes=TARGET)
    coordinator.handle_event_from_operator(0, 1, retry)
    coordinator.notify_checkpoint_complete(epoch)
    settle(coordinator, context)
    assert context.failures == []
    assert lake.read().equals(expected(range(epoch + 1)))
    current = current_files(lake)
    assert paths(list(retry.outputs)) <= current
    assert not paths(list(failed.outputs)) & lake.data_files()  # cleanup deleted them


def test_a_restore_after_the_swap_committed_but_before_its_report_swaps_nothing_twice(
        lake: Table) -> None:
    first, first_context, first_gateways = start(lake)
    epoch, got, state, files = until_a_bin(lake, first, first_context, first_gateways)
    swap = rewrite(lake.target.location, lake.target.job_id, epoch, 0, 0, SCHEMA, got,
                   target_file_bytes=TARGET)
    first.handle_event_from_operator(0, 0, swap)
    first.notify_checkpoint_complete(epoch)
    first.run_ending().result(timeout=30)  # the swap is in the table...
    first.close()  # ...and the driver died before the done report
    assert paths(list(swap.outputs)) <= current_files(lake)
    # the restore: the batch committed in Spark, its log is replayed (same reports, and the
    # same answer to the same request: the plan is in the restored state)
    second, context, gateways = start(lake, epoch, state, committed=True)
    assert state.compaction is not None
    assert bin_paths(state.compaction.plans[epoch][0]) == got  # in the restored state
    report(second, files)
    second.handle_event_from_operator(0, 0, swap)
    second.notify_checkpoint_complete(epoch)
    settle(second, context)
    assert context.failures == []
    assert lake.read().equals(expected(range(epoch + 1)))
    # and the next epochs go on compacting what the first start had not
    for e in range(epoch + 1, epoch + 8):
        small_epoch(lake, second, context, gateways, e)
    assert context.failures == []
    assert lake.read().equals(expected(range(epoch + 8)))


def test_a_bin_of_a_subtask_that_got_no_task_is_planned_again_at_the_next_checkpoint(
        lake: Table) -> None:
    coordinator, context, gateways = start(lake)
    epoch, got, _, _ = until_a_bin(lake, coordinator, context, gateways)
    coordinator.notify_checkpoint_complete(epoch)  # subtask 0 never rewrote its bin
    settle(coordinator, context)
    checkpoint(coordinator, epoch + 1)
    assert bin_of(gateways, epoch + 1) == got


def delete_row(lake: Table, row_id: int) -> None:
    """Another writer deletes one row (the file holding it is rewritten without it)."""
    if lake.lake.kind == "delta":
        from deltalake import DeltaTable

        DeltaTable(lake.target.location).delete(f"id = {row_id}")
    else:
        lake.target.load_catalog().load_table(lake.target.table).delete(f"id = {row_id}")


def test_another_writers_commit_between_the_swaps_check_and_its_commit_leaves_the_swap_out(
        lake: Table, monkeypatch: Any) -> None:
    # found by a review: delta-rs rebased the blind append over another writer's OPTIMIZE,
    # removed the inputs a second time and added their rewrite: the rewritten rows were in
    # the table twice (Delta: an OPTIMIZE of the table; Iceberg: a delete of one row)
    from sparkcoord.sinks.delta import DeltaCommitter
    from sparkcoord.sinks.iceberg import IcebergCommitter

    coordinator, context, gateways = start(lake)
    epoch, got, _, _ = until_a_bin(lake, coordinator, context, gateways)
    swap = rewrite(lake.target.location, lake.target.job_id, epoch, 0, 0, SCHEMA, got,
                   target_file_bytes=TARGET)
    coordinator.handle_event_from_operator(0, 0, swap)
    cls, name = ((DeltaCommitter, "_swap_actions") if lake.lake.kind == "delta" else
                 (IcebergCommitter, "_swapped_entries"))
    checked = getattr(cls, name)
    raced: list[int] = []

    def racing(self: Any, table: Any, swaps: Any) -> Any:
        result = checked(self, table, swaps)  # the inputs are current on this read...
        if not raced:  # ...and another writer's commit lands now
            raced.append(first_id(got[0]))
            if lake.lake.kind == "delta":
                from deltalake import DeltaTable

                DeltaTable(lake.target.location).optimize.compact()
            else:
                delete_row(lake, raced[0])
        return result

    monkeypatch.setattr(cls, name, racing)
    coordinator.notify_checkpoint_complete(epoch)
    settle(coordinator, context)
    assert context.failures == [] and raced
    want = expected(range(epoch + 1))
    if lake.lake.kind == "iceberg":
        want = want.filter(pc.field("id") != raced[0])
    assert lake.read().equals(want)
    assert not paths(list(swap.outputs)) & lake.data_files()  # left out, and deleted


class CommitBlocked(SinkCoordinator):
    """A coordinator whose commits wait for ``gate``; one killed meanwhile never commits."""

    block = False
    killed = False

    def __init__(self, context: Any, target: Any) -> None:
        super().__init__(context, target)
        import threading

        self.gate = threading.Event()

    def _commit(self, epoch: int, items: Any) -> None:
        if self.block:
            assert self.gate.wait(30)
            if self.killed:
                raise RuntimeError("driver killed")
        super()._commit(epoch, items)


def test_a_swap_left_out_by_a_restored_pending_commit_has_its_outputs_deleted(
        lake: Table) -> None:
    # found by a review: the sweep at start held the pending swap's outputs for its commit,
    # and no cleanup after it covered an epoch at or below the sweep's bound
    first, first_context, first_gateways = start(lake, cls=CommitBlocked)
    epoch, got, _, _ = until_a_bin(lake, first, first_context, first_gateways)
    delete_row(lake, first_id(got[0]))  # the swap will have to be left out
    swap = rewrite(lake.target.location, lake.target.job_id, epoch, 0, 0, SCHEMA, got,
                   target_file_bytes=TARGET)
    first.handle_event_from_operator(0, 0, swap)
    first.block = True
    first.notify_checkpoint_complete(epoch)  # the commit is handed over, not done...
    state = checkpoint(first, epoch + 1)  # ...so it is pending in the next checkpoint
    assert epoch in state.ledger.pending
    first.killed = True
    first.close()
    first.gate.set()  # the driver died before the commit
    second, context, gateways = start(lake, epoch + 1, state)
    checkpoint(second, epoch + 2)
    settle(second, context)
    assert context.failures == []
    assert not paths(list(swap.outputs)) & lake.data_files()
    want = expected(range(epoch + 1)).filter(pc.field("id") != first_id(got[0]))
    assert lake.read().equals(want)


def test_a_subtask_rewrites_every_bin_it_is_handed_in_one_batch(lake: Table) -> None:
    # an aborted checkpoint leaves its bin's event to the next epoch's seal (valve rule 2)
    from sparkcoord.sinks.task import SinkSubtask

    subtask = SinkSubtask(lake.target)
    sent: list[Any] = []

    class Context:
        epoch, subtask, spark_attempt = 9, 0, 0

        def send_event(self, event: Any) -> None:
            sent.append(event)

    subtask.open(Context(), None)  # type: ignore[arg-type]
    first = [f.path for f in lake.write(1, rows(1, 10)) + lake.write(2, rows(2, 10))]
    second = [f.path for f in lake.write(3, rows(3, 10)) + lake.write(4, rows(4, 10))]
    subtask.handle_operator_event(CompactionAssigned(8, tuple(first)))  # the aborted one's
    subtask.handle_operator_event(CompactionAssigned(9, tuple(second)))
    subtask.process()
    assert [e.inputs for e in sent] == [tuple(first), tuple(second)]
    assert all(len(e.outputs) == 1 and ".e9.s0." in e.outputs[0].path for e in sent)
