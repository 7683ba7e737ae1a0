import pytest

from sparkcoord.core.checkpoints import CheckpointTracker
from sparkcoord.core.errors import CheckpointIdRegression, IllegalTransition


def test_a_checkpoint_is_ready_when_every_coordinator_completed_it() -> None:
    t = CheckpointTracker(["a", "b"])
    t.checkpoint_triggered(0)
    assert not t.coordinator_completed("a", 0, b"sa")
    assert t.coordinator_completed("b", 0, None)
    assert t.snapshots(0) == {"a": b"sa", "b": None}
    t.checkpoint_sealed(0)
    assert t.last_sealed == 0 and t.pending is None


def test_a_decline_aborts_for_everyone_and_a_late_completion_is_ignored() -> None:
    t = CheckpointTracker(["a", "b"], tolerable_failures=1)
    t.checkpoint_triggered(0)
    abort = t.coordinator_declined("a", 0, "busy")
    assert abort is not None and abort.fail_job is None and "busy" in abort.reason
    assert not t.coordinator_completed("b", 0, b"late")
    assert t.coordinator_declined("b", 0, "again") is None


def test_declines_past_the_tolerable_count_fail_the_job_and_a_seal_resets_the_count() -> None:
    t = CheckpointTracker(["a"], tolerable_failures=1)
    t.checkpoint_triggered(0)
    assert t.coordinator_declined("a", 0, "x").fail_job is None
    t.checkpoint_triggered(1)
    t.coordinator_completed("a", 1, None)
    t.checkpoint_sealed(1)
    t.batch_committed(1)
    t.checkpoint_triggered(2)
    assert t.checkpoint_timed_out(2, 5.0).fail_job is None
    t.checkpoint_triggered(3)
    abort = t.coordinator_declined("a", 3, "x")
    assert abort.fail_job is not None and "2 checkpoints failed in a row" in abort.fail_job


def test_a_timeout_after_everyone_completed_does_not_abort_the_seal() -> None:
    t = CheckpointTracker(["a"])
    t.checkpoint_triggered(0)
    t.coordinator_completed("a", 0, None)
    assert t.checkpoint_timed_out(0, 1.0) is None
    t.checkpoint_sealed(0)


def test_checkpoints_are_strictly_sequential() -> None:
    t = CheckpointTracker(["a"])
    t.checkpoint_triggered(0)
    with pytest.raises(IllegalTransition, match="in flight"):
        t.checkpoint_triggered(1)
    t.coordinator_completed("a", 0, None)
    t.checkpoint_sealed(0)
    with pytest.raises(IllegalTransition, match="before the batch of epoch 0 committed"):
        t.checkpoint_triggered(1)
    t.batch_committed(0)
    t.checkpoint_triggered(1)


def test_regressing_ids_raise_with_both_values_and_change_nothing() -> None:
    t = CheckpointTracker(["a"], last_sealed=4, last_committed=4)
    with pytest.raises(CheckpointIdRegression) as info:
        t.checkpoint_triggered(3)
    assert (info.value.given, info.value.last) == (3, 4)
    assert "3" in str(info.value) and "4" in str(info.value)
    assert t.pending is None and t.last_triggered == 4
    with pytest.raises(CheckpointIdRegression):
        t.batch_committed(2)


def test_completing_an_unknown_checkpoint_or_coordinator_is_an_error() -> None:
    t = CheckpointTracker(["a"])
    with pytest.raises(IllegalTransition, match="unknown coordinator"):
        t.coordinator_completed("zzz", 0, None)
    t.checkpoint_triggered(0)
    t.coordinator_completed("a", 0, None)
    with pytest.raises(IllegalTransition, match="twice"):
        t.coordinator_completed("a", 0, None)
    with pytest.raises(IllegalTransition, match="last sealed epoch"):
        t.batch_committed(0)  # not sealed yet


def test_a_repeated_commit_is_reported_as_already_known() -> None:
    t = CheckpointTracker(["a"])
    t.checkpoint_triggered(0)
    t.coordinator_completed("a", 0, None)
    t.checkpoint_sealed(0)
    assert t.batch_committed(0)
    assert not t.batch_committed(0)
