"""The lease on a coordination directory, on a local directory or an fsspec store: taking it,
renewing it, releasing it, and the fence that stops a run which lost it.

The decisions are :mod:`sparkcoord.core.lease`'s (its rules 1-4); this module reads and
writes ``<coordination>/lease/<generation>.json`` and checks processes.

Rules:
  1. The job runner takes the lease of each coordinated source's directory before its first
     query starts (``CoordinatedJob.start``), so a second driver program is refused in its own
     process, before anything of its run is written, with :class:`LeaseHeld` naming the
     holder. It keeps the lease across its restarts, renews it every ``ttl_s / 3`` on a
     thread of its own (``sparkcoord-lease``) and releases it when the job ends.
  2. Taking over creates the next generation exclusively, then deletes the older ones: the
     run of an older generation finds its file gone or a newer one present (the fence, core
     rule 3), whichever generation came after.
  3. The source runner's coordination service reads the generation it runs under when it
     starts (:func:`current_fence`) and checks it (one ``stat`` of two files, or two store
     requests) as it restores, before it writes a record and before it seals an inbound log
     (a seal's log start follows its record; a restore's log start follows the restore's
     check), and before it writes ``channel.json``; a fenced run fails with
     :class:`LeaseLost`. No lease directory (a service started without a job runner: tools,
     tests) means no fence.
  4. Listings and existence checks on an fsspec store bypass its listing cache: another
     process's lease must be seen.

Thread model: :class:`CoordinationLease` is used by the job runner's threads (the user's
thread takes it; the ``sparkcoord-lease`` thread renews it; the handle's thread checks and
releases it), under its own lock. :class:`LeaseFence` is called in the service's critical
section (any thread).
"""

from __future__ import annotations

import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.lease import (
    DEFAULT_TTL_S,
    Identity,
    LeaseHeld,
    LeaseHolder,
    LeaseLost,
    held_message,
    lost_message,
    may_take_over,
)
from sparkcoord.runtime import layout
from sparkcoord.runtime.files import Files, FsspecFiles, files_for

log = logging.getLogger(__name__)

#: how many times a run re-reads the lease after losing a race for the next generation
RACES = 5

#: the run ids of the leases this process holds now (core rule 2: a second job of the same
#: driver program on one checkpoint is refused; one that ended without releasing is not)
_HELD_HERE: set[str] = set()
_HELD_LOCK = threading.Lock()


def process_started(pid: int) -> str | None:
    """A token of when process ``pid`` started ("" if the system does not tell; None if no
    such process runs, or it is a zombie). Linux: the start time in ``/proc/<pid>/stat``.
    Any thread."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": the state, then more
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""  # field 22 of proc(5): starttime


def boot_id() -> str:
    """This machine's boot id ("" where the system has none: then no holder's process can be
    checked, and only the ttl frees a lease)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def this_process() -> Identity:
    return Identity(socket.gethostname(), boot_id(), os.getpid(), process_started(os.getpid()) or "")


def process_alive(identity: Identity) -> bool:
    """Whether the process ``identity`` names runs on this machine: its pid runs and, where
    both are known, started when it did (a pid reused by another process is not it). Any
    thread."""
    started = process_started(identity.pid)
    if started is None:
        return False
    if identity.started and started:
        return started == identity.started
    return True  # a process of that pid runs and cannot be told apart: taken as the holder


def _names(files: Files, directory: str) -> list[str]:
    if isinstance(files, FsspecFiles):
        files.fs.invalidate_cache(directory)  # rule 4
    return files.names(directory)


def _exists(files: Files, path: str) -> bool:
    if isinstance(files, FsspecFiles):
        files.fs.invalidate_cache(posixpath.dirname(path))
    return files.exists(path)


def generations(files: Files, root: str) -> list[int]:
    """The generations present in ``<root>/lease``, ascending (one listing). Any thread."""
    found = []
    for name in _names(files, posixpath.join(root, layout.LEASE)):
        stem = name[:-len(layout.LEASE_SUFFIX)] if name.endswith(layout.LEASE_SUFFIX) else ""
        if stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def lease_path(root: str, generation: int) -> str:
    return posixpath.join(root, layout.LEASE, f"{generation}{layout.LEASE_SUFFIX}")


