"""The lease on a coordination directory, as data and decisions (no I/O, no clock of its own).

One driver program at a time may run a job on a checkpoint location: two runs append to,
truncate and seal the same inbound logs, and leave the checkpoint unrestorable. The job
runner therefore holds a lease on each coordination directory while its job runs
(:mod:`sparkcoord.runtime.lease` does the I/O; docs/spark.md "One driver per checkpoint").

Rules:
  1. A lease is one file per *generation*, ``lease/<generation>.json``, created exclusively
     (it must not exist); the holder is the writer of the highest generation. A new holder
     creates the next generation, so of two runs racing for it one wins and the other
     re-reads and decides again.
  2. A run may take the lease over (:func:`may_take_over`) when the holder released it, when
     the holder ran on this machine (same host name and boot) and its process is gone (its
     pid is not running, or runs a process that started at another time: a reused pid), or
     when the holder's last renewal is more than its ``ttl_s`` old and its process cannot be
     seen (another machine). A holder on this machine whose process is alive is never taken
     over, however old its renewal: a paused driver is alive, and would write on waking.
  3. A run whose generation is no longer the highest (or whose file was deleted by a newer
     holder) has lost the lease: it must write nothing more (the *fence*, checked by the
     coordination service before it writes a record, starts or seals a log).
  4. Refusals (:class:`LeaseHeld`, :class:`LeaseLost`) are permanent: a restart cannot change
     them, so the job runner raises them and does not restart.

Thread model: none (pure functions and frozen data).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from sparkcoord.core.errors import CorruptRecord, SparkCoordError

#: default ``ttl_s``: how long an unrenewed lease of a holder on another machine is honoured
DEFAULT_TTL_S = 30.0


class LeaseHeld(SparkCoordError):
    """Another driver program holds the lease on this job's checkpoint: the run is refused."""

    permanent = True


class LeaseLost(SparkCoordError):
    """A newer run took this job's lease over: this run must stop writing (rule 3)."""

    permanent = True


@dataclass(frozen=True)
class Identity:
    """Who a process is, as far as another process can check: host name, boot id ("" where
    the system does not tell), pid and the process's start (a token, "" where unknown)."""

    host: str
    boot: str
    pid: int
    started: str

    def same_machine(self, other: Identity) -> bool:
        return self.host == other.host and self.boot == other.boot and self.boot != ""


@dataclass(frozen=True)
class LeaseHolder:
    """The content of one generation's file: who holds it, since when, until when."""

    generation: int
    host: str
    boot: str
    pid: int
    started: str
    #: the job runner's lease id (one per ``CoordinatedJob.start``)
    run: str
    #: wall-clock seconds (the holder's clock) when it took the lease and last renewed it
    since: float
    renewed: float
    ttl_s: float
    released: bool = False

    @property
    def identity(self) -> Identity:
        return Identity(self.host, self.boot, self.pid, self.started)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> LeaseHolder:
        try:
            fields = json.loads(data)
            return cls(int(fields["generation"]), str(fields["host"]), str(fields["boot"]),
                       int(fields["pid"]), str(fields["started"]), str(fields["run"]),
                       float(fields["since"]), float(fields["renewed"]),
                       float(fields["ttl_s"]), bool(fields.get("released", False)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecord(f"{where}: not a lease file ({exc!r})") from None

    def describe(self, now: float) -> str:
        """One phrase naming the holder: host, pid, run, since when, last renewal."""
        return (f"pid {self.pid} on host {self.host} (lease run {self.run}, generation "
                f"{self.generation}, held since {_utc(self.since)}, last renewed "
                f"{max(0.0, now - self.renewed):.0f} s ago)")


def _utc(wall: float) -> str:
    """``wall`` (Unix seconds) as ``YYYY-MM-DDTHH:MM:SSZ``; pure arithmetic (the core imports
    no clock: Howard Hinnant's days-to-civil algorithm)."""
    seconds = int(wall // 1)
    days, rest = divmod(seconds, 86400)
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return (f"{year:04d}-{month:02d}-{day:02d}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:"
            f"{rest % 60:02d}Z")


@dataclass(frozen=True)
class Verdict:
    """Whether the lease may be taken over from its holder, and why (for the log or the
    refusal)."""

    take: bool
    reason: str


def may_take_over(holder: LeaseHolder, me: Identity, now: float, alive: bool | None,
                  held_here: bool) -> Verdict:
    """Rule 2. ``alive``: whether the holder's process runs (None: it cannot be seen from
    here); ``held_here``: whether the holder is a lease this very process still holds (a
    second job of the same driver program). ``now``: this process's wall clock."""
    if holder.released:
        return Verdict(True, "the holder released it")
    if holder.identity.same_machine(me):
        if holder.pid == me.pid and holder.started == me.started:
            if held_here:
                return Verdict(False, "it is held by another job of this driver program")
            return Verdict(True, "this driver program held it for a job that ended")
        if alive is False:
            return Verdict(True, f"its process (pid {holder.pid}) is gone")
        if alive is True:
            return Verdict(False, f"its process (pid {holder.pid}) is running on this host")
    if now - holder.renewed > holder.ttl_s:
        return Verdict(True, f"it was last renewed {now - holder.renewed:.0f} s ago, more "
                             f"than its {holder.ttl_s:g} s")
    return Verdict(False, f"it was renewed {max(0.0, now - holder.renewed):.0f} s ago (it "
                          f"lapses {holder.ttl_s:g} s after its last renewal)")


def held_message(location: str, holder: LeaseHolder, verdict: Verdict, me: Identity,
                 now: float) -> str:
    """The text of :class:`LeaseHeld`: the holder, why it holds, and the way on."""
    if holder.identity.same_machine(me):
        gone = (f"if it hangs, stop it (kill {holder.pid}); the lease is taken over as "
                f"soon as that process is gone")
    else:
        gone = (f"if it died, the lease lapses {holder.ttl_s:g} s after its last renewal "
                f"(at {_utc(holder.renewed + holder.ttl_s)}, by the holder's clock): start "
                f"again after that")
    return (f"checkpoint {location}: another driver program runs this job: "
            f"{holder.describe(now)}; {verdict.reason}. Two runs on one checkpoint write the "
            f"same coordination files and would leave it unrestorable, so this run is "
            f"refused before it writes anything. Stop the other driver program and start "
            f"this one again, or give this job its own checkpoint_dir; {gone}")


def lost_message(location: str, generation: int, newer: LeaseHolder | None, now: float) -> str:
    """The text of :class:`LeaseLost` for a run of ``generation`` (rule 3)."""
    who = (f"generation {newer.generation}: {newer.describe(now)}" if newer is not None
           else f"a generation after {generation}")
    return (f"checkpoint {location}: this run's lease (generation {generation}) was taken "
            f"over by a newer run ({who}), so this run stops writing to the checkpoint. "
            f"This happens when this driver program stopped renewing the lease for longer "
            f"than its ttl_s (paused, or cut off from the store) and another driver program "
            f"started on the same checkpoint; that one runs the job now. A restart cannot "
            f"change this: not restarted")
