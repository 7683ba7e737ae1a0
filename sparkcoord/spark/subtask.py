"""The subtask runtime on executors: one subtask for one batch, inside a Spark task.

Order (docs/protocol.md [events-before-data] [subtask-state-per-epoch]
[task-waits-for-its-acks]): register the task attempt with the service (a retry is detected
there and handled before this attempt's events are accepted), restore the state of the newest
earlier epoch, open the operator, hand it every event of the epoch in send order before any
data, ``process``, wait until every event sent to the coordinator is acknowledged, store the
state for this epoch, close.

A first attempt registers lazily (its REGISTER frame travels with its first event, or with
its FINISHED when it sent nothing: every task says when it finished, docs/protocol.md
[every-attempt-finishes]); a retry registers before anything else. See the rules of
:mod:`sparkcoord.channel.client`.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from sparkcoord.channel.client import ChannelClient, ChannelRejected
from sparkcoord.channel.frames import ResponseStatus
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import (
    OperatorCodeFailed,
    RequestFailed,
    RequestRefused,
    SparkCoordError,
)
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.operator import SubtaskContext, SubtaskOperator
from sparkcoord.runtime.kills import KILLS_PLANNED, kill_point
from sparkcoord.runtime.subtask_state import SubtaskStateStore
from sparkcoord.spark.spec import CoordinatedPartition, SourceSpec


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
            if KILLS_PLANNED:  # test-only (runtime/kills.py); a constant False otherwise
                kill_point("answered", epoch)
            return loads(response.payload)
        reason = response.payload.decode(errors="replace")
        if response.status is ResponseStatus.REFUSED:
            raise RequestRefused(f"coordinator {sid.operator!r} refused request {request!r} of "
                                 f"{sid} in epoch {epoch}: {reason}")
        raise RequestFailed(f"request {request!r} of {sid} in epoch {epoch} got no answer: "
                            f"{reason}")
    return ask


class user_code:  # noqa: N801 - used like a function: ``with user_code(sid, epoch, "open()")``
    """Around a call into the operator's code (task thread): the user's exception leaves with
    a note naming operator, subtask, epoch and callback (its type, message and frames kept).

    Spark's task failure text is the worker's formatting of the exception that leaves the
    task, with PySpark's own frames removed and (by default,
    ``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled``) any ``__cause__``
    dropped: a wrapping exception would hide the user's frames, a note survives. Before
    Python 3.11 (no notes) the exception is wrapped in :class:`OperatorCodeFailed` whose
    message carries the user's formatted traceback. sparkcoord's own errors, already named,
    pass through unchanged."""

    __slots__ = ("sid", "epoch", "callback")

    def __init__(self, sid: SubtaskId, epoch: int, callback: str) -> None:
        self.sid, self.epoch, self.callback = sid, epoch, callback

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, SparkCoordError):
            return  # nothing raised, an exit (GeneratorExit, KeyboardInterrupt), or our own
        from_users_frame(exc)
        noted(exc, self.sid, self.epoch, self.callback)  # re-raised by the with statement


#: the runtime's own frames (this package) that lead a user's traceback
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def from_users_frame(exc: BaseException) -> None:
    """Drop the runtime's frames that lead ``exc``'s traceback, so that it starts at the
    user's frame. Besides being shorter, it is right: PySpark's simplified traceback prints
    each frame at the line the frame is at *now*, and a finished generator such as
    :func:`run_subtask` is at the last line of its ``finally`` (``client.close()``), not at
    the call that raised. Call from the outermost runtime frame, with nothing of the runtime
    left to unwind through but re-raises (they add no traceback entries)."""
    tb = exc.__traceback__
    while (tb is not None and tb.tb_next is not None
           and tb.tb_frame.f_code.co_filename.startswith(_RUNTIME_DIR)):
        tb = tb.tb_next
    exc.__traceback__ = tb


#: how the note :func:`noted` adds begins
NOTE_PREFIX = "sparkcoord: "


def noted(exc: Exception, sid: SubtaskId, epoch: int, callback: str) -> None:
    """Name where ``exc`` came from (task thread): a note on it, or (Python 3.10) raise
    :class:`OperatorCodeFailed` with the user's traceback in its message."""
    where = f"{sid} in epoch {epoch}: raised by the operator's {callback}"
    if hasattr(exc, "add_note"):
        exc.add_note(f"{NOTE_PREFIX}{where}")
        return
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    raise OperatorCodeFailed(f"{where}:\n{text}") from exc