def read_holder(files: Files, root: str, generation: int) -> LeaseHolder | None:
    """The holder of ``generation``; None if its file is gone (a newer holder deleted it)."""
    path = lease_path(root, generation)
    try:
        return LeaseHolder.decode(files.read(path), path)
    except FileNotFoundError:
        return None


class LeaseFence:
    """Core rule 3 for a run of ``generation``: :meth:`check` raises :class:`LeaseLost` once
    a newer run took the lease over (rule 3 of this module)."""

    def __init__(self, files: Files, root: str, generation: int, location: str,
                 wall: Callable[[], float] = time.time) -> None:
        self.files, self.root, self.generation = files, root, generation
        self.location = location
        self._wall = wall
        self.lost: str | None = None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease moved on. Called by the checkpoint storage
        before it writes a record or seals an inbound log, by the service as it restores (its
        threads), and by the job runner (its threads)."""
        if self.lost is None and (
                _exists(self.files, lease_path(self.root, self.generation + 1))
                or not _exists(self.files, lease_path(self.root, self.generation))):
            newer = None
            for g in reversed(generations(self.files, self.root)):
                try:
                    newer = read_holder(self.files, self.root, g) if g > self.generation else None
                except CorruptRecord:
                    newer = None
                break
            self.lost = lost_message(self.location, self.generation, newer, self._wall())
        if self.lost is not None:
            raise LeaseLost(self.lost)


def current_fence(files: Files, root: str, location: str) -> LeaseFence | None:
    """The fence of the run starting now: the highest generation present, None if no lease
    was ever taken on ``root``. Called by the source runner as its run starts (rule 3)."""
    present = generations(files, root)
    return LeaseFence(files, root, present[-1], location) if present else None


class CoordinationLease:
    """This driver program's lease on one coordination directory (module rules 1-2)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 ttl_s: float = DEFAULT_TTL_S, wall: Callable[[], float] = time.time,
                 me: Identity | None = None,
                 alive: Callable[[Identity], bool] = process_alive) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {ttl_s}")
        self.url = url
        self.files, self.root = files_for(url, storage_options)
        self.ttl_s = ttl_s
        self._wall = wall
        self._me = me or this_process()
        self._alive = alive
        self.run = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self.holder: LeaseHolder | None = None
        self.fence: LeaseFence | None = None
        self.lost: str | None = None

    def _verdict(self, taking: bool = True) -> tuple[int, LeaseHolder | None]:
        """The highest generation and its holder, after refusing if that holder keeps it
        (``taking``: a takeover follows, and is logged)."""
        present = generations(self.files, self.root)
        if not present:
            return -1, None
        top = present[-1]
        try:
            holder = read_holder(self.files, self.root, top)
        except CorruptRecord as exc:
            # rule 1's files are created complete (or not at all): this is damage
            raise CorruptRecord(f"{exc}. Delete it if no driver program runs this job") from None
        if holder is None:
            return top, None  # deleted meanwhile by a newer holder: read again
        now = self._wall()
        with _HELD_LOCK:
            here = holder.run in _HELD_HERE
        verdict = may_take_over(holder, self._me, now, self._alive(holder.identity)
                                if holder.identity.same_machine(self._me) else None, here)
        if not verdict.take:
            raise LeaseHeld(held_message(self.url, holder, verdict, self._me, now))
        if taking and not holder.released:
            log.warning("taking over the lease of %s from %s: %s", self.url,
                        holder.describe(now), verdict.reason)
        return top, holder

    def peek(self) -> None:
        """Raise :class:`LeaseHeld` if another driver program holds the lease now (one that
        would refuse :meth:`acquire`); nothing else. Called by ``CoordinatedJob.sources``
        (driver program thread) before it writes to the directory: a second program is
        refused as it builds its DataFrame. A lease of this very process is not looked at."""
        present = generations(self.files, self.root)
        if not present:
            return
        holder = read_holder(self.files, self.root, present[-1])
        if holder is None or holder.identity == self._me:
            return
        self._verdict(taking=False)

    def acquire(self) -> LeaseHolder:
        """Take the lease (rule 1), or raise :class:`LeaseHeld` naming the holder. Called by
        ``CoordinatedJob.start`` on the user's thread, before any query starts."""
        for _ in range(RACES):
            top, _old = self._verdict()
            now = self._wall()
            holder = LeaseHolder(top + 1, self._me.host, self._me.boot, self._me.pid,
                                 self._me.started, self.run, now, now, self.ttl_s)
            try:
                self.files.create_exclusive(lease_path(self.root, holder.generation),
                                            holder.encode())
            except FileExistsError:
                continue  # another run took it first: decide again on its lease
            for older in generations(self.files, self.root):
                if older < holder.generation:
                    self.files.remove(lease_path(self.root, older))
            with self._lock:
                self.holder, self.lost = holder, None
                self.fence = LeaseFence(self.files, self.root, holder.generation, self.url,
                                        self._wall)
            with _HELD_LOCK:
                _HELD_HERE.add(self.run)
            log.info("took the lease of %s (generation %d)", self.url, holder.generation)
            return holder
        raise LeaseHeld(f"checkpoint {self.url}: other driver programs took the lease "
                        f"{RACES} times while this one tried; stop them and start again")

    def check(self) -> None:
        """Raise :class:`LeaseLost` if a newer run took the lease over (job runner threads:
        before each query start, and after a query failed)."""
        with self._lock:
            fence = self.fence
        if fence is None:
            raise LeaseLost(f"checkpoint {self.url}: this job holds no lease")
        try:
            fence.check()
        except LeaseLost as exc:
            self.lost = str(exc)
            raise

    def renew(self) -> None:
        """Write the lease again with the time now (the ``sparkcoord-lease`` thread, every
        ``ttl_s / 3``); :class:`LeaseLost` if it moved on (then nothing is written)."""
        self.check()
        with self._lock:
            holder = self.holder
            assert holder is not None
            holder = LeaseHolder(**{**holder.__dict__, "renewed": self._wall()})
            self.files.write_atomic(lease_path(self.root, holder.generation), holder.encode())
            self.holder = holder

    def release(self) -> None:
        """Mark the lease released, so that the next driver program takes it at once (the
        handle's thread as the job ends). A lease that was lost is left alone."""
        with _HELD_LOCK:
            _HELD_HERE.discard(self.run)
        with self._lock:
            holder = self.holder
        if holder is None:
            return
        try:
            self.check()
        except LeaseLost:
            return
        except Exception:  # noqa: BLE001 - the store is gone: the ttl frees the lease
            log.warning("cannot release the lease of %s", self.url, exc_info=True)
            return
        released = LeaseHolder(**{**holder.__dict__, "renewed": self._wall(), "released": True})
        try:
            self.files.write_atomic(lease_path(self.root, holder.generation), released.encode())
        except Exception:  # noqa: BLE001 - as above
            log.warning("cannot release the lease of %s", self.url, exc_info=True)


