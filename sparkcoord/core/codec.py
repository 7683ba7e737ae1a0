"""The operator event codec: pickle with a size limit, errors at send time.

Events cross process boundaries (driver runner process <-> Spark executors) and are stored in
checkpoint records, so each one is encoded once, when it is sent, and kept as bytes from then on.
Encoding at send time means an unpicklable or oversized event fails in the caller's own stack,
with nothing queued.
"""

from __future__ import annotations

import pickle
from typing import Any

from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import EventEncodingError, EventTooLarge

DEFAULT_MAX_EVENT_BYTES = 1 << 20

# bound once: encode is on every send's path, and a keyword argument costs more than the pickling
# of a small event
_dumps = pickle.dumps
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class EventCodec:
    """Encodes operator events to bytes and back.

    Thread model: stateless after construction; any thread may call it.
    """

    __slots__ = ("max_event_bytes",)

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes <= 0:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes}")
        self.max_event_bytes = max_event_bytes

    def encode(self, event: Any) -> bytes:
        """Pickle ``event``; raise :class:`EventEncodingError` or :class:`EventTooLarge`.

        Called by whoever sends an event (a coordinator's thread, a subtask's task thread).
        """
        try:
            data = _dumps(event, _PROTOCOL)
        except Exception as exc:  # pickle raises many types: PicklingError, TypeError, ...
            raise EventEncodingError(
                f"event of type {type(event).__qualname__} cannot be pickled: {exc}"
            ) from exc
        if len(data) > self.max_event_bytes:
            raise EventTooLarge(len(data), self.max_event_bytes,
                                f"event of type {type(event).__qualname__}")
        return data

    def decode(self, data: bytes) -> Any:
        """Unpickle an event. Only ever called on bytes from an authenticated or local source."""
        return loads(data)
