"""A text file's lines by byte range (rule 1 of :mod:`sparkcoord.sources.files`): the lines
whose first byte lies in a split's range, and how many lines come before an offset (a
malformed record's line number).

Each function reads the open file it is given and nothing else: the file reader
(:class:`~sparkcoord.sources.files.reading.FileReader`) calls them in a Spark task, on the
task's thread, and the user's driver program's schema inference (:mod:`.schema`) calls
:func:`read_line_range` on the first lines of a file. A rule number alone is the file
source's (``sources/files/__init__.py``).

Thread model: none of its own (the caller's thread, one open file each call).
"""

from __future__ import annotations

from typing import Any


def line_range(f: Any, start: int, end: int, file_size: int,
               chunk: int = 1 << 20) -> tuple[int, bytes]:
    """The lines whose first byte lies in ``[start, end)`` of open file ``f`` (rule 1), and
    the offset in the file of the first of them."""
    if start >= end:
        return start, b""
    first = 0
    if start == 0:
        f.seek(0)
        data = f.read(end)
    else:
        f.seek(start - 1)
        data = f.read(end - start + 1)
        cut = data.find(b"\n")
        if cut == -1 or start + cut >= end:
            return start, b""  # no line starts in the range
        data = data[cut + 1:]
        first = start + cut
    if end < file_size and not data.endswith(b"\n"):
        parts = [data]
        f.seek(end)
        while True:
            more = f.read(chunk)
            if not more:
                break
            cut = more.find(b"\n")
            if cut != -1:
                parts.append(more[:cut + 1])
                break
            parts.append(more)
        data = b"".join(parts)
    return first, bytes(data)


def read_line_range(f: Any, start: int, end: int, file_size: int, chunk: int = 1 << 20) -> bytes:
    """The lines whose first byte lies in ``[start, end)`` of open file ``f`` (rule 1)."""
    return line_range(f, start, end, file_size, chunk)[1]


def lines_before(f: Any, offset: int, chunk: int = 1 << 20) -> int:
    """How many lines of open file ``f`` end before byte ``offset``: a line number is this
    plus the line's index in its split. Reads the file up to ``offset``, so only a reader that
    has a malformed record to name calls it."""
    f.seek(0)
    count, left = 0, offset
    while left > 0:
        block = f.read(min(chunk, left))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count
