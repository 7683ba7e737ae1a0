"""The pgoutput decoder (sparkcoord/sources/postgres/core/pgoutput.py) against the bytes a real
PostgreSQL 15 sends: every change kind, old tuples under each replica identity, NULLs and
unchanged TOAST values, several tables and transactions with their commit LSN, time and xid;
and malformed messages, whose errors name the message type and the byte offset."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import (
    POSTGRES_EPOCH_UNIX_US,
    Begin,
    Commit,
    Decoder,
    Delete,
    Insert,
    Relation,
    ReplicaIdentity,
    Toast,
    Transaction,
    Truncate,
    TypeInfo,
    Update,
    column_values,
    lsn_from_text,
    lsn_to_text,
    parse_message,
    pg_time_to_datetime,
    pg_time_to_unix_micros,
)
from sparkcoord.sources.postgres.errors import PgOutputError
from sparkcoord.sources.postgres.io import replication

_names = itertools.count()


def capture(conn: Any, tables: dict[str, str]) -> tuple[str, str]:
    """Create ``tables`` (name -> column list), a publication of them and a slot; returns
    (slot, publication)."""
    n = next(_names)
    for name, columns in tables.items():
        conn.execute(f"CREATE TABLE {name} ({columns})")
    slot, publication = f"dec_slot_{n}", f"dec_pub_{n}"
    replication.ensure_publication(conn, publication, [TableName.parse(t) for t in tables])
    replication.ensure_slot(conn, slot)
    return slot, publication


def changes(conn: Any, slot: str, publication: str) -> list[Transaction]:
    return list(replication.peek(conn, slot, publication).transactions)


def values(transaction: Transaction, index: int, which: str = "new") -> dict[str, Any]:
    change = transaction.changes[index]
    row = getattr(change, which)
    return column_values(transaction.relation(index), row)


def test_inserts_updates_and_deletes_come_out_as_typed_changes_of_their_relation(
        admin: Any) -> None:
    slot, pub = capture(admin, {"dec_basic": "id int PRIMARY KEY, name text, n int8"})
    admin.execute("INSERT INTO dec_basic VALUES (1, 'one', 10), (2, 'two', 20)")
    admin.execute("UPDATE dec_basic SET name = 'uno' WHERE id = 1")
    admin.execute("DELETE FROM dec_basic WHERE id = 2")
    t1, t2, t3 = changes(admin, slot, pub)
    assert [type(c) for c in t1.changes] == [Insert, Insert]
    assert values(t1, 0) == {"id": "1", "name": "one", "n": "10"}
    assert values(t1, 1) == {"id": "2", "name": "two", "n": "20"}
    (update,) = t2.changes
    assert isinstance(update, Update)
    assert update.old_kind == "" and update.old is None  # the key did not change
    assert values(t2, 0) == {"id": "1", "name": "uno", "n": "10"}
    (delete,) = t3.changes
    assert isinstance(delete, Delete) and delete.old_kind == "K"
    assert delete.old == ("2", None, None)  # the key only, the rest NULL
    relation = t1.relation(0)
    assert relation.qualified_name == "public.dec_basic"
    assert relation.replica_identity is ReplicaIdentity.DEFAULT
    assert [(c.name, c.type_oid, c.key) for c in relation.columns] == [
        ("id", 23, True), ("name", 25, False), ("n", 20, False)]


def test_commit_lsn_time_and_xid_are_the_servers(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_commit": "id int PRIMARY KEY"})
    before_lsn = replication.current_wal_lsn(admin)
    before = admin.execute("SELECT clock_timestamp()").fetchone()[0]
    with admin.transaction():
        xid = int(admin.execute("SELECT txid_current()").fetchone()[0])
        admin.execute("INSERT INTO dec_commit VALUES (1)")
    after = admin.execute("SELECT clock_timestamp()").fetchone()[0]
    after_lsn = replication.current_wal_lsn(admin)
    (t,) = changes(admin, slot, pub)
    assert t.xid == xid
    assert before_lsn < t.final_lsn == t.commit_lsn < t.end_lsn <= after_lsn
    assert before <= t.commit_datetime <= after
    assert t.commit_datetime.tzinfo is not None
    assert pg_time_to_unix_micros(t.commit_time) == int(t.commit_datetime.timestamp() * 1e6)


def test_replica_identity_full_sends_the_whole_old_row_on_update_and_delete(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_full": "id int PRIMARY KEY, name text, qty int"})
    admin.execute("ALTER TABLE dec_full REPLICA IDENTITY FULL")
    admin.execute("INSERT INTO dec_full VALUES (1, 'a', 5)")
    admin.execute("UPDATE dec_full SET qty = 6 WHERE id = 1")
    admin.execute("DELETE FROM dec_full WHERE id = 1")
    _, t_update, t_delete = changes(admin, slot, pub)
    update, delete = t_update.changes[0], t_delete.changes[0]
    assert isinstance(update, Update) and isinstance(delete, Delete)
    assert update.old_kind == "O" and update.old == ("1", "a", "5")
    assert update.new == ("1", "a", "6")
    assert delete.old_kind == "O" and delete.old == ("1", "a", "6")
    assert t_update.relation(0).replica_identity is ReplicaIdentity.FULL


def test_default_replica_identity_sends_the_old_key_when_the_key_changes(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_rekey": "id int PRIMARY KEY, name text"})
    admin.execute("INSERT INTO dec_rekey VALUES (1, 'a')")
    admin.execute("UPDATE dec_rekey SET id = 2 WHERE id = 1")
    _, t = changes(admin, slot, pub)
    (update,) = t.changes
    assert isinstance(update, Update)
    assert update.old_kind == "K" and update.old == ("1", None)
    assert update.new == ("2", "a")


def test_nulls_and_unchanged_toast_values_are_told_apart(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_toast": "id int PRIMARY KEY, note text, big text"})
    # EXTERNAL: stored out of line, uncompressed, so 10 kB is really TOASTed
    admin.execute("ALTER TABLE dec_toast ALTER big SET STORAGE EXTERNAL")
    big = "".join(f"{i:05d}" for i in range(2000))
    admin.execute("INSERT INTO dec_toast VALUES (1, NULL, %s)", (big,))
    admin.execute("UPDATE dec_toast SET note = 'set' WHERE id = 1")
    admin.execute("UPDATE dec_toast SET note = NULL, big = 'small' WHERE id = 1")
    t_insert, t_update, t_second = changes(admin, slot, pub)
    assert t_insert.changes[0].new == ("1", None, big)  # type: ignore[union-attr]
    assert t_update.changes[0].new == ("1", "set", Toast.UNCHANGED)  # type: ignore[union-attr]
    assert t_second.changes[0].new == ("1", None, "small")  # type: ignore[union-attr]


def test_truncate_names_every_truncated_relation_and_its_options(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_tr_a": "id serial PRIMARY KEY",
                                "dec_tr_b": "id int PRIMARY KEY"})
    admin.execute("INSERT INTO dec_tr_a DEFAULT VALUES")
    admin.execute("TRUNCATE dec_tr_a, dec_tr_b RESTART IDENTITY")
    admin.execute("TRUNCATE dec_tr_b CASCADE")
    _, t_both, t_cascade = changes(admin, slot, pub)
    (both,) = t_both.changes
    assert isinstance(both, Truncate)
    assert both.restart_identity and not both.cascade
    names = sorted(r.name for r in t_both.relations[0])
    assert names == ["dec_tr_a", "dec_tr_b"]
    (cascade,) = t_cascade.changes
    assert isinstance(cascade, Truncate) and cascade.cascade and not cascade.restart_identity
    assert [r.name for r in t_cascade.relations[0]] == ["dec_tr_b"]


def test_several_tables_and_transactions_arrive_whole_and_in_commit_order(
        admin: Any, admin_options: Any) -> None:
    slot, pub = capture(admin, {"dec_orders": "id int PRIMARY KEY, customer int",
                                "dec_customers": "id int PRIMARY KEY, name text"})
    other = admin_options.connect(autocommit=False)
    try:
        # the first transaction to begin commits last
        other.execute("INSERT INTO dec_orders VALUES (100, 1)")
        with admin.transaction():
            admin.execute("INSERT INTO dec_customers VALUES (1, 'ann')")
            admin.execute("INSERT INTO dec_orders VALUES (1, 1)")
        other.execute("INSERT INTO dec_customers VALUES (2, 'bob')")
        other.commit()
    finally:
        other.close()
    first, second = changes(admin, slot, pub)
    assert first.commit_lsn < second.commit_lsn and first.xid > second.xid
    assert [(first.relation(i).name, c.new[0]) for i, c in  # type: ignore[union-attr]
            enumerate(first.changes)] == [("dec_customers", "1"), ("dec_orders", "1")]
    assert [(second.relation(i).name, c.new[0]) for i, c in  # type: ignore[union-attr]
            enumerate(second.changes)] == [("dec_orders", "100"), ("dec_customers", "2")]


def test_a_transaction_of_unpublished_tables_sends_nothing(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_pub_only": "id int PRIMARY KEY"})
    admin.execute("CREATE TABLE dec_unpublished (id int PRIMARY KEY)")
    admin.execute("INSERT INTO dec_unpublished VALUES (1)")
    admin.execute("INSERT INTO dec_pub_only VALUES (7)")
    (t,) = changes(admin, slot, pub)
    assert t.changes == (Insert(t.changes[0].relation_id, ("7",)),)  # type: ignore[union-attr]


def test_a_user_defined_type_is_described_by_a_type_message(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_mood_placeholder": "id int PRIMARY KEY"})
    admin.execute("CREATE TYPE dec_mood AS ENUM ('sad', 'happy')")
    admin.execute("CREATE TABLE dec_moods (id int PRIMARY KEY, mood dec_mood)")
    admin.execute(f"ALTER PUBLICATION {pub} ADD TABLE dec_moods")
    admin.execute("INSERT INTO dec_moods VALUES (1, 'happy')")
    rows = admin.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)", (slot, pub)).fetchall()
    decoder = Decoder()
    messages = [decoder.decode(bytes(r[0])) for r in rows]
    (type_info,) = [m for m in messages if isinstance(m, TypeInfo)]
    mood_oid = admin.execute("SELECT 'dec_mood'::regtype::oid::int8").fetchone()[0]
    assert (type_info.type_oid, type_info.namespace, type_info.name) == (
        mood_oid, "public", "dec_mood")
    (relation,) = [m for m in messages if isinstance(m, Relation)]
    assert relation.columns[1].type_oid == mood_oid
    assert [type(m) for m in messages] == [Begin, TypeInfo, Relation, Insert, Commit]


def test_type_modifiers_of_varchar_and_numeric_come_with_the_relation(admin: Any) -> None:
    slot, pub = capture(admin, {"dec_mods": "id int PRIMARY KEY, code varchar(12), "
                                            "price numeric(10, 2), free numeric"})
    admin.execute("INSERT INTO dec_mods VALUES (1, 'x', 1.5, 2)")
    (t,) = changes(admin, slot, pub)
    assert [c.type_modifier for c in t.relation(0).columns] == [-1, 16, (10 << 16 | 2) + 4, -1]
    assert t.changes[0].new == ("1", "x", "1.50", "2")  # type: ignore[union-attr]


# -- malformed messages --------------------------------------------------------------------


def test_a_message_that_ends_early_names_its_type_and_the_offset() -> None:
    begin = b"B" + (5).to_bytes(8, "big") + (6).to_bytes(8, "big") + (7).to_bytes(4, "big")
    assert parse_message(begin) == Begin(5, 6, 7)
    with pytest.raises(PgOutputError, match=r"Begin message, byte 17: ends inside xid") as e:
        parse_message(begin[:-2])
    assert (e.value.message_type, e.value.offset) == ("Begin", 17)


def test_bytes_left_over_after_a_message_are_an_error() -> None:
    commit = b"C\0" + bytes(24)
    assert parse_message(commit) == Commit(0, 0, 0, 0)
    with pytest.raises(PgOutputError, match=r"Commit message, byte 26: 1 bytes left over"):
        parse_message(commit + b"!")


def test_an_unknown_tuple_kind_names_the_column_and_its_offset() -> None:
    insert = b"I" + (9).to_bytes(4, "big") + b"N" + (2).to_bytes(2, "big") + b"n" + b"x"
    with pytest.raises(PgOutputError, match=r"Insert message, byte 9: new tuple's column 1: "
                                            r"unknown kind 'x'"):
        parse_message(insert)
    binary = insert[:-1] + b"b" + (1).to_bytes(4, "big") + b"\x01"
    with pytest.raises(PgOutputError, match=r"byte 9: .*binary form"):
        parse_message(binary)


def test_an_unknown_message_type_and_an_unterminated_string_are_errors() -> None:
    with pytest.raises(PgOutputError, match=r"unknown message type 'Z'"):
        parse_message(b"Z123")
    with pytest.raises(PgOutputError, match=r"Origin message, byte 9: origin name: a string "
                                            r"with no terminating zero byte"):
        parse_message(b"O" + bytes(8) + b"abc")


def test_a_change_of_a_relation_never_described_is_an_error() -> None:
    insert = b"I" + (9).to_bytes(4, "big") + b"N" + (0).to_bytes(2, "big")
    with pytest.raises(PgOutputError, match=r"relation id 9 was not described"):
        Decoder().decode(insert)


def test_a_row_wider_than_its_relation_is_an_error() -> None:
    relation = (b"R" + (9).to_bytes(4, "big") + b"public\0t\0d" + (1).to_bytes(2, "big")
                + b"\x01id\0" + (23).to_bytes(4, "big") + (0xFFFFFFFF).to_bytes(4, "big"))
    decoder = Decoder()
    described = decoder.decode(relation)
    assert isinstance(described, Relation) and described.columns[0].type_modifier == -1
    insert = (b"I" + (9).to_bytes(4, "big") + b"N" + (2).to_bytes(2, "big") + b"n" + b"n")
    with pytest.raises(PgOutputError, match=r"public.t has 2 columns, its Relation message 1"):
        decoder.decode(insert)


# -- LSNs and times ------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_an_lsn_round_trips_through_its_text_form(lsn: int) -> None:
    assert lsn_from_text(lsn_to_text(lsn)) == lsn


def test_lsn_text_is_the_servers_own_form(admin: Any) -> None:
    for lsn in (0, 1, 0x16_B374D848, (1 << 64) - 1, 0xABCDEF_00000001):
        server = admin.execute("SELECT %s::pg_lsn::text, (%s::pg_lsn - '0/0'::pg_lsn)::text",
                               (lsn_to_text(lsn), lsn_to_text(lsn))).fetchone()
        assert server == (lsn_to_text(lsn), str(lsn))
    with pytest.raises(ValueError, match="X/Y"):
        lsn_from_text("16B374D848")


def test_postgres_times_are_microseconds_since_2000_in_utc() -> None:
    assert pg_time_to_datetime(0) == datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert pg_time_to_datetime(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999,
                                               tzinfo=timezone.utc)
    assert pg_time_to_unix_micros(0) == POSTGRES_EPOCH_UNIX_US
    later = pg_time_to_datetime(86_400_000_001)
    assert later - datetime(2000, 1, 2, tzinfo=timezone.utc) == timedelta(microseconds=1)


# -- the fast path of changes: whatever it accepts is exactly what the bytes say -------------

def _encode_tuple(row: tuple[Any, ...]) -> bytes:
    out = len(row).to_bytes(2, "big")
    for value in row:
        if value is None:
            out += b"n"
        elif value is Toast.UNCHANGED:
            out += b"u"
        else:
            raw = value.encode("utf-8")
            out += b"t" + len(raw).to_bytes(4, "big") + raw
    return out


def _encode(message: Insert | Update | Delete) -> bytes:
    head = message.relation_id.to_bytes(4, "big")
    if isinstance(message, Insert):
        return b"I" + head + b"N" + _encode_tuple(message.new)
    if isinstance(message, Update):
        old = (message.old_kind.encode() + _encode_tuple(message.old)
               if message.old is not None else b"")
        return b"U" + head + old + b"N" + _encode_tuple(message.new)
    return b"D" + head + message.old_kind.encode() + _encode_tuple(message.old)


_VALUES = st.one_of(st.none(), st.just(Toast.UNCHANGED), st.text(max_size=12))
_ROWS = st.lists(_VALUES, max_size=5).map(tuple)
_CHANGES = st.one_of(
    st.builds(Insert, st.integers(0, (1 << 32) - 1), _ROWS),
    st.builds(lambda r, o, n: Update(r, "", None, n), st.integers(0, (1 << 32) - 1),
              _ROWS, _ROWS),
    st.builds(lambda r, k, o, n: Update(r, k, o, n), st.integers(0, (1 << 32) - 1),
              st.sampled_from(["K", "O"]), _ROWS, _ROWS),
    st.builds(Delete, st.integers(0, (1 << 32) - 1), st.sampled_from(["K", "O"]), _ROWS),
)


@given(_CHANGES, st.sampled_from(["none", "cut", "flip", "extra"]), st.integers(0, 1 << 16),
       st.integers(0, 255))
def test_a_change_message_parses_to_what_its_bytes_say_or_is_an_error(
        message: Insert | Update | Delete, mutation: str, at: int, byte: int) -> None:
    data = _encode(message)
    if mutation == "none":
        assert parse_message(data) == message
        return
    where = at % len(data)
    if mutation == "cut":
        data = data[:where]
    elif mutation == "flip":
        data = data[:where] + bytes([byte]) + data[where + 1:]
    else:
        data = data + bytes([byte])
    try:
        parsed = parse_message(data)
    except PgOutputError:
        return  # refused, naming the type and the offset (the tests above)
    if not isinstance(parsed, Insert | Update | Delete):
        assert data[0] not in b"IUD"  # the flip made it another message type
        return
    assert _encode(parsed) == data  # accepted only as what the bytes are


def _begin(final_lsn: int, xid: int) -> bytes:
    return b"B" + final_lsn.to_bytes(8, "big") + (0).to_bytes(8, "big") + xid.to_bytes(4, "big")


def _commit(commit_lsn: int, end_lsn: int) -> bytes:
    return (b"C" + b"\x00" + commit_lsn.to_bytes(8, "big") + end_lsn.to_bytes(8, "big")
            + (0).to_bytes(8, "big"))


def _relation(relation_id: int, name: str) -> bytes:
    return (b"R" + relation_id.to_bytes(4, "big") + b"public\x00" + name.encode() + b"\x00d"
            + (1).to_bytes(2, "big") + b"\x01id\x00" + (23).to_bytes(4, "big")
            + (-1).to_bytes(4, "big", signed=True))


def test_transactions_ending_before_a_position_are_skipped_unparsed_but_their_relations_kept(
        ) -> None:
    """Decoder.transactions(after_lsn): a change inside a transaction whose commit record
    starts before ``after_lsn`` is not even parsed (a malformed one raises nothing), while the
    Relation message sent inside it still describes the next transaction's change."""
    broken_insert = b"I\x00\x00"  # cut short: the checked parser refuses it
    messages = [_begin(100, 1), _relation(7, "t"), broken_insert, _commit(100, 120),
                _begin(200, 2), _encode(Insert(7, ("5",))), _commit(200, 220)]
    decoder = Decoder()
    (only,) = decoder.transactions(messages, after_lsn=120)
    assert (only.xid, only.end_lsn, only.changes) == (2, 220, (Insert(7, ("5",)),))
    assert only.relation(0).name == "t" and decoder.last_end_lsn == 220
    with pytest.raises(PgOutputError, match="Insert"):
        list(Decoder().transactions(messages, after_lsn=0))  # not skipped: parsed, refused
