"""Lake table sinks: tasks write parquet files, a coordinator commits each epoch's files to a
Delta or Iceberg table once (issue 28).

The builder is :class:`LakeSink` (``stream.py``, the only module that reaches Spark's adapter).
Below it, knowing no Spark: the coordinator that commits (``coordinator.py``) and the subtask
that writes (``task.py``), the table they write (``target.py``), the task-side writer and its
file reports (``files.py``), the fence between a job and its table (``fencing.py``), the Delta
and Iceberg committers (the package ``formats/``, a package per format; their libraries are the
``lake`` extra, imported only when used) and the cleanup decision (``cleanup.py``).
"""

from sparkcoord.sinks.fencing import (
    ALREADY_COMMITTED,
    COMMIT,
    CheckpointBehindTable,
    SecondWriter,
    SinkFenceError,
    TableBehindCheckpoint,
)
from sparkcoord.sinks.files import ColumnStats, DataFile, TaskFileWriter
from sparkcoord.sinks.stream import LakeSink

__all__ = ["ALREADY_COMMITTED", "COMMIT", "CheckpointBehindTable", "ColumnStats", "DataFile",
           "LakeSink", "SecondWriter", "SinkFenceError", "TableBehindCheckpoint",
           "TaskFileWriter"]
