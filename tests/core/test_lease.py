"""Who may take a coordination directory's lease over (core/lease.py rule 2), without I/O:
every case with its clock and liveness given."""

from __future__ import annotations

import pytest

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.lease import (
    Identity,
    LeaseHeld,
    LeaseHolder,
    LeaseLost,
    held_message,
    may_take_over,
)

HERE = Identity("driver-a", "boot-1", 4242, "9001")
HOLDER = LeaseHolder(3, "driver-a", "boot-1", 1111, "777", "run-old", since=1000.0,
                     renewed=1000.0, ttl_s=30.0)


def other_machine(holder: LeaseHolder) -> LeaseHolder:
    return LeaseHolder(**{**holder.__dict__, "host": "driver-b", "boot": "boot-9"})


def test_a_released_lease_is_taken_at_once() -> None:
    released = LeaseHolder(**{**HOLDER.__dict__, "released": True})
    assert may_take_over(released, HERE, 1001.0, alive=True, held_here=False).take


def test_a_killed_driver_on_this_machine_is_taken_over_at_once_without_waiting_for_the_ttl() -> None:
    verdict = may_take_over(HOLDER, HERE, 1001.0, alive=False, held_here=False)
    assert verdict.take and "pid 1111" in verdict.reason and "gone" in verdict.reason


def test_a_live_driver_on_this_machine_keeps_the_lease_even_long_after_its_last_renewal() -> None:
    # a paused (SIGSTOP) driver is alive and would write on waking: the ttl does not free it
    verdict = may_take_over(HOLDER, HERE, 1000.0 + 3600, alive=True, held_here=False)
    assert not verdict.take and "running on this host" in verdict.reason


def test_a_driver_on_another_machine_keeps_the_lease_until_its_ttl_after_the_last_renewal() -> None:
    remote = other_machine(HOLDER)
    assert not may_take_over(remote, HERE, 1030.0, alive=None, held_here=False).take
    late = may_take_over(remote, HERE, 1030.5, alive=None, held_here=False)
    assert late.take and "more than its 30 s" in late.reason


def test_an_unknown_boot_never_counts_as_this_machine() -> None:
    # without a boot id a pid cannot be checked: only the ttl frees the lease
    blind = Identity("driver-a", "", 4242, "")
    holder = LeaseHolder(**{**HOLDER.__dict__, "boot": ""})
    assert not may_take_over(holder, blind, 1001.0, alive=False, held_here=False).take


def test_this_programs_own_lease_is_refused_while_another_of_its_jobs_holds_it() -> None:
    mine = LeaseHolder(**{**HOLDER.__dict__, "pid": 4242, "started": "9001"})
    assert not may_take_over(mine, HERE, 1001.0, alive=True, held_here=True).take
    # a job of this program that ended without releasing: not a holder any more
    assert may_take_over(mine, HERE, 1001.0, alive=True, held_here=False).take


def test_the_refusal_names_the_holder_and_the_way_on() -> None:
    verdict = may_take_over(HOLDER, HERE, 1012.0, alive=True, held_here=False)
    text = held_message("/ckpt/coordination/numbers", HOLDER, verdict, HERE, 1012.0)
    for part in ("/ckpt/coordination/numbers", "pid 1111 on host driver-a", "run-old",
                 "generation 3", "since 1970-01-01T00:16:40Z", "renewed 12 s ago",
                 "Stop the other driver program", "kill 1111"):
        assert part in text, (part, text)
    remote = other_machine(HOLDER)
    far = held_message("/c", remote, may_take_over(remote, HERE, 1012.0, None, False), HERE,
                       1012.0)
    assert "lapses 30 s after its last renewal (at 1970-01-01T00:17:10Z" in far


def test_lease_refusals_are_permanent_so_no_restart_retries_them() -> None:
    assert LeaseHeld.permanent and LeaseLost.permanent


def test_a_lease_file_round_trips_and_damage_names_the_file() -> None:
    assert LeaseHolder.decode(HOLDER.encode(), "x") == HOLDER
    with pytest.raises(CorruptRecord, match="lease/3.json: not a lease file"):
        LeaseHolder.decode(b'{"generation": 3}', "lease/3.json")


def test_times_in_a_refusal_are_utc_as_datetime_writes_them() -> None:
    import datetime

    from sparkcoord.core.lease import _utc

    for wall in (0, 951_825_599.9, 951_825_600, 1_800_000_000, 4_102_444_799, 253_402_300_799):
        expected = datetime.datetime.fromtimestamp(int(wall), datetime.timezone.utc)
        assert _utc(wall) == expected.strftime("%Y-%m-%dT%H:%M:%SZ"), wall
