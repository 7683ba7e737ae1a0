"""The lease on a coordination directory on real stores: a local directory and S3 (moto's
server on loopback), with a manual wall clock and given identities; the fence that stops a run
that lost it (runtime/lease.py; docs/protocol.md [one-driver-per-checkpoint])."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkcoord.core.lease import Identity, LeaseHeld, LeaseHolder, LeaseLost
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.core.restore import RestorePoint
from sparkcoord.runtime import lease as lease_module
from sparkcoord.runtime.lease import (
    CoordinationLease,
    LeaseKeeper,
    current_fence,
    generations,
    process_alive,
    this_process,
)
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec, JobFailed
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import ManualClock, ManualMailboxes
from tests.runtime.test_failure_fencing import Journal

A = Identity("driver-a", "boot-1", 1111, "100")
B = Identity("driver-b", "boot-2", 2222, "200")
A_LATER = Identity("driver-a", "boot-1", 3333, "300")


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from tests.s3_server import S3Server

    server = S3Server()
    server.create_bucket("leases")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["local", "s3"])
def place(request: Any, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A coordination directory (URL, storage options) on each kind of store."""
    if request.param == "local":
        return str(tmp_path / "coordination" / "src"), {}
    server = request.getfixturevalue("s3")
    return f"s3://leases/{tmp_path.name}/coordination/src", server.storage_options


def lease_for(place: tuple[str, dict[str, Any]], me: Identity, clock: ManualClock,
              alive: Callable[[Identity], bool] = lambda who: True) -> CoordinationLease:
    url, options = place
    return CoordinationLease(url, options, ttl_s=30.0, wall=clock.now, me=me, alive=alive)


def test_a_second_driver_is_refused_naming_the_holder(place) -> None:
    clock = ManualClock(1_800_000_000.0)
    first = lease_for(place, A, clock)
    assert first.acquire().generation == 0
    clock.advance(5)
    with pytest.raises(LeaseHeld) as refused:
        lease_for(place, B, clock).acquire()
    text = str(refused.value)
    assert f"checkpoint {place[0]}" in text and "pid 1111 on host driver-a" in text
    assert f"lease run {first.run}" in text and "held since 2027-01-15T08:00:00Z" in text
    assert "Stop the other driver program" in text
    # the refused run wrote nothing: the holder's generation is the only one
    assert generations(first.files, first.root) == [0]
    first.check()


def test_a_driver_killed_on_this_machine_is_taken_over_at_once(place) -> None:
    clock = ManualClock(1_800_000_000.0)
    old = lease_for(place, A, clock)
    old.acquire()
    clock.advance(1)  # far inside the ttl
    new = lease_for(place, A_LATER, clock, alive=lambda who: who != A)  # pid 1111 is gone
    assert new.acquire().generation == 1
    assert generations(new.files, new.root) == [1]  # the old generation is deleted
    with pytest.raises(LeaseLost, match="taken over by a newer run .generation 1: pid 3333"):
        old.check()
    with pytest.raises(LeaseLost):
        old.renew()  # and it writes nothing
    assert generations(new.files, new.root) == [1]


def test_a_driver_on_another_machine_is_taken_over_only_after_its_ttl(place) -> None:
    clock = ManualClock(1_800_000_000.0)
    old = lease_for(place, B, clock)
    old.acquire()
    clock.advance(20)
    old.renew()
    clock.advance(29)  # 49 s after it was taken, 29 s after its renewal
    with pytest.raises(LeaseHeld, match="renewed 29 s ago"):
        lease_for(place, A, clock).acquire()
    clock.advance(2)
    assert lease_for(place, A, clock).acquire().generation == 1


def test_a_released_lease_is_taken_at_once_and_a_lost_one_is_not_released_over_the_new(place) -> None:
    clock = ManualClock(1_800_000_000.0)
    first = lease_for(place, A, clock)
    first.acquire()
    first.release()
    second = lease_for(place, B, clock)
    assert second.acquire().generation == 1
    first.release()  # lost: leaves the new holder's file alone
    holder = lease_module.read_holder(second.files, second.root, 1)
    assert holder is not None and not holder.released and holder.run == second.run


def test_of_two_runs_racing_for_the_next_generation_one_wins(place, monkeypatch) -> None:
    # the loser's exclusive create meets the winner's file: it decides again, and is refused
    clock = ManualClock(1_800_000_000.0)
    winner, loser = lease_for(place, A, clock), lease_for(place, B, clock)
    create = loser.files.create_exclusive

    def racing(path: str, data: bytes) -> None:
        if not generations(loser.files, loser.root):
            winner.acquire()  # lands between the loser's read and its create
        create(path, data)

    monkeypatch.setattr(loser.files, "create_exclusive", racing)
    with pytest.raises(LeaseHeld, match="pid 1111 on host driver-a"):
        loser.acquire()
    assert generations(winner.files, winner.root) == [0]


def test_the_store_refuses_an_exclusive_create_over_an_existing_file(place) -> None:
    lease = lease_for(place, A, ManualClock())
    path = f"{lease.root}/lease/7.json"
    lease.files.create_exclusive(path, b"first")
    with pytest.raises(FileExistsError):
        lease.files.create_exclusive(path, b"second")
    assert lease.files.read(path) == b"first"


