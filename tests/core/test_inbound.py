from sparkcoord.core.entries import EventEntry, EventRunEntry, RegistrationEntry
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import InboundGate, Verdict, surviving_events

S0, S1 = SubtaskId("op", 0), SubtaskId("op", 1)


def attempt(sid: SubtaskId, number: int = 0, epoch: int = 3, run: str = "r1") -> TaskAttempt:
    return TaskAttempt(run, sid, epoch, number)


def gate() -> InboundGate:
    g = InboundGate("r1", {"op": 2})
    g.epoch_started(3)
    return g


def test_a_registered_attempts_events_are_accepted_in_sequence_and_logged() -> None:
    g = gate()
    a = attempt(S0)
    assert g.attempt_registered(a).verdict is Verdict.ACCEPT
    assert g.last_entry == RegistrationEntry(a)
    assert g.event_received(a, 0, b"e0").verdict is Verdict.ACCEPT
    assert g.last_entry == EventEntry(a, 0, b"e0")


def test_a_run_of_events_is_split_into_resent_duplicates_and_newly_accepted_ones() -> None:
    g = gate()
    a = attempt(S0)
    g.attempt_registered(a)
    d = g.event_run_received(a, 0, (b"e0", b"e1"))
    assert (d.duplicates, d.accepted, d.rejected) == (0, 2, 0)
    assert g.last_entry == EventRunEntry(a, 0, (b"e0", b"e1"))
    # a resend after a lost acknowledgement overlaps what was logged: only the new part counts
    d = g.event_run_received(a, 1, (b"e1", b"e2", b"e3"))
    assert (d.duplicates, d.accepted, d.rejected) == (1, 2, 0)
    assert g.last_entry == EventRunEntry(a, 2, (b"e2", b"e3"))
    d = g.event_run_received(a, 0, (b"e0",))
    assert (d.duplicates, d.accepted, d.rejected) == (1, 0, 0)
    assert [e.payload for e in g.surviving_events("op")] == [b"e0", b"e1", b"e2", b"e3"]


def test_a_run_that_starts_past_a_gap_or_comes_from_a_dead_attempt_is_rejected_whole() -> None:
    g = gate()
    a0, a1 = attempt(S0, 0), attempt(S0, 1)
    g.attempt_registered(a0)
    g.event_run_received(a0, 0, (b"e0",))
    d = g.event_run_received(a0, 2, (b"e2", b"e3"))
    assert (d.duplicates, d.accepted, d.rejected) == (0, 0, 2) and "before event 1" in d.reason
    g.attempt_registered(a1)
    d = g.event_run_received(a0, 1, (b"late", b"later"))
    assert (d.accepted, d.rejected) == (0, 2) and "not the live attempt" in d.reason
    assert [e.payload for e in g.surviving_events("op")] == []  # a0 died; a1 sent nothing


def test_a_resent_event_is_a_duplicate_and_a_gap_is_rejected() -> None:
    g = gate()
    a = attempt(S0)
    g.attempt_registered(a)
    g.event_received(a, 0, b"e0")
    assert g.event_received(a, 0, b"e0").verdict is Verdict.DUPLICATE
    d = g.event_received(a, 2, b"e2")
    assert d.verdict is Verdict.REJECT and "before event 1" in d.reason


def test_events_of_an_unregistered_or_replaced_attempt_are_rejected() -> None:
    g = gate()
    a0, a1 = attempt(S0, 0), attempt(S0, 1)
    assert g.event_received(a0, 0, b"x").verdict is Verdict.REJECT
    g.attempt_registered(a0)
    d = g.attempt_registered(a1)
    assert d.verdict is Verdict.ACCEPT and d.replaced == a0 and d.execution_attempt == 1
    assert g.event_received(a0, 0, b"late").verdict is Verdict.REJECT
    assert g.attempt_registered(a0).verdict is Verdict.REJECT  # a zombie re-registering


def test_wrong_run_wrong_epoch_committed_epoch_and_unknown_subtasks_are_rejected() -> None:
    g = gate()
    cases = {
        attempt(S0, run="old"): "run",
        attempt(S0, epoch=4): "not running",
        attempt(SubtaskId("op", 5)): "0..1",
        attempt(SubtaskId("nope", 0)): "unknown operator",
    }
    for a, text in cases.items():
        d = g.attempt_registered(a)
        assert d.verdict is Verdict.REJECT and text in d.reason, (a, d)
    g.batch_committed(3)
    d = g.attempt_registered(attempt(S0))
    assert d.verdict is Verdict.REJECT and "already committed" in d.reason


def test_the_replay_takes_the_other_subtasks_live_events_in_log_order() -> None:
    g = gate()
    a, b, a1 = attempt(S0), attempt(S1), attempt(S0, 1)
    g.attempt_registered(a)
    g.attempt_registered(b)
    g.event_received(b, 0, b"b0")
    g.event_received(a, 0, b"a0")
    g.event_received(b, 1, b"b1")
    g.attempt_registered(a1)
    assert [e.payload for e in g.surviving_events("op", excluding=S0)] == [b"b0", b"b1"]
    g.event_received(a1, 0, b"a1-0")
    assert [e.payload for e in g.surviving_events("op")] == [b"b0", b"b1", b"a1-0"]