class task_boundary:  # noqa: N801 - used like a function: ``with task_boundary():``
    """Around a whole subtask run, in its outermost frame (task thread): what leaves the task
    is told plainly, as the task's error in Spark's log.

    A refusal by the coordination service (:class:`ChannelRejected`: the job failed, the run
    ended, a stale attempt) leaves with one frame, the task's entry point: the task did
    nothing wrong, so frames of the runtime and of the operator (where it sent an event) say
    nothing, and Spark's text for the task is that frame and the one line of the reason
    (issue 14, docs/decisions/044-quiet-failover.md). An exception of the operator's code (noted
    by :class:`user_code`) leaves starting at the user's frame: the frames of this wrapper,
    added as the exception passed through it, are dropped again."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, ChannelRejected) and tb is not None:
            # keep this frame alone: with no frame outside PySpark at all, its simplified
            # traceback gives up and prints every PySpark frame instead
            tb.tb_next = None
            exc.__traceback__ = tb
        elif exc is not None and any(str(note).startswith(NOTE_PREFIX)
                                     for note in getattr(exc, "__notes__", ())):
            from_users_frame(exc)


def run_subtask(spec: SourceSpec, p: CoordinatedPartition) -> Iterator[tuple[Any, ...]]:
    """Generator of the subtask's rows for the batch of ``p.epoch`` (task thread, called by
    the coordinated source's ``read``)."""
    with task_boundary():
        yield from _subtask_rows(spec, p)


def _subtask_rows(spec: SourceSpec, p: CoordinatedPartition) -> Iterator[tuple[Any, ...]]:
    op_spec = spec.operator(p.operator)
    sid = SubtaskId(p.operator, p.index)
    number = spark_attempt_number()
    client = ChannelClient(p.address, p.secret, TaskAttempt(p.run_id, sid, p.epoch, number))
    if number > 0 or p.continues_history:
        # a retry: the service resets the coordinator before anything else, or tells it the
        # length of the history it continues (as it does a rerun's task: then it must say
        # at its end if it sent less: docs/protocol.md [logged-finish-binds-the-rerun])
        client.register()
    else:
        client.register_with_first_event()
    store = state_store(spec)
    restored = store.read_before(sid, p.epoch, p.previous_epoch)
    state = loads(restored[1]) if restored is not None else None
    codec = EventCodec(spec.config.max_event_bytes)

    def send(event: Any) -> None:
        client.send(codec.encode(event))

    context = SubtaskContext(p.operator, p.index, op_spec.parallelism, p.epoch,
                             client.registered_attempt, number, send,
                             request_function(client, codec, sid, p.epoch))
    with user_code(sid, p.epoch, "constructor"):
        operator: SubtaskOperator = op_spec.operator()
    try:
        with user_code(sid, p.epoch, "open()"):
            operator.open(context, state)
        for payload in p.events:
            event = loads(payload)
            with user_code(sid, p.epoch, "handle_operator_event()"):
                rows = operator.handle_operator_event(event)
            if rows is not None:
                with user_code(sid, p.epoch, "handle_operator_event()"):
                    yield from rows
        with user_code(sid, p.epoch, "process()"):
            rows = operator.process()
        if rows is not None:
            with user_code(sid, p.epoch, "process()"):
                yield from rows
        kill_point("mid-batch", p.epoch)
        client.finish()  # every item acknowledged; what a retry did not send again withdrawn
        with user_code(sid, p.epoch, "snapshot_state()"):
            snapshot = operator.snapshot_state()
        if snapshot is not None or restored is not None:
            # a stateless subtask (None, restored from nothing) writes nothing: restoring
            # "no state" gives None either way
            store.write(sid, p.epoch, pickle.dumps(
                snapshot, protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        try:
            with user_code(sid, p.epoch, "close()"):
                operator.close()
        finally:
            client.close()
