"""The system clock's timer thread: real time, so each test waits on events, never sleeps."""

import threading

from sparkcoord.runtime.clock import _TIMERS, SystemClock


def test_due_actions_run_in_deadline_order_on_one_timer_thread() -> None:
    clock = SystemClock()
    ran: list[tuple[str, str]] = []
    last = threading.Event()

    def record(name: str) -> None:
        ran.append((name, threading.current_thread().name))
        if name == "third":
            last.set()

    clock.call_later(0.06, lambda: record("third"))
    clock.call_later(0.02, lambda: record("first"))
    clock.call_later(0.04, lambda: record("second"))
    assert last.wait(10)
    assert [name for name, _ in ran] == ["first", "second", "third"]
    assert {thread for _, thread in ran} == {"sparkcoord-timer"}


def test_a_cancelled_action_never_runs_and_a_failing_one_does_not_stop_the_others() -> None:
    clock = SystemClock()
    ran: list[str] = []
    done = threading.Event()
    cancelled = clock.call_later(0.01, lambda: ran.append("cancelled"))
    clock.call_later(0.0, lambda: 1 / 0)
    clock.call_later(0.03, lambda: (ran.append("after"), done.set()))
    cancelled.cancel()
    assert done.wait(10)
    assert ran == ["after"]


def test_thousands_of_timeouts_start_no_threads_and_cancelled_ones_do_not_pile_up() -> None:
    clock = SystemClock()
    clock.call_later(0.0, lambda: None)  # the timer thread exists from here on
    threads = threading.active_count()
    for _ in range(5_000):  # one checkpoint timeout each, cancelled when the checkpoint completes
        clock.call_later(3600.0, lambda: None).cancel()
    assert threading.active_count() == threads
    assert _TIMERS.pending() <= 2 * 64 + 1
