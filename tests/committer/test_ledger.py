"""The commit ledger's rules (sparkcoord/committer/ledger.py), without threads or Spark."""

from __future__ import annotations

import pickle

import pytest

from sparkcoord.committer import Commit, CommitLedger
from sparkcoord.core.errors import CheckpointIdRegression


def test_a_committed_batch_issues_one_commit_of_what_it_produced_in_order() -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(0)
    ledger.item_produced("a")
    ledger.item_produced("b")
    assert ledger.batch_committed(0) == [Commit(0, ("a", "b"))]
    assert ledger.pending_epochs == [0]
    ledger.commit_done(0)
    assert ledger.pending_epochs == []


def test_a_batch_that_produced_nothing_has_no_commit() -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(0)
    assert ledger.batch_committed(0) == []
    assert ledger.pending_epochs == []


def test_a_commit_not_done_is_in_every_later_checkpoint_and_issued_again_after_a_restore(
        ) -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(3)
    ledger.item_produced("x")
    assert ledger.batch_committed(3) == [Commit(3, ("x",))]
    ledger.checkpoint_taken(4)
    ledger.item_produced("y")
    # the commit of 3 is still running: the next one is not issued twice, 4 joins the queue
    assert ledger.batch_committed(4) == [Commit(4, ("y",))]
    state = pickle.loads(pickle.dumps(ledger.checkpoint_taken(5)))  # as the snapshot goes
    assert state.pending == {3: ("x",), 4: ("y",)}
    restored = CommitLedger(state)  # the driver died before either was reported done
    assert restored.restored() == [Commit(3, ("x",)), Commit(4, ("y",))]
    assert restored.restored() == []  # issued once per ledger
    restored.commit_done(3)
    assert restored.pending_epochs == [4]


def test_a_withdrawn_item_is_not_committed_and_an_unknown_one_is_an_error() -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(0)
    for item in ("a", "b", "c"):
        ledger.item_produced(item)
    ledger.item_withdrawn("b")
    assert ledger.running == ("a", "c")
    with pytest.raises(ValueError, match="'z' was withdrawn"):
        ledger.item_withdrawn("z")
    assert ledger.batch_committed(0) == [Commit(0, ("a", "c"))]


def test_a_failed_commit_is_issued_again_and_a_notified_again_epoch_is_not() -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(0)
    ledger.item_produced("a")
    assert ledger.batch_committed(0) == [Commit(0, ("a",))]
    assert ledger.batch_committed(0) == []  # notified again while it runs
    assert ledger.commit_failed(0) == [Commit(0, ("a",))]


def test_checkpoint_ids_only_grow_and_the_error_names_both() -> None:
    ledger = CommitLedger()
    ledger.checkpoint_taken(5)
    with pytest.raises(CheckpointIdRegression, match="5 must be greater than 5"):
        ledger.checkpoint_taken(5)
    ledger.batch_committed(5)
    with pytest.raises(CheckpointIdRegression, match="4 must be greater than 4"):
        ledger.batch_committed(4)
