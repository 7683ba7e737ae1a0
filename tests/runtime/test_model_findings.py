"""One deterministic regression test per counterexample of the protocol model
(docs/protocol.md, "Findings of the protocol model"), written against the real service.

A test's name says the rule; its docstring names the finding it guards.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any

from sparkcoord import OperatorCoordinator
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import Verdict
from sparkcoord.core.restore import RestorePoint
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import ManualClock, ManualMailboxes

OP = "ledger"


class Ledger(OperatorCoordinator):
    """Records what it sent and what it took effect of; answers events (to ``reply_to``)."""

    reply_to = "self"
    completions: list[tuple[int, list[Any]]]

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        p = self.context.parallelism
        state = state or {"sent": [[] for _ in range(p)], "effects": []}
        self.sent = [list(x) for x in state["sent"]]
        self.effects = list(state["effects"])

    def send(self, subtask: int, event: Any) -> Any:
        future = self.gateway(subtask).send_event(event)
        self.sent[subtask].append(event)
        return future

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.effects.append(event)
        target = subtask if self.reply_to == "self" else (subtask + 1) % self.context.parallelism
        self.send(target, ("reply", event))

    def checkpoint_coordinator(self, checkpoint_id: int, result: Any) -> None:
        result.set_result({"sent": self.sent, "effects": self.effects})

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        Job.completions.append((checkpoint_id, list(self.effects)))


class CrossLedger(Ledger):
    reply_to = "other"


class Job:
    """One job's durable storage across runs, and the current run's service."""

    completions: list[tuple[int, list[Any]]] = []

    def __init__(self, coordinator: type[Ledger] = Ledger, parallelism: int = 1,
                 retain: int = 3) -> None:
        Job.completions = []
        self.url = f"memory://sparkcoord-findings/{uuid.uuid4().hex}"
        self.coordinator_class = coordinator
        self.parallelism = parallelism
        self.retain = retain
        self.runs = 0
        self.new_run()

    def new_run(self) -> CoordinationService:
        """A (re)start of the query: a new run id, nothing volatile survives."""
        self.runs += 1
        self.mailboxes = ManualMailboxes()
        self.storage = CheckpointStorage(self.url, retain=self.retain)
        self.service = CoordinationService(
            [CoordinatorSpec(OP, self.coordinator_class, self.parallelism)], self.storage,
            clock=ManualClock(), mailbox_factory=self.mailboxes, run_id=f"run{self.runs}")
        return self.service

    @property
    def coordinator(self) -> Ledger:
        c = self.service.holders[OP].coordinator
        assert c is not None
        return c  # type: ignore[return-value]

    def run(self) -> None:
        self.mailboxes.run_all()

    def seal_next(self) -> int:
        future = self.service.trigger_checkpoint(self.service.next_checkpoint_id)
        self.run()
        record = self.service.seal(future.result(timeout=0))
        self.run()
        return record.epoch

    def attempt(self, subtask: int, epoch: int, number: int = 0) -> TaskAttempt:
        return TaskAttempt(self.service.run_id, SubtaskId(OP, subtask), epoch, number)

    def task_sends(self, attempt: TaskAttempt, *events: Any, first_seq: int = 0) -> None:
        assert self.service.inbox.attempt_registered(attempt).verdict is not Verdict.REJECT
        for i, event in enumerate(events):
            d = self.service.inbox.event_received(attempt, first_seq + i, pickle.dumps(event))
            assert d.verdict is Verdict.ACCEPT, d

    def delivered(self, epoch: int, subtask: int = 0) -> list[Any]:
        record = self.service.record_for(epoch)
        return [pickle.loads(p) for p in record.events_for(SubtaskId(OP, subtask))] if record else []


def test_an_acknowledged_event_is_on_the_mailbox_before_the_ack_so_the_next_boundary_has_it() -> None:
    """Finding A (loss): hand-off after the ack let a committed batch's event miss every
    checkpoint; a crash inside the next batch then lost it."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0), "ev-b0")
    # acknowledged: already queued on the coordinator's mailbox, ahead of anything later
    assert job.service.holders[OP].mailbox.pending > 0
    job.service.latest_offset_called(e0)          # batch 0 committed
    job.coordinator.send(0, "x")                  # something to carry
    e1 = job.seal_next()
    job.new_run()                                 # crash inside batch 1
    job.service.partitions_called(e0, e1)
    job.run()
    assert job.coordinator.effects == ["ev-b0"]


