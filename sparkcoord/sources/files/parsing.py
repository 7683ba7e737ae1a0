"""CSV and JSON-lines text into Arrow tables, with Spark's reader modes for malformed records.

Sans-IO: bytes in, a ``pyarrow.Table`` out; no file system, no clock, no logging. The file
reader (:class:`sparkcoord.sources.files.reading.FileReader`, in a Spark task) hands it the
lines of one split and names the file, line and byte offset in what it raises or logs.

Rules:
  1. A record is one line (JSON lines: one object per line; CSV: one row per line, its values
     hold no line breaks). Blank lines are no records (pyarrow and Spark both skip them). With
     ``header`` the first line of the data is the header (the reader says so only for the
     split that starts at byte 0), never a record.
  2. Fast path: the whole range is parsed in one pyarrow call, as before modes existed. Only
     when that call fails (or, for JSON, a line starts with ``null``: rule 6) are the lines
     parsed again in *windows* that grow (doubling) while they parse and shrink (halving)
     around a failure, down to one line: that line is a malformed record, with pyarrow's
     message. The first window is the whole range in one block (a line longer than pyarrow's
     block size fails the fast path alone, and parses here). k malformed records among n
     lines cost O(k log n) more calls; a range whose every record is malformed costs about
     one call per record.
  3. Malformed: a line pyarrow cannot parse; a value that does not fit its column's type as
     pyarrow converts it (``"x"`` or ``1.5`` for a long, a number for a JSON string column);
     invalid UTF-8 in a string value; a JSON value that is not an object (``null``, an array,
     a number); a CSV row with fewer or more values than the schema has columns.
  4. Modes, under Spark's names (option ``mode``, any case): ``PERMISSIVE`` (the default) turns
     a malformed record into a row whose data columns are all null, with the record's text
     (its line without the line ending, invalid UTF-8 replaced by U+FFFD) in the corrupt-record
     column if the schema has one (option ``columnNameOfCorruptRecord``, default
     ``_corrupt_record``; a nullable string, left out of the schema pyarrow parses with, null
     on every good row); ``DROPMALFORMED`` drops it; ``FAILFAST`` stops at the first one, which
     the result names (the reader raises). ``PERMISSIVE`` with a data column that cannot be
     null stops at the first one too (a row of nulls cannot be made; the reader says why).
  5. Deterministic: the same bytes give the same rows in the same order and the same
     malformed records, so a reader's position (rows emitted in the split) means the same
     rows on a re-read, whatever was dropped.
  6. pyarrow crashes the process (SIGSEGV) on a JSON record ``null`` that starts a block
     (apache/arrow#47409; pyarrow 26 here): a line that starts with ``null`` never reaches
     pyarrow. It is malformed (Spark says the same of ``null``).
  7. Where: a malformed record's line (0-based) and byte offset are relative to the data
     given; the caller adds where the data starts in its file.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
DEFAULT_CORRUPT_COLUMN = "_corrupt_record"

#: a line that starts with ``null`` (rule 6): at the start of the data, or after a newline
_NULL_FIRST = re.compile(rb"[ \t\r\n]*null")
_NULL_AFTER_NEWLINE = re.compile(rb"\n[ \t\r]*null")
#: a fallback window parses in one block: at least this big (pyarrow allocates it)
_MIN_BLOCK = 1 << 14
#: pyarrow's messages name a row of the window, which means nothing to the user
_ROW_SUFFIX = re.compile(r" in row \d+$")
_ROW_PREFIX = re.compile(r"Row #\d+: ")
_CSV_COLUMN = re.compile(r"^In CSV column #(\d+): ")
_ARRAY_COLUMN = re.compile(r"^Column (\d+): In chunk \d+: Invalid: ")
_JSON_KIND = re.compile(r"Column\((/[^)]*)?\) changed from (\w+) to (\w+)")
#: how much of a reason a message keeps
_REASON_CHARS = 300


@dataclass(frozen=True)
class BadRecord:
    """A malformed record: where it is in the data given (rule 7), its text, and why."""

    #: 0-based index of its line in the data
    line: int
    #: offset of its first byte in the data
    offset: int
    #: the line without its line ending
    text: bytes
    #: pyarrow's message (rows of the window left out)
    reason: str

    def excerpt(self, chars: int = 120) -> str:
        """The record's text for a message: decoded (U+FFFD for invalid UTF-8), cut short."""
        text = self.text.decode("utf-8", errors="replace")
        return text if len(text) <= chars else text[:chars] + "..."


@dataclass
class Parsed:
    """What :meth:`RecordParser.parse` made of a range."""

    #: the rows, in order, with exactly the parser's schema; None when parsing stopped at a
    #: malformed record (``FAILFAST``, or rule 4's column that cannot be null)
    table: Any
    #: malformed records found (1 when parsing stopped at the first)
    malformed: int = 0
    #: the first of them
    first: BadRecord | None = None


