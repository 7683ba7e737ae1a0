import pytest

from sparkcoord import ExponentialBackoff, FailureRate, FixedDelay, NoRestart


def test_fixed_delay_restarts_a_fixed_number_of_times() -> None:
    s = FixedDelay(attempts=2, delay_s=1.5)
    assert [s.next_delay(t) for t in (0, 10, 20)] == [1.5, 1.5, None]


def test_exponential_backoff_grows_caps_and_resets_after_a_quiet_period() -> None:
    s = ExponentialBackoff(initial_s=1, max_s=5, multiplier=2, reset_after_s=100)
    assert [s.next_delay(t) for t in (0, 1, 2, 3, 4)] == [1, 2, 4, 5, 5]
    assert s.next_delay(200) == 1


def test_exponential_backoff_gives_up_after_max_attempts_in_a_row() -> None:
    s = ExponentialBackoff(initial_s=1, max_s=5, max_attempts=2)
    assert [s.next_delay(t) for t in (0, 1, 2)] == [1, 2, None]


def test_failure_rate_gives_up_when_too_many_failures_fall_in_the_interval() -> None:
    s = FailureRate(max_failures=2, interval_s=60, delay_s=3)
    assert s.next_delay(0) == 3 and s.next_delay(10) == 3
    assert s.next_delay(20) is None
    s2 = FailureRate(max_failures=2, interval_s=60, delay_s=3)
    assert [s2.next_delay(t) for t in (0, 100, 200, 300)] == [3, 3, 3, 3]


def test_no_restart_never_restarts() -> None:
    assert NoRestart().next_delay(0) is None


@pytest.mark.parametrize("make", [lambda: FixedDelay(attempts=-1),
                                  lambda: ExponentialBackoff(initial_s=0),
                                  lambda: FailureRate(max_failures=0, interval_s=1)])
def test_nonsense_settings_are_refused(make) -> None:
    with pytest.raises(ValueError):
        make()
