"""Lake table sinks: tasks write parquet files, a coordinator commits each epoch's files to a
Delta or Iceberg table once (issue 28).

This first layer knows no Spark: the task-side writer and its file reports (``files.py``), the
fence between a job and its table (``fencing.py``), the Delta and Iceberg committers
(``delta.py``, ``iceberg.py``; their libraries are the ``lake`` extra, imported only when
used) and the cleanup decision (``cleanup.py``). Nothing else in sparkcoord imports it yet.
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

__all__ = ["ALREADY_COMMITTED", "COMMIT", "CheckpointBehindTable", "ColumnStats", "DataFile",
           "SecondWriter", "SinkFenceError", "TableBehindCheckpoint", "TaskFileWriter"]
