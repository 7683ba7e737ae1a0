"""A decoder of the binary messages of PostgreSQL's ``pgoutput`` logical decoding plugin,
protocol version 1, as ``pg_logical_slot_peek_binary_changes`` returns them (one message per
row).

The format is the PostgreSQL documentation's "Logical Replication Message Formats" (section
55.9 of the PostgreSQL 15 manual, chapter "Frontend/Backend Protocol"). Rules:
  1. Integers are big-endian: Int8, Int16, Int32, Int64 (LSNs and times are Int64, relation
     and type ids and transaction ids Int32, all unsigned here). A String is UTF-8 bytes ended
     by a zero byte.
  2. A message is one Byte1 type then its fields; this decoder reads:
       Begin    'B' Int64 final LSN (the commit record's), Int64 commit time, Int32 xid.
       Commit   'C' Int8 flags (0), Int64 commit LSN, Int64 end LSN of the transaction,
                    Int64 commit time.
       Origin   'O' Int64 commit LSN on the origin, String origin name.
       Relation 'R' Int32 relation id, String namespace (empty for pg_catalog), String
                    name, Int8 replica identity ('d' default, 'n' nothing, 'f' full,
                    'i' index), Int16 column count, then per column Int8 flags (1: part of
                    the key), String name, Int32 type oid, Int32 type modifier.
       Type     'Y' Int32 type oid, String namespace, String name.
       Insert   'I' Int32 relation id, Byte1 'N', TupleData (the new row).
       Update   'U' Int32 relation id, optionally Byte1 'K' (the old key) or 'O' (the old row,
                    under REPLICA IDENTITY FULL) and a TupleData, then Byte1 'N', TupleData.
       Delete   'D' Int32 relation id, Byte1 'K' or 'O', TupleData.
       Truncate 'T' Int32 relation count, Int8 options (1: CASCADE, 2: RESTART IDENTITY),
                    then that many Int32 relation ids.
       Message  'M' Int8 flags, Int64 LSN, String prefix, Int32 length, Byten content
                    (``pg_logical_emit_message``; only sent with the ``messages`` option).
     Protocol version 1 has no streamed-transaction messages (no xid field inside a change)
     and no binary column values.
  3. TupleData: Int16 column count, then per column Byte1 'n' (null), 'u' (an unchanged
     TOASTed value, not sent: the row's old value stands) or 't' followed by Int32 length
     and that many bytes of the value's text form. 'b' (binary) is version 2's and an error
     here.
  4. A message is consumed exactly: bytes left over after its last field are an error, as is
     a message that ends early. Every error names the message type and the byte offset.
  5. A change names its relation by id; the Relation message describing it comes first in
     the same decoding session (pgoutput sends it before a relation's first change and again
     after the relation changed), so the :class:`Decoder` keeps a cache of relations and a
     change of an unknown relation, or with a column count unlike its relation's, is an
     error.

Times are microseconds since 2000-01-01 00:00:00 UTC (PostgreSQL's epoch); LSNs are 64-bit
positions in the WAL, written ``X/Y`` (the high and low 32 bits in upper-case hex) by the
server.

Thread model: none. :func:`parse_message` is a pure function; a :class:`Decoder` belongs to
the one thread that reads a slot's changes (its relation cache is that session's).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sparkcoord.sources.postgres.errors import PgOutputError

#: PostgreSQL's epoch (2000-01-01 UTC) in microseconds after the Unix epoch
POSTGRES_EPOCH_UNIX_US = 946_684_800_000_000
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)

_NAMES = {"B": "Begin", "C": "Commit", "O": "Origin", "R": "Relation", "Y": "Type",
          "I": "Insert", "U": "Update", "D": "Delete", "T": "Truncate", "M": "Message"}


# -- LSNs and times -------------------------------------------------------------------------


def lsn_to_text(lsn: int) -> str:
    """``X/Y`` as the server writes an LSN (``pg_lsn``'s text form). Any thread."""
    if not 0 <= lsn < 1 << 64:
        raise ValueError(f"an LSN is a 64-bit unsigned integer, got {lsn}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_from_text(text: str) -> int:
    """The LSN written ``X/Y`` (``pg_lsn``'s text form). Any thread."""
    high, slash, low = text.strip().partition("/")
    try:
        if not slash:
            raise ValueError
        value = int(high, 16) << 32 | int(low, 16)
        if int(high, 16) >> 32 or int(low, 16) >> 32:
            raise ValueError
    except ValueError:
        raise ValueError(f"an LSN is written X/Y in hex (like 16/B374D848), got {text!r}") from None
    return value


def pg_time_to_datetime(micros: int) -> datetime:
    """A pgoutput time (microseconds since 2000-01-01 UTC) as an aware UTC datetime. Any
    thread."""
    return _POSTGRES_EPOCH + timedelta(microseconds=micros)


def pg_time_to_unix_micros(micros: int) -> int:
    """A pgoutput time as microseconds since the Unix epoch (Arrow's and Spark's timestamps).
    Any thread."""
    return micros + POSTGRES_EPOCH_UNIX_US


# -- what comes out -------------------------------------------------------------------------


class Toast(enum.Enum):
    """A column value pgoutput did not send (rule 3, 'u'): an unchanged TOASTed value."""

    UNCHANGED = "u"

    def __repr__(self) -> str:
        return "Toast.UNCHANGED"


#: one column's value in a TupleData: None (SQL NULL), Toast.UNCHANGED or the text form
Value = str | None | Toast
Row = tuple[Value, ...]


class ReplicaIdentity(enum.Enum):
    """What a relation's Update and Delete carry of the old row (``ALTER TABLE ... REPLICA
    IDENTITY``)."""

    DEFAULT = "d"  # the primary key's columns ('K'), when a key column changed or on delete
    NOTHING = "n"  # nothing
    FULL = "f"  # the whole old row ('O')
    INDEX = "i"  # the columns of the named unique index ('K')


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """'R': a table's shape as pgoutput sends it."""

    relation_id: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]

    @property
    def qualified_name(self) -> str:
        """``namespace.name`` (``pg_catalog`` for an empty namespace, rule 2)."""
        return f"{self.namespace or 'pg_catalog'}.{self.name}"

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """'Y': a type outside pg_catalog (an enum, a domain, an extension's type)."""

    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: Row


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is the old key ('K') or the old row ('O', REPLICA IDENTITY FULL) when sent;
    ``old_kind`` says which ('K', 'O' or '' when not sent)."""

    relation_id: int
    old_kind: str
    old: Row | None
    new: Row


@dataclass(frozen=True, slots=True)
class Delete:
    relation_id: int
    old_kind: str  # 'K' or 'O'
    old: Row


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = (Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | Truncate
           | LogicalMessage)
Change = Insert | Update | Delete | Truncate


# -- parsing --------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos", "kind")

    def __init__(self, data: bytes, kind: str) -> None:
        self.data = data
        self.pos = 1
        self.kind = kind

    def fail(self, problem: str, at: int | None = None) -> PgOutputError:
        return PgOutputError(self.kind, self.pos if at is None else at, problem)

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise self.fail(f"ends inside {what} (needs {n} bytes, "
                            f"{len(self.data) - self.pos} left)")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def int(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "big")

    def byte(self, what: str) -> str:
        return chr(self.take(1, what)[0])

    def string(self, what: str) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise self.fail(f"{what}: a string with no terminating zero byte")
        start = self.pos
        raw = self.data[start:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: not UTF-8 ({e.reason})", start + e.start) from None

    def tuple_data(self, what: str) -> Row:
        count = self.int(2, f"{what}'s column count")
        values: list[Value] = []
        for i in range(count):
            at = self.pos
            kind = self.byte(f"{what}'s column {i} kind")
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(Toast.UNCHANGED)
            elif kind == "t":
                length = self.int(4, f"{what}'s column {i} length")
                start = self.pos
                raw = self.take(length, f"{what}'s column {i} value")
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise self.fail(f"{what}'s column {i}: not UTF-8 ({e.reason})",
                                    start + e.start) from None
            elif kind == "b":
                raise self.fail(f"{what}'s column {i} is in binary form ('b'), which protocol "
                                "version 1 does not send (the 'binary' option is off)", at)
            else:
                raise self.fail(f"{what}'s column {i}: unknown kind {kind!r} "
                                "(expected 'n', 'u' or 't')", at)
        return tuple(values)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes left over after the message")


class _Irregular(Exception):
    """The fast path met something it does not read: the checked parser says what."""


def _fast_tuple(data: bytes, pos: int) -> tuple[Row, int]:
    """A TupleData at ``pos`` of a well-formed message, and the offset after it; raises
    (:class:`_Irregular`, IndexError, UnicodeDecodeError) on anything else."""
    count = (data[pos] << 8) | data[pos + 1]
    pos += 2
    values: list[Value] = []
    append = values.append
    for _ in range(count):
        kind = data[pos]
        pos += 1
        if kind == 116:  # 't'
            end = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
            if end > len(data):
                raise _Irregular
            append(data[pos + 4:end].decode("utf-8"))
            pos = end
        elif kind == 110:  # 'n'
            append(None)
        elif kind == 117:  # 'u'
            append(Toast.UNCHANGED)
        else:
            raise _Irregular
    return tuple(values), pos


def _fast_change(data: bytes) -> Message:
    """Insert, Update and Delete (nearly every message of a busy stream) without the checked
    parser's per-field bookkeeping; whatever does not parse cleanly raises, and
    :func:`parse_message` then reads the message the checked way for its error."""
    code = data[0]
    relation_id = int.from_bytes(data[1:5], "big")
    marker = data[5]
    if code == 73:  # 'I'
        if marker != 78:  # 'N'
            raise _Irregular
        new, pos = _fast_tuple(data, 6)
        message: Message = Insert(relation_id, new)
    elif code == 85:  # 'U'
        old_kind, old, pos = "", None, 5
        if marker in (75, 79):  # 'K', 'O'
            old_kind = chr(marker)
            old, pos = _fast_tuple(data, 6)
            marker = data[pos]
        if marker != 78:
            raise _Irregular
        new, pos = _fast_tuple(data, pos + 1)
        message = Update(relation_id, old_kind, old, new)
    else:  # 'D'
        if marker not in (75, 79):
            raise _Irregular
        old, pos = _fast_tuple(data, 6)
        message = Delete(relation_id, chr(marker), old)
    if pos != len(data):
        raise _Irregular
    return message


def parse_message(data: bytes) -> Message:
    """One pgoutput message (rules 2 to 4); a :class:`PgOutputError` naming the message type
    and byte offset when it does not follow the format. Any thread (pure)."""
    if data and data[0] in (73, 85, 68):  # 'I', 'U', 'D': the fast path, else checked
        try:
            return _fast_change(bytes(data))
        except (_Irregular, IndexError, UnicodeDecodeError):
            pass
    if not data:
        raise PgOutputError("(empty)", 0, "an empty message")
    code = chr(data[0])
    kind = _NAMES.get(code)
    if kind is None:
        raise PgOutputError(f"unknown ({code!r})", 0, f"unknown message type {code!r}")
    r = _Reader(bytes(data), kind)
    message: Message
    if code == "B":
        message = Begin(r.int(8, "final LSN"), _signed64(r.int(8, "commit time")),
                        r.int(4, "xid"))
    elif code == "C":
        message = Commit(r.int(1, "flags"), r.int(8, "commit LSN"), r.int(8, "end LSN"),
                         _signed64(r.int(8, "commit time")))
    elif code == "O":
        message = Origin(r.int(8, "origin LSN"), r.string("origin name"))
    elif code == "R":
        relation_id = r.int(4, "relation id")
        namespace = r.string("namespace")
        name = r.string("relation name")
        at = r.pos
        identity_code = r.byte("replica identity")
        try:
            identity = ReplicaIdentity(identity_code)
        except ValueError:
            raise r.fail(f"unknown replica identity {identity_code!r}", at) from None
        columns = []
        for i in range(r.int(2, "column count")):
            flags = r.int(1, f"column {i} flags")
            column_name = r.string(f"column {i} name")
            type_oid = r.int(4, f"column {i} type oid")
            modifier = _signed32(r.int(4, f"column {i} type modifier"))
            columns.append(Column(column_name, type_oid, modifier, bool(flags & 1)))
        message = Relation(relation_id, namespace, name, identity, tuple(columns))
    elif code == "Y":
        message = TypeInfo(r.int(4, "type oid"), r.string("namespace"), r.string("type name"))
    elif code == "I":
        relation_id = r.int(4, "relation id")
        at = r.pos
        marker = r.byte("new tuple marker")
        if marker != "N":
            raise r.fail(f"expected 'N' before the new tuple, got {marker!r}", at)
        message = Insert(relation_id, r.tuple_data("new tuple"))
    elif code == "U":
        relation_id = r.int(4, "relation id")
        at = r.pos
        marker = r.byte("tuple marker")
        old_kind, old = "", None
        if marker in ("K", "O"):
            old_kind, old = marker, r.tuple_data("old key" if marker == "K" else "old tuple")
            at = r.pos
            marker = r.byte("new tuple marker")
        if marker != "N":
            raise r.fail(f"expected 'K', 'O' or 'N' before a tuple, got {marker!r}", at)
        message = Update(relation_id, old_kind, old, r.tuple_data("new tuple"))
    elif code == "D":
        relation_id = r.int(4, "relation id")
        at = r.pos
        marker = r.byte("old tuple marker")
        if marker not in ("K", "O"):
            raise r.fail(f"expected 'K' or 'O' before the old tuple, got {marker!r}", at)
        message = Delete(relation_id, marker,
                         r.tuple_data("old key" if marker == "K" else "old tuple"))
    elif code == "T":
        count = r.int(4, "relation count")
        options = r.int(1, "options")
        ids = tuple(r.int(4, f"relation id {i}") for i in range(count))
        message = Truncate(ids, bool(options & 1), bool(options & 2))
    else:  # "M"
        flags = r.int(1, "flags")
        lsn = r.int(8, "LSN")
        prefix = r.string("prefix")
        length = r.int(4, "content length")
        message = LogicalMessage(bool(flags & 1), lsn, prefix, r.take(length, "content"))
    r.done()
    return message


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _signed32(value: int) -> int:
    return value - (1 << 32) if value >> 31 else value


# -- a decoding session ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transaction:
    """One committed transaction's changes to published tables, in order; ``relations[i]`` is
    the relation change ``i`` refers to as described when it was made (several for a
    Truncate), so a change made before an ALTER TABLE in the same transaction keeps its
    shape."""

    xid: int
    final_lsn: int  # the commit record's LSN (Begin)
    commit_lsn: int  # the same, as Commit sends it
    end_lsn: int  # the end of the commit record: confirming it skips this transaction
    commit_time: int  # microseconds since 2000-01-01 UTC
    changes: tuple[Change, ...]
    relations: tuple[tuple[Relation, ...], ...] = field(default=(), compare=False)
    origin: str | None = None

    @property
    def commit_datetime(self) -> datetime:
        return pg_time_to_datetime(self.commit_time)

    def relation(self, index: int) -> Relation:
        """The relation of change ``index`` (an Insert, Update or Delete)."""
        return self.relations[index][0]


class Decoder:
    """A decoding session: the relation cache (rule 5) and the transaction being assembled.

    Thread model: the thread that reads the slot's changes, one decoder per peek (each peek
    is a new decoding session on the server, which sends every Relation again)."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, TypeInfo] = {}
        self._begin: Begin | None = None
        self._origin: str | None = None
        self._changes: list[Change] = []
        self._shapes: list[tuple[Relation, ...]] = []
        #: the end LSN of the last transaction committed in the messages read, skipped or not
        self.last_end_lsn = 0

    def decode(self, data: bytes) -> Message:
        """One message, checked against the cache and the transaction state (rule 5); the
        cache learns each Relation and Type. Called by the reader's thread for each row a
        peek returned, in order."""
        message = parse_message(data)
        if isinstance(message, Relation):
            self.relations[message.relation_id] = message
        elif isinstance(message, TypeInfo):
            self.types[message.type_oid] = message
        elif isinstance(message, Insert | Update | Delete):
            relation = self._relation(message.relation_id, message)
            width = len(relation.columns)
            for row, what in ((getattr(message, "new", None), "new tuple"),
                              (getattr(message, "old", None), "old tuple")):
                if row is not None and len(row) != width:
                    raise PgOutputError(type(message).__name__, 0,
                                        f"the {what} of {relation.qualified_name} has "
                                        f"{len(row)} columns, its Relation message {width}")
        elif isinstance(message, Truncate):
            for relation_id in message.relation_ids:
                self._relation(relation_id, message)
        return message

    def _relation(self, relation_id: int, message: Message) -> Relation:
        relation = self.relations.get(relation_id)
        if relation is None:
            raise PgOutputError(type(message).__name__, 1,
                                f"relation id {relation_id} was not described by a Relation "
                                "message before its first change")
        return relation

    def transactions(self, messages: Iterable[bytes], after_lsn: int = 0
                     ) -> Iterator[Transaction]:
        """The committed transactions in ``messages`` (each a pgoutput message's bytes), in
        commit order, each yielded when its Commit is read; those ending at or before
        ``after_lsn`` (a record boundary: a transaction whose commit record starts before it
        ends at or before it) are skipped without reading their changes, though their
        Relation and Type messages still describe what follows. A change outside
        Begin...Commit, or a Begin inside a transaction, is an error. Called by the reader's
        thread."""
        skipping = False
        for data in messages:
            if skipping and data[:1] in (b"I", b"U", b"D", b"T"):
                continue
            message = self.decode(data)
            if isinstance(message, Begin):
                if self._begin is not None:
                    raise PgOutputError("Begin", 0, f"transaction {message.xid} begins inside "
                                                    f"transaction {self._begin.xid}")
                self._begin, self._origin, self._changes, self._shapes = message, None, [], []
                skipping = message.final_lsn < after_lsn
            elif isinstance(message, Commit):
                begin = self._begin
                if begin is None:
                    raise PgOutputError("Commit", 0, "a Commit outside a transaction")
                self._begin = None
                self.last_end_lsn = message.end_lsn
                if skipping:
                    skipping = False
                    continue
                yield Transaction(begin.xid, begin.final_lsn, message.commit_lsn,
                                  message.end_lsn, message.commit_time, tuple(self._changes),
                                  tuple(self._shapes), self._origin)
            elif isinstance(message, Insert | Update | Delete | Truncate):
                if self._begin is None:
                    raise PgOutputError(type(message).__name__, 0,
                                        "a change outside a transaction")
                self._changes.append(message)
                ids = (message.relation_ids if isinstance(message, Truncate)
                       else (message.relation_id,))
                self._shapes.append(tuple(self.relations[i] for i in ids))
            elif isinstance(message, Origin):
                self._origin = message.name

    @property
    def in_transaction(self) -> bool:
        """Whether a Begin was read and its Commit not yet (a peek returns whole transactions,
        so after a peek's last row this is False)."""
        return self._begin is not None


def column_values(relation: Relation, row: Row) -> dict[str, Value]:
    """``row`` by column name. Any thread."""
    return {column.name: value for column, value in zip(relation.columns, row, strict=True)}


def describe(transaction: Transaction) -> str:
    """A one-line summary for logs (no values). Any thread."""
    return (f"transaction {transaction.xid} committed at {lsn_to_text(transaction.commit_lsn)} "
            f"({transaction.commit_datetime.isoformat()}), {len(transaction.changes)} changes")

