"""The valve, in the spirit of Flink's gateway/valve tests, in the project's own terms."""

import pytest

from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    CheckpointIdRegression,
    IllegalTransition,
    UnknownSubtask,
)
from sparkcoord.core.valve import OutboundValve


def payloads(queue):
    return list(queue)


def test_events_before_the_boundary_are_cut_into_the_epoch_and_later_ones_are_held() -> None:
    v = OutboundValve("op", 1)
    v.event_sent(0, 0, b"a", lambda: "a")
    v.checkpoint_triggered(1)
    v.event_sent(0, 0, b"b", lambda: "b")  # triggered, but the future is not complete: still epoch 1
    assert v.boundary_reached(1)
    v.event_sent(0, 0, b"c", lambda: "c")
    assert payloads(v.checkpoint_sealed(1)[0]) == [b"a", b"b"]
    assert v.held_for(0) == [b"c"]


def test_a_late_completing_future_of_an_aborted_checkpoint_holds_nothing() -> None:
    v = OutboundValve("op", 1)
    v.checkpoint_triggered(1)
    v.event_sent(0, 0, b"a", lambda: "a")
    v.checkpoint_aborted(1)
    assert not v.boundary_reached(1)
    with pytest.raises(IllegalTransition):
        v.cut(1)
    v.checkpoint_triggered(2)
    v.event_sent(0, 0, b"b", lambda: "b")
    assert v.boundary_reached(2)
    assert payloads(v.checkpoint_sealed(2)[0]) == [b"a", b"b"]


def test_order_is_kept_across_a_completed_and_an_aborted_checkpoint() -> None:
    v = OutboundValve("op", 2)
    v.event_sent(0, 0, b"1", lambda: "1")
    v.event_sent(1, 0, b"x1", lambda: "x1")
    v.checkpoint_triggered(1)
    assert v.boundary_reached(1)
    v.event_sent(0, 0, b"2", lambda: "2")
    v.checkpoint_aborted(1)  # the cut goes back in front of what came after it
    v.event_sent(0, 0, b"3", lambda: "3")
    v.checkpoint_triggered(2)
    assert v.boundary_reached(2)
    sealed = v.checkpoint_sealed(2)
    assert payloads(sealed[0]) == [b"1", b"2", b"3"]
    assert payloads(sealed[1]) == [b"x1"]


def test_a_global_reset_drops_every_held_cut_and_sealed_event() -> None:
    v = OutboundValve("op", 1)
    v.event_sent(0, 0, b"a", lambda: "a")
    v.checkpoint_triggered(1)
    v.boundary_reached(1)
    v.checkpoint_sealed(1)
    v.event_sent(0, 0, b"b", lambda: "b")
    v.checkpoint_triggered(2)
    v.boundary_reached(2)
    v.event_sent(0, 0, b"c", lambda: "c")
    assert sorted(v.globally_reset()) == ["a", "b", "c"]
    assert v.held_count() == 0 and v.batch_committed(2) == []


def test_sealed_events_complete_at_their_batch_commit() -> None:
    v = OutboundValve("op", 1)
    v.event_sent(0, 0, b"a", lambda: "a")
    v.checkpoint_triggered(1)
    v.boundary_reached(1)
    v.event_sent(0, 0, b"b", lambda: "b")
    v.checkpoint_sealed(1)
    assert v.batch_committed(1) == ["a"]
    assert v.batch_committed(1) == []
    assert v.held_for(0) == [b"b"]


def test_an_attempt_failure_fails_only_that_subtasks_unsealed_events() -> None:
    v = OutboundValve("op", 2)
    v.event_sent(0, 0, b"sealed", lambda: "sealed")
    v.checkpoint_triggered(1)
    v.boundary_reached(1)
    v.checkpoint_sealed(1)
    v.event_sent(0, 0, b"held0", lambda: "held0")
    v.event_sent(1, 0, b"held1", lambda: "held1")
    new_attempt, failed = v.attempt_failed(0)
    assert (new_attempt, failed) == (1, ["held0"])
    assert v.held_for(1) == [b"held1"]
    assert v.batch_committed(1) == ["sealed"]  # redelivered to the retry, completes at commit


