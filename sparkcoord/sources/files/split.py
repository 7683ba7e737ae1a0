"""A file source's split: what discovery plans (the source runner process, discovery thread),
the enumerator hands out (its mailbox) and a reader reads (a Spark task on an executor).

A value: frozen, made once by discovery's planning (:mod:`.discovery`), then only pickled and
read. It is pickled into the request log (an answer to ``NextSplit``, compared with the
logged one on a replay), into the enumerator's backlog chunks and the readers' state, encoded
by name (``core/encoding.py``); pickles of sparkcoord 0.1.0 named it by the module path
``sparkcoord.sources.files`` (:data:`PICKLED_MODULE`, the package's docstring), which still
resolves. Rule numbers are the package's
(:mod:`sparkcoord.sources.files`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sparkcoord.core.encoding import encoded
from sparkcoord.sources.splits import Split

#: where a pickle names the file source's checkpointed classes: the module they were defined in
#: before the file source became a package (the package exports them under that name)
PICKLED_MODULE = "sparkcoord.sources.files"

#: a file packed into a split (rule 8): its path, size and modification time as discovered
Member = tuple[str, int, float]


@encoded("files.FileSplit")
@dataclass(frozen=True)
class FileSplit(Split):
    """A parquet row group (``row_group``) or a byte range ``[start, end)`` of a text file.
    ``lane``: the file's directory, the key of watermark alignment
    (docs/decisions/043-watermark-alignment.md).

    A *packed* split (rule 8) reads several small text files whole, in order: ``files`` holds
    them (path, size, modification time, as discovered; two or more), ``size`` is their bytes,
    and ``path``, ``file_size`` and ``mtime`` are those of the first (``start`` and ``end`` are
    0). Every other split has ``files == ()`` and pickles as before packing existed."""

    path: str = ""
    file_size: int = 0
    mtime: float = 0.0
    row_group: int | None = None
    start: int = 0
    end: int = 0
    lane: str = ""
    files: tuple[Member, ...] = ()

    added_fields: ClassVar[tuple[str, ...]] = ("lane", "files")

    @property
    def unit(self) -> str:
        return self.path

    @property
    def units(self) -> tuple[str, ...]:
        """The paths of the files it reads: ``maxFilesPerTrigger`` counts a packed split as
        its number of files (enumerator, mailbox thread)."""
        return self.paths

    @property
    def paths(self) -> tuple[str, ...]:
        """The files this split reads (one, or a packed split's members): what a committer
        names in a manifest (docs/committer.md)."""
        return tuple(m[0] for m in self.files) if self.files else (self.path,)

    @property
    def alignment_key(self) -> str:
        return self.lane or self.split_id


FileSplit.__module__ = PICKLED_MODULE