def test_a_restore_replays_only_the_last_registered_attempt_of_each_subtask() -> None:
    a0, a1, b = attempt(S0, 0), attempt(S0, 1), attempt(S1)
    log = [RegistrationEntry(a0), EventEntry(a0, 0, b"dead"), RegistrationEntry(b),
           EventEntry(b, 0, b"b0"), RegistrationEntry(a1), EventEntry(a1, 0, b"live"),
           EventRunEntry(b, 1, (b"b1", b"b2"))]
    assert [e.payload for e in surviving_events(log)] == [b"b0", b"live", b"b1", b"b2"]


def test_a_retry_whose_first_attempt_never_registered_still_replaces_it() -> None:
    # A first attempt registers lazily (with its first event); one that failed before sending
    # anything never registered. Its retry must still count as a retry (regression: it was
    # taken for a fresh attempt, so a per-subtask coordinator never heard of the failure).
    g = gate()
    d = g.attempt_registered(attempt(S0, number=1))
    assert d.verdict is Verdict.ACCEPT
    assert d.replaced == attempt(S0, number=0)
    assert d.execution_attempt == 1
    # a first attempt needs no such inference
    first = g.attempt_registered(attempt(S1, number=0))
    assert first.replaced is None and first.execution_attempt == 0
    # and the silent first attempt, should it still speak up, is older than the live one
    assert g.attempt_registered(attempt(S0, number=0)).verdict is Verdict.REJECT


def test_client_requests_between_batches_do_not_grow_the_gates_memory() -> None:
    from sparkcoord.core.entries import DriverClient, client_identity
    from sparkcoord.core.inbound import CLIENT_MEMORY

    g = gate()
    g.batch_committed(3)  # between batches: client requests go to the log of epoch 3
    for seq in range(CLIENT_MEMORY + 100):
        assert g.request_received(DriverClient("op", "c"), seq, b"status").verdict is Verdict.ACCEPT
        assert g.response_recorded(client_identity("op", "c", 3), seq, b"ok") is not None
    assert len(g._log) == 1  # only the last entry, for the runtime to log durably
    assert len(g._clients) == CLIENT_MEMORY  # the re-send memory is bounded
    # the newest are remembered (a re-send is answered), the oldest forgotten
    assert g.request_received(DriverClient("op", "c"), CLIENT_MEMORY + 99, b"status").verdict is Verdict.DUPLICATE


def test_a_resent_item_of_other_bytes_waits_for_the_verdict_which_counts_only_for_its_bytes(
        ) -> None:
    # core/decisions.py rule 5: the gate unpickles nothing; the runtime compares the values
    # outside its critical section (runtime/inbox.py rule 6) and asks again with the verdict
    from sparkcoord.core.entries import RequestEntry

    g = gate()
    a = attempt(S0)
    g.attempt_registered(a)
    g.event_run_received(a, 0, (b"e0", b"e1"))
    run = (b"E0", b"E1", b"e2")  # items 0 and 1 again, as other bytes, and item 2
    d = g.event_run_received(a, 0, run)
    assert d.compare == ((b"e0", b"E0"), (b"e1", b"E1"))
    assert (d.duplicates, d.accepted, d.rejected) == (0, 0, 0) and g.history_length(S0) == 2
    assert g.event_received(a, 0, b"E0").verdict is Verdict.COMPARE
    same = {(b"e0", b"E0"): True, (b"e1", b"E1"): True}
    d = g.event_run_received(a, 0, run, {**same, (b"e1", b"E1"): False})
    assert d.diverged and d.duplicates == 1 and "different bytes" in d.reason
    d = g.event_run_received(a, 0, run, same)
    assert (d.duplicates, d.accepted, d.rejected) == (2, 1, 0) and not d.compare
    # a verdict for other bytes than the logged ones is no verdict: compared again
    assert g.event_received(a, 1, b"E1", {(b"e0", b"E1"): True}).verdict is Verdict.COMPARE
    # a certain difference before any unsettled item fails at once
    d = g.event_run_received(a, 0, (b"E0", b"x"), {(b"e0", b"E0"): False})
    assert d.diverged and d.duplicates == 0
    # a request: COMPARE, then answered from the log as a duplicate
    g.request_received(a, 3, b"q")
    assert g.last_entry == RequestEntry(a, 3, b"q")
    r = g.request_received(a, 3, b"Q")
    assert r.verdict is Verdict.COMPARE and r.compare == ((b"q", b"Q"),)
    assert g.request_received(a, 3, b"Q", {(b"q", b"Q"): True}).verdict is Verdict.DUPLICATE
    r = g.request_received(a, 3, b"Q", {(b"q", b"Q"): False})
    assert r.verdict is Verdict.REJECT and r.diverged
