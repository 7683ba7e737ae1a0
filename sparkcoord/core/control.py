"""Control items that travel like events but are meant for the runtime, not the user's code.

Thread model: none (plain values).
"""

from __future__ import annotations

from sparkcoord.core.encoding import encoded


@encoded("core.BatchRequested")
class BatchRequested:
    """A subtask asks for another batch (``SubtaskContext.request_batch``): it has work
    pending. Sent and logged like an event; the runtime takes it off before the coordinator's
    ``handle_event_from_operator`` and seals a new epoch at Spark's next ``latestOffset`` even
    if nothing else is to carry."""

    __slots__ = ()

    def __getstate__(self) -> dict[str, object]:
        return {}

    def __setstate__(self, state: dict[str, object]) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchRequested)

    def __hash__(self) -> int:
        return hash(BatchRequested)

    def __repr__(self) -> str:
        return "BatchRequested()"
