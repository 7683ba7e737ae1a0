"""The client side of a job's requests to its coordinators (:meth:`CoordinatedJob.request
<sparkcoord.spark.job.CoordinatedJob.request>`): which run takes a request, and waiting for the
next run while none can.

Rules:
  1. A request goes to the run that the source's ``channel.json`` names, one at a time per
     driver program (one connection per run), with a number kept when it is re-sent to the
     next run: the service logs it before the coordinator sees it and answers a re-send from
     its log, so it takes effect once (job.py rule 3; docs/protocol.md
     [client-requests-take-effect-once]).
  2. While no run can take it (no ``channel.json`` yet, a run that ended, a response of
     status ``UNAVAILABLE``: a run starting, ending or failed), the request waits for the
     next run, up to its timeout; it is re-sent by the status the server sends, never by a
     refusal's text (docs/decisions/096-client-retry-by-status.md).
  3. A request made from ``until`` on the job handle's own thread (:data:`until_caller`)
     does not wait while a restart is due: that thread performs the restart, so it raises
     :class:`~sparkcoord.core.errors.RunUnavailable` at once
     (docs/decisions/051-client-request-across-failover.md).

Thread model: any thread of the driver program; the job handle's thread (sparkcoord-job)
closes the connection as the job ends.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.runtime import layout

if TYPE_CHECKING:
    from sparkcoord.spark.spec import SourceSpec

#: the JobHandle whose ``until`` runs on this thread, and its query (for ``request``)
until_caller = threading.local()


class UntilCaller(Protocol):
    """What a request made from ``until`` asks of the job handle that calls it (rule 3)."""

    def _restart_due(self, query: Any) -> bool:
        """Whether ``query`` is to be restarted (or the job stopped) rather than asked."""
        ...


class RequestSender:
    """The connection to a job's current run and the numbering of its requests (rule 1). A
    :class:`~sparkcoord.spark.job.CoordinatedJob` holds one; any thread of the driver program
    calls it through the job."""

    def __init__(self) -> None:
        # client requests (request()): one client per run of a source, one request at a time
        self._client_lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self._client_id = uuid.uuid4().hex[:12]
        self._client_seq = 0

    def request(self, specs: Collection[SourceSpec], max_event_bytes: int, operator: str,
                request: Any, timeout_s: float) -> Any:
        """Send ``request`` to coordinator ``operator`` of one of the sources ``specs`` and
        return its answer, waiting for a run up to ``timeout_s`` (rules 1-3). Called by
        :meth:`CoordinatedJob.request <sparkcoord.spark.job.CoordinatedJob.request>`, which
        says what it raises, from any thread of the driver program while the job runs."""

        from sparkcoord.channel.client import ChannelUnavailable, JobClient
        from sparkcoord.channel.frames import ResponseStatus
        from sparkcoord.core.errors import RequestFailed, RequestRefused, RunUnavailable
        from sparkcoord.runtime.files import files_for

        spec = next((sp for sp in specs
                     if operator in {op.name for op in list(sp.operators) + list(sp.recipients)}),
                    None)
        if spec is None:
            known = sorted(op.name for sp in specs
                           for op in list(sp.operators) + list(sp.recipients))
            raise ValueError(f"no coordinated operator {operator!r} in this job (operators: "
                             f"{known})")
        payload = EventCodec(max_event_bytes).encode(request)
        deadline = time.monotonic() + timeout_s
        last = "the query has not started its coordinated source yet"
        # set when a JobHandle calls its until() on its own thread: the thread that restarts
        # the query must not wait for that restart
        handle: UntilCaller | None = getattr(until_caller, "handle", None)
        query = getattr(until_caller, "query", None)

        def failing_over(why: str) -> None:
            if handle is not None and handle._restart_due(query):
                raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: the "
                                     f"job is failing over; ask again after its restart "
                                     f"({why})")

        def wait_for_run(why: str, pause_s: float) -> None:
            # no run can take the request now: wait for the next one (re-read channel.json)
            nonlocal last
            last = why
            failing_over(why)
            time.sleep(min(pause_s, max(0.0, deadline - time.monotonic())))

        # one request at a time (one connection per run); the handle's thread stops waiting
        # for the lock when a restart is due (another thread may hold it, waiting for the run
        # that this thread is to start)
        while not self._client_lock.acquire(timeout=0.1):
            failing_over("another request of this driver program is waiting for the job")
            if time.monotonic() > deadline:
                raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: no "
                                     f"answer within {timeout_s} s (another request of this "
                                     f"driver program held the channel)")
        try:
            # one number per call, kept when the call is re-sent to the next run after a
            # restart: the service answers a request it logged once (docs/protocol.md
            # [client-requests-take-effect-once])
            seq = self._client_seq
            self._client_seq += 1
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: "
                                         f"no answer within {timeout_s} s ({last})")
                try:
                    files, root = files_for(spec.checkpoint_url, spec.storage_options)
                    info = json.loads(files.read(f"{root}/{layout.CHANNEL_INFO}"))
                except (OSError, ValueError) as exc:
                    wait_for_run(f"no channel.json yet: {exc!r}", 0.2)
                    continue
                key = (spec.name, info["run"])
                client = self._clients.get(key)
                if client is None:
                    for old in self._clients.values():
                        old.close()
                    self._clients = {key: (client := JobClient(
                        (info["host"], int(info["port"])), bytes.fromhex(info["secret"]),
                        self._client_id, max_retries=2))}
                try:
                    response = client.request(operator, payload, remaining, seq)
                except ChannelUnavailable as exc:  # the run ended; a restart writes a new file
                    self._clients.pop(key, None)
                    wait_for_run(str(exc), 0.2)
                    continue
                reason = response.payload.decode(errors="replace")
                if response.status is ResponseStatus.ANSWER:
                    return loads(response.payload)
                if response.status is ResponseStatus.REFUSED:
                    raise RequestRefused(f"coordinator {operator!r} refused request "
                                         f"{request!r}: {reason}")
                if response.status is ResponseStatus.UNAVAILABLE:
                    # starting or ending a run, or a failed one: the next run takes it (the
                    # server says so by status; docs/protocol.md
                    # [client-requests-take-effect-once])
                    self._clients.pop(key, None)
                    wait_for_run(reason, 0.1)
                    continue
                raise RequestFailed(f"request {request!r} to coordinator {operator!r} got no "
                                    f"answer: {reason}")
        finally:
            self._client_lock.release()

    def release(self) -> None:
        """Close the connection :meth:`request` keeps to the job's current run (handle thread,
        when the job ended: the run is over, and the driver program may live on for long). A
        request still running on another thread keeps it; it ends with the run."""
        if not self._client_lock.acquire(timeout=1.0):
            return
        try:
            for client in self._clients.values():
                client.close()
            self._clients = {}
        finally:
            self._client_lock.release()
