"""The subtask runtime on executors: one subtask for one batch, inside a Spark task.

Order (DESIGN rule 4 and 10): register the task attempt with the service (a retry is detected
there and handled before this attempt's events are accepted), restore the state of the newest
earlier epoch, open the operator, hand it every event of the epoch in send order before any
data, ``process``, wait until every event sent to the coordinator is acknowledged, store the
state for this epoch, close.

A first attempt registers lazily (its REGISTER frame travels with its first event; a task
that sends nothing never connects); a retry registers before anything else. See the rules of
:mod:`sparkcoord.channel.client`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

from sparkcoord.channel.client import ChannelClient
from sparkcoord.channel.frames import ResponseStatus
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import RequestFailed, RequestRefused
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.runtime.subtask_state import SubtaskStateStore
from sparkcoord.spark.faults import kill_point
from sparkcoord.spark.operator import SubtaskContext, SubtaskOperator
from sparkcoord.spark.source import CoordinatedPartition, SourceSpec


def spark_attempt_number() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


_STORES: dict[tuple[str, int, bool, str], SubtaskStateStore] = {}


def state_store(spec: SourceSpec) -> SubtaskStateStore:
    """The subtask-state store of ``spec``'s job, one per Python worker process (workers are
    reused across tasks, one task at a time): saves resolving the store in every task."""
    key = (spec.checkpoint_url, spec.retain, spec.fsync, repr(sorted(spec.storage_options.items())))
    store = _STORES.get(key)
    if store is None:
        if len(_STORES) > 16:
            _STORES.clear()
        store = _STORES[key] = SubtaskStateStore.for_url(
            spec.checkpoint_url, retain=spec.retain, fsync=spec.fsync,
            storage_options=spec.storage_options)
    return store


def request_function(client: ChannelClient, codec: EventCodec, sid: SubtaskId, epoch: int
                     ) -> Callable[[Any, float], Any]:
    """What ``SubtaskContext.request`` calls in a task: encode, ask over the channel, decode
    the logged answer or raise an error naming operator, subtask, epoch and request."""
    def ask(request: Any, timeout_s: float) -> Any:
        try:
            response = client.request(codec.encode(request), timeout_s)
        except RequestFailed as exc:
            raise RequestFailed(f"request {request!r} of {sid} in epoch {epoch}: {exc}") from None
        if response.status is ResponseStatus.ANSWER:
            kill_point("answered", epoch)
            return pickle.loads(response.payload)
        reason = response.payload.decode(errors="replace")
        if response.status is ResponseStatus.REFUSED:
            raise RequestRefused(f"coordinator {sid.operator!r} refused request {request!r} of "
                                 f"{sid} in epoch {epoch}: {reason}")
        raise RequestFailed(f"request {request!r} of {sid} in epoch {epoch} got no answer: "
                            f"{reason}")
    return ask


def run_subtask(spec: SourceSpec, p: CoordinatedPartition) -> Iterator[tuple[Any, ...]]:
    """Generator of the subtask's rows for the batch of ``p.epoch`` (task thread)."""
    op_spec = spec.operator(p.operator)
    sid = SubtaskId(p.operator, p.index)
    number = spark_attempt_number()
    client = ChannelClient(p.address, p.secret, TaskAttempt(p.run_id, sid, p.epoch, number))
    if number > 0:
        client.register()  # a retry: the service resets the coordinator before anything else
    else:
        client.register_with_first_event()
    store = state_store(spec)
    restored = store.read_before(sid, p.epoch, p.previous_epoch)
    state = pickle.loads(restored[1]) if restored is not None else None
    codec = EventCodec(spec.config.max_event_bytes)

    def send(event: Any) -> None:
        client.send(codec.encode(event))

    context = SubtaskContext(p.operator, p.index, op_spec.parallelism, p.epoch,
                             client.registered_attempt, number, send,
                             request_function(client, codec, sid, p.epoch))
    operator: SubtaskOperator = op_spec.operator()
    try:
        operator.open(context, state)
        for payload in p.events:
            rows = operator.handle_operator_event(pickle.loads(payload))
            if rows is not None:
                yield from rows
        rows = operator.process()
        if rows is not None:
            yield from rows
        kill_point("mid-batch", p.epoch)
        client.flush()
        snapshot = operator.snapshot_state()
        if snapshot is not None or restored is not None:
            # a stateless subtask (None, restored from nothing) writes nothing: restoring
            # "no state" gives None either way
            store.write(sid, p.epoch, pickle.dumps(
                snapshot, protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        try:
            operator.close()
        finally:
            client.close()
