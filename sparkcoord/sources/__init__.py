"""Coordinated sources: a split enumerator / reader framework and a file source.

Beside :mod:`sparkcoord.spark` (it builds on it; nothing there imports this package). A source
is one coordinated operator: its coordinator is a :class:`SplitEnumerator` that discovers
splits and hands them out on request; its subtasks are :class:`SplitReader` objects that pull
splits inside the running batch and emit ``pyarrow.RecordBatch`` objects. :class:`FileStream`
builds a file source (parquet, CSV, JSON lines) on any fsspec URL. docs/sources.md; watermark
alignment (opt-in: :class:`AlignmentOptions`), docs/alignment.md.
"""

from __future__ import annotations

from sparkcoord.sources.alignment import AlignmentDecision, AlignmentOptions, WatermarkReport
from sparkcoord.sources.enumerator import EnumeratorState, SplitDiscovery, SplitEnumerator
from sparkcoord.sources.files.reading import FileChangedError, FileReadError
from sparkcoord.sources.files.split import FileSplit
from sparkcoord.sources.files.stream import FileStream
from sparkcoord.sources.reader import ReaderState, SplitReader
from sparkcoord.sources.splits import NextSplit, NoSplitNow, ReadLimit, Split

__all__ = ["AlignmentDecision", "AlignmentOptions", "EnumeratorState", "FileChangedError",
           "FileReadError", "FileSplit", "FileStream", "NextSplit", "NoSplitNow", "ReadLimit", "ReaderState",
           "Split", "SplitDiscovery", "SplitEnumerator", "SplitReader", "WatermarkReport"]