def test_a_run_fenced_by_a_newer_lease_writes_no_record_nor_seal(place) -> None:
    clock = ManualClock(1_800_000_000.0)
    url, options = place
    old = lease_for(place, B, clock)
    old.acquire()
    storage = CheckpointStorage(url, storage_options=options)
    storage.fence = current_fence(storage.files, storage.root, url)
    storage.write_record(CheckpointRecord(0, {"a": b"x"}, {}))
    storage.start_inbound_log(0)
    clock.advance(31)
    lease_for(place, A, clock).acquire()  # the old driver was cut off for longer than ttl
    with pytest.raises(LeaseLost, match="generation 0"):
        storage.write_record(CheckpointRecord(1, {"a": b"y"}, {}))
    with pytest.raises(LeaseLost):
        storage.seal_inbound_log(0)
    assert storage.record_epochs() == [0]
    assert storage.read_uncommitted_inbound_log(0) == []  # still there, untouched


def service_under_lease(tmp_path: Path, clock: ManualClock, mailboxes: ManualMailboxes
                        ) -> tuple[CoordinationService, CheckpointStorage, tuple[str, dict[str, Any]]]:
    """A service whose run started under driver B's lease (as the source runner sets it up)."""
    place: tuple[str, dict[str, Any]] = (str(tmp_path / "src"), {})
    lease_for(place, B, clock).acquire()
    storage = CheckpointStorage(place[0])
    storage.fence = current_fence(storage.files, storage.root, place[0])
    service = CoordinationService(
        [CoordinatorSpec("a", functools.partial(Journal, journal=[]), 1)], storage,
        clock=clock, mailbox_factory=mailboxes)
    return service, storage, place


def test_a_service_whose_lease_was_taken_over_fails_at_its_next_seal_with_lease_lost(tmp_path) -> None:
    clock = ManualClock(1_800_000_000.0)
    mailboxes = ManualMailboxes()
    service, storage, place = service_under_lease(tmp_path, clock, mailboxes)
    service.restore(RestorePoint(-1, committed=True))
    mailboxes.run_all()
    clock.advance(31)
    lease_for(place, A, clock).acquire()
    future = service.trigger_checkpoint(0)
    mailboxes.run_all()
    with pytest.raises(LeaseLost):
        service.seal(future.result())
    assert storage.record_epochs() == []
    assert service.failure is not None and service.failure.startswith("LeaseLost: ")
    with pytest.raises(JobFailed):
        service.raise_if_failed()


def test_a_service_started_under_a_lost_lease_fails_at_its_restore(tmp_path) -> None:
    clock = ManualClock(1_800_000_000.0)
    service, storage, place = service_under_lease(tmp_path, clock, ManualMailboxes())
    clock.advance(31)
    lease_for(place, A, clock).acquire()
    with pytest.raises(LeaseLost):
        service.restore(RestorePoint(-1, committed=True))
    assert service.failure is not None and "LeaseLost" in service.failure


def test_no_lease_directory_means_no_fence(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path / "src"))
    assert current_fence(storage.files, storage.root, str(tmp_path)) is None


HOLD = """
import sys, time
from sparkcoord.runtime.lease import CoordinationLease
lease = CoordinationLease(sys.argv[1])
lease.acquire()
print(lease.run, flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
"""


def test_a_lease_held_by_another_live_process_is_refused_and_freed_when_it_is_killed(tmp_path) -> None:
    url = str(tmp_path / "coordination" / "src")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout is not None
        run = holder.stdout.readline().strip()
        with pytest.raises(LeaseHeld) as refused:
            CoordinationLease(url).acquire()
        assert f"pid {holder.pid}" in str(refused.value) and run in str(refused.value)
        assert f"kill {holder.pid}" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    taken = CoordinationLease(url).acquire()  # its process is gone: at once, not after a ttl
    assert taken.generation == 1 and taken.pid == this_process().pid


def test_a_live_process_is_alive_and_a_reused_pid_is_not_its_holder() -> None:
    me = this_process()
    assert process_alive(me)
    assert not process_alive(Identity(me.host, me.boot, me.pid, "not-its-start"))


def test_the_keeper_renews_on_its_thread_and_releases_at_stop(tmp_path) -> None:
    keeper = LeaseKeeper([CoordinationLease(str(tmp_path / "a"), ttl_s=30.0),
                          CoordinationLease(str(tmp_path / "b"), ttl_s=30.0)]).acquire()
    keeper.check()
    keeper.stop()
    for lease in keeper.leases:
        holder = lease_module.read_holder(lease.files, lease.root, 0)
        assert isinstance(holder, LeaseHolder) and holder.released


def test_a_keeper_refused_on_one_source_releases_the_ones_it_took(tmp_path) -> None:
    held = CoordinationLease(str(tmp_path / "b"), me=B, alive=lambda who: True)
    held.acquire()
    first = CoordinationLease(str(tmp_path / "a"))
    with pytest.raises(LeaseHeld):
        LeaseKeeper([first, CoordinationLease(str(tmp_path / "b"))]).acquire()
    holder = lease_module.read_holder(first.files, first.root, 0)
    assert holder is not None and holder.released