def test_a_retried_task_does_not_make_the_failed_attempts_event_take_effect_twice() -> None:
    """Finding A (duplicate): an event of the failed attempt handed over after the retry's
    reset took effect twice."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0, 0), "ev")
    job.task_sends(job.attempt(0, e0, 1), "ev")   # the retry sends the same event
    job.run()
    assert job.coordinator.effects == ["ev"]


def test_the_last_batch_completes_while_the_source_is_idle() -> None:
    """Finding B: completion from the source's commit() never completes the last batch;
    the first latestOffset(start=end(N)) does, once per run."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    job.coordinator.send(0, "only event")
    e0 = job.seal_next()
    for _ in range(3):  # Spark keeps polling with the same start while idle
        job.service.latest_offset_called(e0)
        job.run()
    assert [n for n, _ in Job.completions] == [e0]


def test_a_task_retry_resets_a_coordinator_that_answers_another_subtask_so_no_reply_is_doubled() -> None:
    """Finding C: Flink's per-subtask reset cannot take back a reply held for another subtask."""
    job = Job(CrossLedger, parallelism=2)
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0, 0), "from s0")
    job.run()
    job.task_sends(job.attempt(0, e0, 1), "from s0")   # retry of subtask 0
    job.task_sends(job.attempt(1, e0, 0))
    job.run()
    job.service.latest_offset_called(e0)
    e1 = job.seal_next()
    assert job.delivered(e1, 1) == [("reply", "from s0")]
    assert job.coordinator.effects == ["from s0"]


def test_a_sealed_event_delivered_to_a_failed_attempt_is_redelivered_and_its_future_does_not_fail() -> None:
    """Finding D: failing the futures of sealed events made the coordinator re-offer events
    that the retry received anyway."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    future = job.coordinator.send(0, "sealed")
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0, 0))
    job.task_sends(job.attempt(0, e0, 1))  # retry
    job.run()
    assert not future.done()
    assert job.delivered(e0) == ["sealed"]  # the retry's partitions hold the same event
    job.service.latest_offset_called(e0)
    job.run()
    assert future.done() and future.exception() is None


def test_the_replay_after_a_restart_rebuilds_the_same_state_that_complete_saw_first() -> None:
    """Finding E: log order differing from mailbox order made a repeated complete(N) see a
    different state."""
    job = Job(parallelism=2)
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    a, b = job.attempt(0, e0), job.attempt(1, e0)
    job.service.inbox.attempt_registered(a)
    job.service.inbox.attempt_registered(b)
    for i, (att, seq) in enumerate([(b, 0), (a, 0), (b, 1), (a, 1)]):
        job.service.inbox.event_received(att, seq, pickle.dumps(i))
    job.service.latest_offset_called(e0)
    job.run()
    job.new_run()                     # crash after complete(0)
    job.service.latest_offset_called(e0)
    job.run()
    (n1, first), (n2, second) = Job.completions
    assert n1 == n2 == e0 and first == second == [0, 1, 2, 3]


def test_the_restore_point_is_sparks_newest_logged_epoch_and_a_garbage_record_is_overwritten() -> None:
    """Finding F1 (own-record, reuse-record): restoring from our own newest record, or serving a
    stale one, lost the events of the re-planned epoch."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    job.coordinator.send(0, "a")
    e0 = job.seal_next()
    job.service.latest_offset_called(e0)
    job.coordinator.send(0, "garbage-epoch event")
    job.seal_next()                       # record 1 written; crash before Spark logs it
    job.new_run()
    job.service.latest_offset_called(e0)  # Spark's newest logged epoch is 0, committed
    job.run()
    assert job.coordinator.sent == [["a"]]
    job.coordinator.send(0, "b")
    e1 = job.seal_next()
    assert e1 == 1 and job.delivered(e1) == ["b"]
    assert [pickle.loads(p) for p in job.storage.read_record(1).events_for(SubtaskId(OP, 0))] == ["b"]


def test_a_crash_inside_batch_zero_restores_snapshot_zero_not_a_fresh_start() -> None:
    """Finding F2: initialOffset() before partitions(initial, end0) is not a fresh start."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    job.coordinator.send(0, "x0")
    e0 = job.seal_next()
    job.new_run()
    record = job.service.partitions_called(-1, e0)   # initialOffset() decided nothing
    job.run()
    assert job.service.restore_point == RestorePoint(0, committed=False)
    assert job.coordinator.sent == [["x0"]]
    assert record is not None and job.delivered(e0) == ["x0"]


def test_an_uncommitted_inbound_log_is_truncated_durably_and_the_rerun_is_not_swallowed_as_a_duplicate() -> None:
    """Finding F3: ignoring the log instead of truncating it, and identities without a run id,
    lost the re-run's event as a duplicate."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0), "ev")
    job.new_run()                                   # crash inside batch 0
    job.service.partitions_called(-1, e0)
    job.run()
    assert job.storage.read_inbound_log(e0) == []   # truncated before anything else
    job.task_sends(job.attempt(0, e0), "ev")        # same subtask/attempt/epoch/seq, new run
    job.run()
    assert job.coordinator.effects == ["ev"]
    job.service.latest_offset_called(e0)
    job.new_run()
    job.service.latest_offset_called(e0)
    job.run()
    assert job.coordinator.effects == ["ev"]