def corrupt_column_problem(schema: Any, name: str) -> str | None:
    """Why ``schema`` (Arrow) cannot hold corrupt records in column ``name``, or None (it has
    no such column, or a nullable string one). Spark's rule; driver and task alike."""
    import pyarrow as pa

    index = schema.get_field_index(name)
    if index < 0:
        return None
    field = schema.field(index)
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        return (f"column {name!r} for corrupt records (option 'columnNameOfCorruptRecord') must "
                f"be a nullable string, as in Spark; the schema has it as {field.type}")
    if not field.nullable:
        return (f"column {name!r} for corrupt records (option 'columnNameOfCorruptRecord') must "
                f"be a nullable string, as in Spark; the schema has it NOT NULL")
    if len(schema) == 1:
        return (f"the schema holds only the corrupt-record column {name!r}: give the columns "
                f"of the records too")
    return None


class RecordParser:
    """Parses CSV or JSON-lines text into Arrow tables of ``schema`` with a reader mode.

    Made by the file reader (Spark task thread, once per reader); :meth:`parse` is called for
    each split's lines. ``schema`` is the Arrow schema of the rows (the source's, with the
    corrupt-record column if the user's schema has one); ``sep``: CSV's one-character
    delimiter. A bad corrupt-record column is a ``ValueError`` here (the driver checks the
    same when the source is built).
    """

    def __init__(self, fmt: str, schema: Any, *, mode: str = "PERMISSIVE",
                 corrupt_column: str = DEFAULT_CORRUPT_COLUMN, sep: str = ",") -> None:
        if fmt not in ("csv", "json"):
            raise ValueError(f"format {fmt!r}: records are parsed from csv or json")
        mode = mode.upper()
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        problem = corrupt_column_problem(schema, corrupt_column)
        if problem is not None:
            raise ValueError(problem)
        import pyarrow as pa

        self.format = fmt
        self.schema = schema
        self.mode = mode
        self.sep = sep
        index = schema.get_field_index(corrupt_column)
        #: the corrupt-record column, if the schema has one (rule 4)
        self.corrupt_column: str | None = corrupt_column if index >= 0 else None
        #: what pyarrow parses: the schema without the corrupt-record column
        self.parse_schema = schema.remove(index) if index >= 0 else schema
        #: the first data column that cannot be null (PERMISSIVE cannot fill it: rule 4)
        self.not_null: str | None = next(
            (f.name for f in self.parse_schema if not f.nullable), None)
        self._pa = pa

    @property
    def stops_at_first(self) -> bool:
        """Parsing stops at the first malformed record (rule 4)."""
        return self.mode == "FAILFAST" or (self.mode == "PERMISSIVE" and self.not_null is not None)

    # ------------------------------------------------------------------------- parsing
    def parse(self, data: bytes, *, header: bool = False) -> Parsed:
        """The rows of ``data`` (whole lines; rule 1), and its malformed records."""
        if not data or (data.isspace() and (self.format == "json" or _only_newlines(data))):
            return Parsed(self.schema.empty_table())  # no record (pyarrow: "Empty CSV file")
        if not (self.format == "json" and _has_null_line(data)):
            try:
                table = self._parse_range(data, header)
            except self._pa.ArrowInvalid:
                pass  # a malformed record somewhere, or a line over the block size: rule 2
            else:
                return Parsed(self._complete(table))
        return self._per_record(data, header)

    def _parse_range(self, data: bytes, header: bool) -> Any:
        """The fast path: one pyarrow call over the whole range, as the reader always did."""
        pa = self._pa
        if self.format == "json":
            import pyarrow.json as pj

            table = pj.read_json(pa.BufferReader(data), parse_options=self._json_options())
            table.validate(full=True)  # pyarrow's JSON reader passes invalid UTF-8 on
            return table
        import pyarrow.csv as pc

        return pc.read_csv(
            pa.BufferReader(data),
            read_options=pc.ReadOptions(column_names=self.parse_schema.names,
                                        skip_rows=1 if header else 0),
            parse_options=pc.ParseOptions(delimiter=self.sep),
            convert_options=pc.ConvertOptions(column_types=self.parse_schema))

    def _parse_window(self, data: bytes) -> Any:
        """Some whole lines (no header, no ``null`` line) in one block, on this thread."""
        pa = self._pa
        block = max(_MIN_BLOCK, len(data) + 1)
        if self.format == "json":
            import pyarrow.json as pj

            table = pj.read_json(pa.BufferReader(data),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=block),
                                 parse_options=self._json_options())
            table.validate(full=True)
            return table
        import pyarrow.csv as pc

        if data.isspace() and _only_newlines(data):
            return self.parse_schema.empty_table()  # pyarrow: "Empty CSV file"
        return pc.read_csv(
            pa.BufferReader(data),
            read_options=pc.ReadOptions(column_names=self.parse_schema.names,
                                        use_threads=False, block_size=block),
            parse_options=pc.ParseOptions(delimiter=self.sep),
            convert_options=pc.ConvertOptions(column_types=self.parse_schema))

    def _json_options(self) -> Any:
        import pyarrow.json as pj

        return pj.ParseOptions(explicit_schema=self.parse_schema,
                               unexpected_field_behavior="ignore")

    def _per_record(self, data: bytes, header: bool) -> Parsed:
        """Rule 2's windows over the lines of ``data``, in order."""
        starts = _line_starts(data)
        ends = starts[1:] + [len(data)]
        first_line = 1 if header else 0
        nulls = _null_lines(data, starts) if self.format == "json" else []
        # pieces in order: a table of good rows, or a run of malformed records
        pieces: list[Any] = []
        found = 0
        first: BadRecord | None = None

        def malformed(line: int, reason: str) -> bool:
            """Note one; True when parsing stops here."""
            nonlocal found, first
            text = data[starts[line]:ends[line]].rstrip(b"\n").rstrip(b"\r")
            bad = BadRecord(line, starts[line], text, self._reason(reason))
            found += 1
            if first is None:
                first = bad
            if self.stops_at_first:
                return True
            if self.mode == "PERMISSIVE":
                if pieces and isinstance(pieces[-1], list):
                    pieces[-1].append(bad)
                else:
                    pieces.append([bad])
            return False

        # segments between the lines that never reach pyarrow (rule 6)
        bounds = [first_line - 1] + [n for n in nulls if n >= first_line] + [len(starts)]
        for low, high in itertools.pairwise(bounds):
            if low >= first_line and malformed(low, "a JSON record must be an object, not null"):
                return Parsed(None, found, first)
            i, width = low + 1, high - low - 1
            while i < high:
                j = min(high, i + width)
                try:
                    table = self._parse_window(data[starts[i]:ends[j - 1]])
                except self._pa.ArrowInvalid as exc:
                    if j - i > 1:
                        width = (j - i) // 2
                        continue
                    if malformed(i, str(exc)):
                        return Parsed(None, found, first)
                    i, width = j, 1
                else:
                    if table.num_rows:
                        pieces.append(table)
                    i, width = j, width * 2
        return Parsed(self._assemble(pieces), found, first)

    # ------------------------------------------------------------------------- assembling
    def _complete(self, table: Any) -> Any:
        """Good rows with exactly the parser's schema (a null corrupt-record column)."""
        if self.corrupt_column is None and table.schema.equals(self.schema):
            return table
        pa = self._pa
        columns = [pa.nulls(table.num_rows, f.type) if f.name == self.corrupt_column
                   else table.column(f.name) for f in self.schema]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _nulls(self, bad: list[BadRecord]) -> Any:
        """Rule 4, PERMISSIVE: rows of nulls, with the records' text in the corrupt column."""
        pa = self._pa
        columns = [pa.array([b.text.decode("utf-8", errors="replace") for b in bad], f.type)
                   if f.name == self.corrupt_column else pa.nulls(len(bad), f.type)
                   for f in self.schema]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _assemble(self, pieces: list[Any]) -> Any:
        tables = [self._nulls(p) if isinstance(p, list) else self._complete(p) for p in pieces]
        if not tables:
            return self.schema.empty_table()
        return tables[0] if len(tables) == 1 else self._pa.concat_tables(tables)

    def _reason(self, message: str) -> str:
        """pyarrow's message without the window's row numbers, columns by name."""
        names = self.parse_schema.names

        def column(match: re.Match[str]) -> str:
            index = int(match[1])
            return f"column {names[index]!r}: " if index < len(names) else match[0]

        text = _ROW_SUFFIX.sub("", message.strip())
        text = _ROW_PREFIX.sub("", text)
        text = _CSV_COLUMN.sub(column, text)
        text = _ARRAY_COLUMN.sub(column, text)
        text = _JSON_KIND.sub(_kinds, text)
        return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."


