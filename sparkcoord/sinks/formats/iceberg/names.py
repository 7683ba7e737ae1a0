"""The names the sink gives in an Iceberg table: the keys of its snapshots' summaries and the
table properties that fence it (``commit.py`` rules 1-2), and the names of the data files a
merge writes (``mergefiles.py`` rule 2), given by :class:`MergeLocationProvider`, which keeps
each merge attempt's locations for the merge that lost its commit (``commit.py`` rule 5).
A rule number alone is ``commit.py``'s.

Thread model: the commit worker thread, and pyiceberg's writing threads for
:meth:`MergeLocationProvider.new_data_location` (hence the lock).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from pyiceberg.table.locations import LocationProvider

from sparkcoord.sinks.files import DATA_DIR, check_job_id
from sparkcoord.sinks.mergefiles import merge_file_name

#: Keys of a snapshot's summary (rule 1).
JOB_KEY, EPOCH_KEY, RUN_KEY = "sparkcoord.job-id", "sparkcoord.epoch", "sparkcoord.run-id"


def epoch_property(job_id: str) -> str:
    return f"sparkcoord.{job_id}.epoch"


def run_property(job_id: str) -> str:
    return f"sparkcoord.{job_id}.run"


#: In-memory table properties (``mergefiles.py`` rule 2): who names the files pyiceberg writes.
WRITING_JOB, WRITING_EPOCH = "sparkcoord.writing.job-id", "sparkcoord.writing.epoch"
#: the in-memory property naming one merge attempt, whose file locations the provider keeps
WRITING_ATTEMPT = "sparkcoord.writing.attempt"
#: the locations each live merge attempt's provider handed out, by attempt (rule 5: a lost
#: attempt deletes them); pyiceberg may write on threads of its own, hence the lock
_WRITTEN: dict[str, list[str]] = {}
_WRITTEN_LOCK = threading.Lock()


def _written_by(attempt: str) -> list[str]:
    with _WRITTEN_LOCK:
        return list(_WRITTEN.get(attempt, ()))


def _forget_attempt(attempt: str) -> None:
    with _WRITTEN_LOCK:
        _WRITTEN.pop(attempt, None)


_PROVIDER = "write.py-location-provider.impl"


class MergeLocationProvider(LocationProvider):
    """pyiceberg's location provider while a merge commit writes (rule 5, ``mergefiles.py``
    rule 2): every data file in ``data/`` under a merge file's name. Made by pyiceberg
    (``load_location_provider``, once per write) on the commit worker thread, from the
    properties :func:`with_merge_names` put in memory."""

    def __init__(self, table_location: str, table_properties: dict[str, str]) -> None:
        super().__init__(table_location, table_properties)
        self._job = check_job_id(table_properties[WRITING_JOB])
        self._epoch = int(table_properties[WRITING_EPOCH])
        self._attempt = table_properties.get(WRITING_ATTEMPT)

    def new_data_location(self, data_file_name: str, partition_key: Any = None) -> str:
        """Where pyiceberg writes its next data file (pyiceberg, on the commit worker thread or
        a writing thread of its own)."""
        # always data/ (not write.data.path): the sweep lists the table's data/ directory;
        # a token per file: pyiceberg's own name is not ours to parse
        name = merge_file_name(self._job, self._epoch, uuid.uuid4().hex[:12], 0)
        location = f"{self.table_location.rstrip('/')}/{DATA_DIR}/{name}"
        if self._attempt is not None:
            with _WRITTEN_LOCK:
                # only while its merge runs (a write still going after it ended adds nothing)
                if self._attempt in _WRITTEN:
                    _WRITTEN[self._attempt].append(location)
        return location


def with_merge_names(table: Any, job_id: str, epoch: int, attempt: str | None = None) -> Any:
    """``table`` (a pyiceberg Table) whose in-memory metadata names the data files pyiceberg
    writes for ``epoch``'s merge the sink's way (``mergefiles.py`` rule 2), and with
    ``attempt`` keeps their locations for :func:`_written_by`; the stored table's properties
    are untouched (rule 3's reasoning: the catalog applies our updates only)."""
    properties = {**table.metadata.properties, _PROVIDER: f"{__name__}.MergeLocationProvider",
                  WRITING_JOB: check_job_id(job_id), WRITING_EPOCH: str(epoch)}
    if attempt is not None:
        properties[WRITING_ATTEMPT] = attempt
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table