def test_records_are_pruned_only_at_completion_so_a_crash_before_the_next_offset_still_restores() -> None:
    """Finding F4: pruning at write time removed the record a restart needed."""
    job = Job(retain=1)
    job.service.latest_offset_called(-1)
    job.run()
    epochs = []
    for i in range(3):
        job.coordinator.send(0, i)
        epochs.append(job.seal_next())
        job.service.latest_offset_called(epochs[-1])
        job.run()
    job.coordinator.send(0, "next")
    job.seal_next()  # record 3 written, Spark has not logged it: crash
    assert not job.storage.fs.exists(job.storage.record_path(epochs[0]))
    job.new_run()
    job.service.latest_offset_called(epochs[-1])
    job.run()
    assert job.coordinator.sent == [[0, 1, 2]]


def test_a_restore_replays_only_the_surviving_attempt_of_each_subtask() -> None:
    """Finding F5: replaying every logged attempt counted the failed attempt's event."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0, 0), "attempt0")
    job.task_sends(job.attempt(0, e0, 1), "attempt1")
    job.service.latest_offset_called(e0)
    job.new_run()
    job.service.latest_offset_called(e0)
    job.run()
    assert job.coordinator.effects == ["attempt1"]


def test_a_resent_event_is_applied_once_and_one_for_a_committed_batch_is_refused() -> None:
    """Finding F6: without dedup a re-sent event (lost ack) took effect twice."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    a = job.attempt(0, e0)
    job.task_sends(a, "ev")
    assert job.service.inbox.event_received(a, 0, pickle.dumps("ev")).verdict is Verdict.DUPLICATE
    job.service.latest_offset_called(e0)
    late = job.service.inbox.event_received(a, 0, pickle.dumps("ev"))
    assert late.verdict is Verdict.REJECT and "committed" in late.reason
    job.run()
    assert job.coordinator.effects == ["ev"]


def test_a_completion_repeated_after_a_restart_sees_the_same_state() -> None:
    """Finding F7 (C2/C4): complete(N) comes again after a restart; it must see the same state."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0), "a", "b")
    job.service.latest_offset_called(e0)
    job.run()
    job.new_run()
    job.service.latest_offset_called(e0)
    job.run()
    assert Job.completions == [(e0, ["a", "b"]), (e0, ["a", "b"])]


def test_the_snapshot_is_the_state_at_the_instant_the_future_completes() -> None:
    """Finding G3: the snapshot must not change with what the coordinator does afterwards."""
    class Mutating(Ledger):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Any) -> None:
            state = {"sent": self.sent, "effects": self.effects}
            result.set_result(state)
            self.effects.append("after the boundary")

    job = Job(Mutating)
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    assert pickle.loads(job.storage.read_record(e0).snapshots[OP])["effects"] == []


def test_replies_made_while_replaying_at_restore_are_held_not_failed() -> None:
    """Finding G4: no task runs during a restore's replay; sends then must be accepted."""
    job = Job()
    job.service.latest_offset_called(-1)
    job.run()
    e0 = job.seal_next()
    job.task_sends(job.attempt(0, e0), "ev")
    job.service.latest_offset_called(e0)
    job.new_run()
    job.service.latest_offset_called(e0)   # replays "ev": the coordinator replies
    job.run()
    e1 = job.seal_next()
    assert job.delivered(e1) == [("reply", "ev")]


def test_epochs_are_the_services_own_counter_and_skip_declined_ids() -> None:
    """Finding G1: epochs are not Spark batch ids; a declined checkpoint consumes its id."""
    class DeclinesFirst(Ledger):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Any) -> None:
            if checkpoint_id == 0:
                result.set_exception(RuntimeError("not yet"))
            else:
                super().checkpoint_coordinator(checkpoint_id, result)

    job = Job(DeclinesFirst)
    job.service.config = ServiceConfig(tolerable_checkpoint_failures=1)
    job.service.latest_offset_called(-1)
    job.run()
    job.coordinator.send(0, "x")
    future = job.service.trigger_checkpoint(0)
    job.run()
    assert future.exception(timeout=0) is not None
    assert job.seal_next() == 1
    assert job.delivered(1) == ["x"]
