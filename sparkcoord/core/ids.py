"""Identities shared by every layer.

An *epoch* is the service's own checkpoint counter; it travels in the source offset and is not
Spark's batch id (Spark runs batches that carry no new epoch). A *task attempt* is one execution
of a subtask inside the batch of one epoch; the *execution attempt* number that a coordinator
sees is different: it counts the subtask's failures within a run, so that one execution attempt
spans many batches, as in Flink.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The epoch of "nothing sealed yet": Spark's initial offset carries it.
NO_EPOCH = -1


@dataclass(frozen=True, order=True, slots=True)
class SubtaskId:
    """Subtask ``index`` of the coordinated operator ``operator``."""

    operator: str
    index: int

    def __str__(self) -> str:
        return f"{self.operator}[{self.index}]"


@dataclass(frozen=True, order=True, slots=True)
class TaskAttempt:
    """One execution of a subtask in the batch of ``epoch`` during run ``run``.

    ``number`` is Spark's task attempt number (0 for the first try, 1 for the first retry).
    The run id fences tasks of an earlier run of the query: Spark restarts ``number`` at 0.
    """

    run: str
    subtask: SubtaskId
    epoch: int
    number: int

    def __str__(self) -> str:
        return f"{self.subtask}@epoch{self.epoch}#attempt{self.number}(run {self.run})"
