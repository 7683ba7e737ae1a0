"""The driver side of a coordinated source: the coordination service and the channel server of
one run, in Spark's long-lived Python source runner process.

Rules (see also :mod:`sparkcoord.spark.source`, whose reader delegates here):
  1. Created at the reader's first driver-side call, in the runner process only; never in
     Spark's Python workers (this module imports the service and its storage, and fsspec for
     a remote checkpoint directory, which the workers must not pay for:
     docs/decisions/032-worker-imports.md).
  2. ``latest_epoch(start)``: the run's first call restores; later ones signal that the batch
     of ``start`` committed. A new epoch is sealed only when there is something to carry (held
     events, a batch asked for, the job's first batch) or the checkpoint interval passed, and its record is durable before its epoch is
     returned; otherwise ``start`` is returned and Spark runs no batch.
  3. A global failure makes the next call raise, failing the query with the failure's text;
     ``latest_epoch`` first answers "no batch" for up to ``cancel_wait_s``, so that the job
     runner can stop the query (docs/decisions/044-quiet-failover.md).
  4. A run writes under the lease generation present when it starts (the one its job runner
     took: runtime/lease.py rule 3); a run that a newer generation fenced fails with
     ``LeaseLost`` before it writes (``channel.json`` included).

Thread model: Spark's runner calls the reader from its main thread, one call at a time; the
channel server and the coordinators' mailboxes run on their own threads inside the service.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkcoord.channel.faults import fault_plan
from sparkcoord.channel.frames import Delivery
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.encoding import loads
from sparkcoord.core.ids import NO_EPOCH, SubtaskId
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.runtime import layout
from sparkcoord.runtime.kills import kill_point
from sparkcoord.runtime.lease import current_fence
from sparkcoord.runtime.logs import install_log_handler
from sparkcoord.runtime.service import (
    CheckpointDeclined,
    CoordinationService,
    CoordinatorSpec,
    JobFailed,
)
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.spark.spec import SourceSpec

log = logging.getLogger(__name__)


def with_attached(spec: SourceSpec, storage: CheckpointStorage) -> SourceSpec:
    """``spec`` with the downstream operators ``CoordinatedJob.attach`` added after the source's
    DataFrame was made (``attached.pkl``, written by the driver program before the query
    started; runner process, at a run's start)."""
    import dataclasses

    try:
        data = storage.files.read(f"{storage.root}/{layout.ATTACHED}")
    except FileNotFoundError:
        return spec
    attached = loads(data)  # our own checkpoint directory, written by the job (0600)
    taken = {op.name for op in list(spec.operators) + list(spec.recipients)}
    more = [op for op in attached if op.name not in taken]
    return dataclasses.replace(spec, recipients=[*spec.recipients, *more]) if more else spec


class DriverSide:
    """The coordination service and channel server of one run (runner process only)."""

    def __init__(self, spec: SourceSpec, available_now: bool = False) -> None:
        install_log_handler(spec.log_level)  # the runner's stderr reaches the driver's log
        self.closed = False
        storage = CheckpointStorage(spec.checkpoint_url, retain=spec.retain, fsync=spec.fsync,
                                    storage_options=spec.storage_options)
        # rule 4: the lease generation the job runner took before it started this query
        storage.fence = current_fence(storage.files, storage.root, spec.checkpoint_url)
        spec = with_attached(spec, storage)
        self.spec = spec
        self.service = CoordinationService(
            [CoordinatorSpec(op.name, op.coordinator, op.parallelism)
             for op in list(spec.operators) + list(spec.recipients)],
            storage, config=spec.config, available_now=available_now)
        self.secret = secrets.token_bytes(32)
        config = spec.config
        parallelism = sum(op.parallelism for op in list(spec.operators) + list(spec.recipients))
        self.server = ChannelServer(
            self.service.inbox, self.secret, host=spec.channel_host,
            max_frame_bytes=config.max_event_bytes + 4096, deliveries=self,
            first_frame_timeout_s=config.channel_first_frame_timeout_s,
            max_connections=(max(64, 4 * parallelism) if config.max_channel_connections is None
                             else config.max_channel_connections),
            listen_backlog=max(128, 2 * parallelism)).start()
        if spec.channel_fault_plan is not None:
            self.server.fault = self._counting(fault_plan(spec.channel_fault_plan),
                                               f"{storage.root}/faults.json")
        # A job failure: the tasks refused from now on wait to be cancelled
        # (docs/decisions/044-quiet-failover.md)
        self._failed_at: float | None = None
        self.service.add_failure_listener(self._job_failed)
        self.server.failover_hold = self.refusal_hold_ms
        host = spec.channel_advertised_host or self.server.address[0]
        self.address = (host, self.server.address[1])
        self.last_seal = time.monotonic()
        # Where this run listens. Downstream subtasks learn the address and the secret here
        # (they have no InputPartition of ours), and so do client requests; the file is written
        # before the run's first batch plans, and is as private as the checkpoint directory
        # that holds it (mode 0600).
        # The secret is here for downstream subtasks and for client requests of the user's
        # driver program (CoordinatedJob.request), which read this file too.
        info: dict[str, Any] = {"host": self.address[0], "port": self.address[1],
                                "pid": os.getpid(), "run": self.service.run_id,
                                "secret": self.secret.hex()}
        # private: a local file is created 0600 and renamed into place (never readable by others)
        storage.check_fence()
        storage.files.write_atomic(f"{storage.root}/{layout.CHANNEL_INFO}", json.dumps(info).encode(),
                                   private=True)

    def _counting(self, plan: Any, path: str) -> Any:
        # tests only: record how many faults were injected, so a test can prove they happened
        injected = {"count": 0}

        def counted(message: object) -> str | None:
            action: str | None = plan(message)
            if action:
                injected["count"] += 1
                self.service.storage.files.write_atomic(path, json.dumps(injected).encode())
            return action

        return counted

    def _job_failed(self, cause: str) -> None:
        # the service's failure listener (the failing thread)
        self._failure_time()

    def _failure_time(self) -> float | None:
        # When the job failed, stamped by whichever comes first: the failure listener, or a
        # refusal of the failing service (it answers the waiting requests before it calls its
        # listeners, and their refusals must already hold). Any thread: two stamps race
        # harmlessly (both are "now").
        if self._failed_at is None and self.service.failure is not None:
            self._failed_at = time.monotonic()
        return self._failed_at

    def _wait_left_ms(self) -> int | None:
        # what is left of cancel_wait_s since the job failed (negative once over); None
        # while the job has not failed
        failed_at = self._failure_time()
        if failed_at is None:
            return None
        return int((failed_at + self.spec.config.cancel_wait_s - time.monotonic()) * 1000)

    def cancel_wait_ms(self) -> int:
        """How long a task refused now waits for the job runner to cancel it (channel
        threads): what is left of ``cancel_wait_s`` since the job failed; 0 while the job has
        not failed, and after the run closed (the query is gone: nothing will cancel)."""
        left = self._wait_left_ms()
        return 0 if left is None or self.closed else max(0, left)

    def refusal_hold_ms(self) -> int:
        """The hold a refusal carries (channel threads): once the job failed, what is left of
        ``cancel_wait_s``, at least 1 (a refusal because the job failed is told as such also
        once the wait is over: one line, no traceback); 0 while it has not failed.

        Also after the run closed: the query stopped for the failure closes the run while its
        cancelled tasks may still be running, and a task waiting for an answer then gets
        "this run is closed"; it is a task of the failed job, to be cancelled like the rest."""
        left = self._wait_left_ms()
        return 0 if left is None else max(1, left)

    def fetch(self, operator: str, index: int, epoch: int) -> Delivery:
        """A downstream subtask asks for its events of ``epoch`` (channel thread)."""
        svc = self.service
        if operator not in {op.name for op in self.spec.recipients}:
            return Delivery("", epoch, (), f"{operator!r} is not a downstream operator of "
                                           f"source {self.spec.name!r}")
        if epoch != svc.last_sealed or svc.last_committed >= epoch:
            return Delivery("", epoch, (), f"epoch {epoch} is not running (last sealed "
                                           f"{svc.last_sealed}, last committed {svc.last_committed})")
        record = svc.record_for(epoch)
        events = tuple(record.events_for(SubtaskId(operator, index))) if record else ()
        return Delivery(svc.run_id, epoch, events)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.server.close()
            self.service.close()

    def latest_epoch(self, start_epoch: int, *, wait_for_cancel: bool = True) -> int:
        """The end epoch of the next batch after ``start_epoch`` (``start_epoch``: no batch).

        Called by the reader's ``latestOffset`` (runner process, Spark's calling thread).
        After a job failure it raises :class:`JobFailed` (failing the query), but first, for
        up to ``cancel_wait_s`` and unless ``wait_for_cancel`` is false (an ``availableNow``
        run would take "no batch" for its end), answers "no batch": the job runner stops the
        query meanwhile, and Spark logs no failed query (docs/decisions/044-quiet-failover.md)."""
        try:
            return self._latest_epoch(start_epoch)
        except JobFailed:
            if wait_for_cancel and self.cancel_wait_ms() > 0:
                return start_epoch
            raise

    def _latest_epoch(self, start_epoch: int) -> int:
        self.service.latest_offset_called(start_epoch)
        interval = self.spec.checkpoint_interval_s
        due = interval is not None and time.monotonic() - self.last_seal >= interval
        if not (due or self.service.wants_batch()):
            if self.service.available_now and start_epoch != NO_EPOCH:
                # this answer ends an availableNow run: its committed batches' side effects
                # first (Spark's stop() of the source comes after the query ended)
                self.service.run_ending()
            return start_epoch
        while True:
            future = self.service.trigger_checkpoint(self.service.next_checkpoint_id)
            try:
                prepared = future.result()
                break
            except CheckpointDeclined as exc:
                log.warning("%s", exc)
                self.service.raise_if_failed()
                if not self.service.available_now:
                    return start_epoch  # declined: held events stay queued; Spark asks again
                # an availableNow run takes "no batch" for its end, with its work not done
                # and its commits not waited for: try again now (too many declines in a row
                # fail the job: tolerable_checkpoint_failures)
                time.sleep(0.05)
        kill_point("sealing", prepared.checkpoint_id)
        record = self.service.seal(prepared)
        kill_point("sealed", record.epoch)
        self.last_seal = time.monotonic()
        return record.epoch

    def record_of_batch(self, start_epoch: int, end_epoch: int) -> CheckpointRecord | None:
        """The record whose events the batch (start, end] carries (reader's ``partitions``)."""
        return self.service.partitions_called(start_epoch, end_epoch)


def install_sigterm_handler(on_term: Callable[[], None]) -> None:
    """Stop the run on SIGTERM (runner process, main thread; elsewhere nothing).

    The JVM stops the runner with SIGTERM (sometimes twice): repeats are ignored, and the
    handler exits through SystemExit so that ``stop()`` and the finally blocks run.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        on_term()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