def _kinds(match: re.Match[str]) -> str:
    """pyarrow's "Column(/a/b) changed from number to string": what the schema expects there
    and what the record has."""
    path = (match[1] or "").strip("/").replace("/", ".")
    where = f"column {path!r}" if path else "the record"

    def a(kind: str) -> str:
        return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"

    return f"{where}: expected {a(match[2])}, got {a(match[3])}"


def _only_newlines(data: bytes) -> bool:
    """``data`` is blank lines only (call it on whitespace: it copies)."""
    return not data.strip(b"\r\n")


def _has_null_line(data: bytes) -> bool:
    """A line of ``data`` starts with ``null`` (rule 6): two scans, no copy."""
    return bool(_NULL_FIRST.match(data)) or _NULL_AFTER_NEWLINE.search(data) is not None


def _line_starts(data: bytes) -> list[int]:
    """Offsets of the first byte of each line of ``data`` (none after a final newline)."""
    starts = [0]
    at = data.find(b"\n")
    while at != -1:
        starts.append(at + 1)
        at = data.find(b"\n", at + 1)
    if len(starts) > 1 and starts[-1] == len(data):
        starts.pop()
    return starts


def _null_lines(data: bytes, starts: list[int]) -> list[int]:
    """Indexes of the lines that start with ``null`` (rule 6), in order."""
    import bisect

    found = []
    match = _NULL_FIRST.match(data)
    if match is not None:
        # blank lines before it are no records: the null is on the line of its first byte
        found.append(bisect.bisect_right(starts, match.end() - 4) - 1)
    for match in _NULL_AFTER_NEWLINE.finditer(data):
        found.append(bisect.bisect_right(starts, match.start() + 1) - 1)
    return sorted(set(found))
