"""The stream read of one batch (reader.py rule 2): the transactions after the reader's
position up to the batch's bound, read from the slot without consuming them.

Rules:
  1. What is read is a function of the position, the bound ``U`` and the WAL: the
     transactions ending after the position and at or before ``U``, in commit order, whole
     ones while they keep the read within ``max_changes_per_batch`` changes (a transaction
     counts its changes and its BEGIN and COMMIT), at least one. The read first waits until
     the WAL is flushed to ``U`` (waits.py rule 2).
  2. A peek counts the messages from the slot's confirmed position, which trails the reader by
     a batch or two, so it asks for three times the limit, and four times as many again while
     the server cut it short before the reader's limit or ``U``. A peek that finds the slot
     held by another session is made again (waits.py rule 1), for up to ``flush_wait_s``.
  3. The read stops before a transaction with a change of a table that changed shape
     (decoding.py rule 2): it keeps every transaction before it and the position at the end of
     the last of them, with the reason (reader.py rule 4). Otherwise, when it read every
     transaction up to ``U``, its position moves to ``U``.
  4. While the stream still holds the snapshot's map (watermarks.py rule 5), the changes go
     through its filter, text keys placed by the server (key_order.py).

Thread model: the reader's (the Spark task's thread), on its autocommit connection. psycopg is
not imported here at the top (``io/replication.py`` is, inside the read).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkcoord.sources.postgres.core.decoding import RowDecoder, decode_transaction
from sparkcoord.sources.postgres.core.pgoutput import Transaction
from sparkcoord.sources.postgres.core.watermarks import OutRow, StreamPosition, stream_rows
from sparkcoord.sources.postgres.errors import SchemaChanged
from sparkcoord.sources.postgres.io.key_order import KeyOrder
from sparkcoord.sources.postgres.io.waits import wait_for_flush, while_slot_busy

if TYPE_CHECKING:
    from sparkcoord.sources.postgres.io.reader_config import ReaderConfig


@dataclass
class StreamRead:
    """What one stream read gives: its rows, the position it read to, whether it stopped
    short of the bound (``more``: the reader asks for another batch) and how many
    transactions it emitted."""

    rows: list[OutRow]
    position: StreamPosition
    more: bool
    transactions: int


def read_stream(conn: Any, config: ReaderConfig, position: StreamPosition, upto: int,
                order: KeyOrder | None = None) -> StreamRead:
    """The transactions ending after ``position`` and at or before ``upto``, in commit order,
    whole ones while they keep the read within ``max_changes_per_batch`` changes (at least
    one): a function of the position, ``upto`` and the WAL (rules 1 to 4). Called by the
    reader that holds the stream split, in the Spark task's thread, once per batch."""
    from sparkcoord.sources.postgres.io import replication

    if upto <= position.after:
        return StreamRead([], position, False, 0)
    wait_for_flush(conn, upto, config.flush_wait_s)
    limit = config.max_changes_per_batch
    after = position.after
    messages = 3 * limit

    def peek_up_to(messages: int) -> Any:
        return while_slot_busy(
            lambda: replication.peek(conn, config.slot, config.publication,
                                     upto_nchanges=messages, upto_lsn=upto, after_lsn=after),
            config.flush_wait_s, "reading the stream")

    while True:
        peek = peek_up_to(messages)
        taken: list[Transaction] = []
        size, full, past = 0, False, False
        for tx in peek.transactions:
            if tx.end_lsn > upto:
                past = True
                break
            if taken and size + len(tx.changes) + 2 > limit:
                full = True
                break
            taken.append(tx)
            size += len(tx.changes) + 2
        if full or past or not peek.cut_short:
            break
        messages *= 4  # cut short before the reader's limit or the bound: ask for more
    decoders = {s.table: RowDecoder(s) for s in config.shapes}
    order = order or KeyOrder(conn, config.shapes)
    rows: list[OutRow] = []
    emitted = 0
    for tx in taken:
        try:
            changes = decode_transaction(tx, decoders)
        except SchemaChanged as e:  # rule 3: stop before it, at the last transaction's end
            return StreamRead(rows, dataclasses.replace(position, stopped=str(e)), True,
                              emitted)
        flt = position.filter
        rows.extend(stream_rows(changes, flt, order.locate(flt) if flt is not None else None))
        position = position.moved_to(tx.end_lsn)
        emitted += 1
    if not full:
        position = position.moved_to(upto)
    return StreamRead(rows, position, full, emitted)