def test_gateways_are_per_subtask_and_a_failed_attempts_gateway_refuses_sends() -> None:
    v = OutboundValve("op", 2)
    v.attempt_failed(0)
    with pytest.raises(AttemptNoLongerLive, match="attempt 0"):
        v.event_sent(0, 0, b"late", lambda: "late")
    v.event_sent(0, 1, b"new", lambda: "new")
    v.event_sent(1, 0, b"other subtask unaffected", lambda: "other subtask unaffected")
    assert v.held_for(0) == [b"new"]
    with pytest.raises(UnknownSubtask, match="0..1"):
        v.event_sent(2, 0, b"x", lambda: "x")


def test_checkpoint_ids_must_increase_and_the_state_is_unchanged_on_error() -> None:
    v = OutboundValve("op", 1)
    v.checkpoint_triggered(5)
    v.checkpoint_aborted(5)
    with pytest.raises(CheckpointIdRegression) as info:
        v.checkpoint_triggered(5)
    assert "5" in str(info.value) and info.value.last == 5
    assert v.pending_checkpoint is None
    v.checkpoint_triggered(6)
    with pytest.raises(IllegalTransition, match="unfinished"):
        v.checkpoint_triggered(7)
    assert v.pending_checkpoint == 6


def test_an_abort_of_a_never_triggered_checkpoint_is_an_error() -> None:
    v = OutboundValve("op", 1)
    with pytest.raises(IllegalTransition, match="never"):
        v.checkpoint_aborted(3)


def test_an_attempt_failure_after_the_boundary_fails_the_cut_but_leaves_the_handed_out_cut_alone() -> None:
    v = OutboundValve("op", 2)
    v.event_sent(0, 0, b"cut0", lambda: "cut0")
    v.event_sent(1, 0, b"cut1", lambda: "cut1")
    v.checkpoint_triggered(1)
    assert v.boundary_reached(1)
    handed_out = v.cut(1)
    v.event_sent(0, 0, b"held0", lambda: "held0")
    assert v.attempt_failed(0) == (1, ["cut0", "held0"])
    assert handed_out == [[b"cut0"], [b"cut1"]]  # what the listener already got is not mutated
    assert v.checkpoint_sealed(1) == [[], [b"cut1"]]
    assert v.batch_committed(1) == ["cut1"]


def test_a_send_joins_the_ticket_of_the_events_held_for_its_subtask_until_the_boundary() -> None:
    v = OutboundValve("op", 2)
    assert v.event_sent(0, 0, b"a", lambda: "first") == "first"
    assert v.event_sent(0, 0, b"b", lambda: "unused") == "first"  # same fate: same ticket
    assert v.event_sent(1, 0, b"x", lambda: "other") == "other"  # another subtask, another run
    v.checkpoint_triggered(1)
    assert v.boundary_reached(1)
    assert v.event_sent(0, 0, b"c", lambda: "after") == "after"  # past the boundary: a new run
    v.checkpoint_aborted(1)  # the cut is held again, in front: the runs share their fate again
    assert v.event_sent(0, 0, b"d", lambda: "unused") == "after"
    v.checkpoint_triggered(2)
    assert v.boundary_reached(2)
    assert v.checkpoint_sealed(2) == [[b"a", b"b", b"c", b"d"], [b"x"]]
    assert sorted(v.batch_committed(2)) == ["after", "first", "other"]


def test_a_batch_send_starts_a_run_of_its_own_and_holds_nothing_when_refused() -> None:
    v = OutboundValve("op", 1)
    v.event_sent(0, 0, b"a", lambda: "single")
    v.events_sent(0, 0, [b"b", b"c"], "batch")
    assert v.event_sent(0, 0, b"d", lambda: "unused") == "batch"
    v.attempt_failed(0)
    with pytest.raises(AttemptNoLongerLive):
        v.events_sent(0, 0, [b"e"], "refused")
    assert v.held_count() == 0