class LeaseKeeper:
    """The leases of one job (one per coordinated source) and the thread that renews them
    (module rule 1). Started by ``CoordinatedJob.start``; ``stop`` on the handle's thread."""

    def __init__(self, leases: Sequence[CoordinationLease]) -> None:
        self.leases = list(leases)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None

    def acquire(self) -> LeaseKeeper:
        """Take every lease in order, or none (a refusal releases those taken). User's
        thread."""
        taken: list[CoordinationLease] = []
        try:
            for lease in self.leases:
                lease.acquire()
                taken.append(lease)
        except BaseException:
            for lease in taken:
                lease.release()
            raise
        if self.leases:
            interval = min(lease.ttl_s for lease in self.leases) / 3
            self._thread = threading.Thread(target=self._renew, args=(interval,),
                                            name="sparkcoord-lease", daemon=True)
            self._thread.start()
        return self

    def _renew(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for lease in self.leases:
                try:
                    lease.renew()
                except LeaseLost as exc:
                    self.lost = str(exc)
                    log.error("%s", exc)
                    return
                except Exception:  # noqa: BLE001 - a store hiccup: the next renewal tries
                    log.warning("cannot renew the lease of %s", lease.url, exc_info=True)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if any lease was taken over (handle thread)."""
        if self.lost is not None:
            raise LeaseLost(self.lost)
        for lease in self.leases:
            lease.check()

    def stop(self) -> None:
        """Stop renewing and release every lease (handle thread, as the job ends)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for lease in self.leases:
            lease.release()
