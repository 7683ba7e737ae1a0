"""The slot and the publication (sparkcoord/sources/postgres/io/replication.py) on a real server:
created when missing and reused when present, a peek that consumes nothing, an advance that
confirms exactly what it is given, the idle-publication rule that lets a quiet slot release
WAL, errors that name the role and the right it lacks, and a randomized run of peeks, batch
commits and crashes that delivers every committed transaction exactly once."""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest

from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import Insert, Transaction
from sparkcoord.sources.postgres.errors import (
    MissingRights,
    PublicationProblem,
    SlotProblem,
)
from sparkcoord.sources.postgres.io import replication
from sparkcoord.sources.postgres.io.connection import ConnectionOptions

_names = itertools.count()


def fresh(conn: Any, table_columns: str = "id int PRIMARY KEY") -> tuple[str, str, str]:
    """A new table with a publication and a slot: (table, slot, publication)."""
    n = next(_names)
    table, slot, pub = f"rep_t{n}", f"rep_slot_{n}", f"rep_pub_{n}"
    conn.execute(f"CREATE TABLE {table} ({table_columns})")
    assert replication.ensure_publication(conn, pub, [TableName.parse(table)])
    assert replication.ensure_slot(conn, slot)
    return table, slot, pub


def ids(transactions: tuple[Transaction, ...] | list[Transaction]) -> list[int]:
    return [int(c.new[0]) for t in transactions for c in t.changes  # type: ignore[arg-type]
            if isinstance(c, Insert)]


def test_a_missing_slot_and_publication_are_created_and_present_ones_reused(admin: Any) -> None:
    admin.execute("CREATE TABLE rep_reuse (id int PRIMARY KEY)")
    assert replication.ensure_publication(admin, "rep_reuse_pub", [TableName("public", "rep_reuse")])
    assert replication.ensure_slot(admin, "rep_reuse_slot")
    info = replication.slot_info(admin, "rep_reuse_slot")
    assert info is not None and (info.plugin, info.slot_type) == ("pgoutput", "logical")
    assert info.database == admin.execute("SELECT current_database()").fetchone()[0]
    admin.execute("INSERT INTO rep_reuse VALUES (1)")
    assert not replication.ensure_publication(admin, "rep_reuse_pub",
                                              [TableName("public", "rep_reuse")])
    assert not replication.ensure_slot(admin, "rep_reuse_slot")
    # reusing kept the slot's position: the change made before is still there
    assert ids(replication.peek(admin, "rep_reuse_slot", "rep_reuse_pub").transactions) == [1]
    assert replication.slot_info(admin, "rep_reuse_slot") == info


def test_a_peek_consumes_nothing_and_two_peeks_return_the_same(admin: Any) -> None:
    table, slot, pub = fresh(admin)
    admin.execute(f"INSERT INTO {table} VALUES (1), (2)")
    admin.execute(f"INSERT INTO {table} VALUES (3)")
    before = replication.slot_info(admin, slot)
    first = replication.peek(admin, slot, pub)
    second = replication.peek(admin, slot, pub)
    assert ids(first.transactions) == ids(second.transactions) == [1, 2, 3]
    assert first.transactions == second.transactions
    assert replication.slot_info(admin, slot) == before


def test_advancing_to_a_transactions_end_confirms_it_and_nothing_after(admin: Any) -> None:
    table, slot, pub = fresh(admin)
    for i in range(1, 4):
        admin.execute(f"INSERT INTO {table} VALUES ({i})")
    t1, t2, t3 = replication.peek(admin, slot, pub).transactions
    confirmed = replication.advance(admin, slot, t2.end_lsn)
    assert confirmed == t2.end_lsn
    info = replication.slot_info(admin, slot)
    assert info is not None and info.confirmed_flush_lsn == t2.end_lsn
    assert replication.peek(admin, slot, pub).transactions == (t3,)
    # rule 5: asking for an earlier position changes nothing
    assert replication.advance(admin, slot, t1.end_lsn) == t2.end_lsn
    assert replication.peek(admin, slot, pub).transactions == (t3,)


def test_a_peek_cut_short_by_its_limit_reads_to_its_last_transactions_end(admin: Any) -> None:
    table, slot, pub = fresh(admin)
    for i in range(1, 6):
        admin.execute(f"INSERT INTO {table} VALUES ({i})")
    # each transaction is Begin, Relation, Insert, Commit: 4 messages
    part = replication.peek(admin, slot, pub, upto_nchanges=6)
    assert part.cut_short and ids(part.transactions) == [1, 2]
    assert part.read_to == part.transactions[-1].end_lsn < part.upto_lsn
    rest = replication.peek(admin, slot, pub, after_lsn=part.transactions[-1].end_lsn)
    assert not rest.cut_short and ids(rest.transactions) == [3, 4, 5]
    assert rest.read_to == rest.upto_lsn


def test_a_peek_after_a_position_skips_what_ends_before_it_but_keeps_its_relations(
        admin: Any) -> None:
    """The changes of transactions ending at or before ``after_lsn`` are not even parsed, but
    a Relation message inside them (sent once per decoding session, before the table's first
    change) still describes the changes after."""
    table, slot, pub = fresh(admin, "id int PRIMARY KEY, note text")
    for i in range(1, 5):
        admin.execute(f"INSERT INTO {table} VALUES ({i}, 'n{i}')")
    every = replication.peek(admin, slot, pub)
    t2 = every.transactions[1]
    later = replication.peek(admin, slot, pub, after_lsn=t2.end_lsn)
    assert later.transactions == every.transactions[2:] and ids(later.transactions) == [3, 4]
    assert later.transactions[0].relation(0).name == table  # described in transaction 1
    assert later.read_to == every.read_to and later.messages == every.messages
    cut = replication.peek(admin, slot, pub, upto_nchanges=6, after_lsn=t2.end_lsn)
    assert cut.cut_short and cut.transactions == () and cut.read_to == t2.end_lsn


def test_an_idle_publication_lets_the_slot_release_the_wal_of_other_tables(admin: Any) -> None:
    table, slot, pub = fresh(admin)
    admin.execute("CREATE TABLE rep_busy (id int, filler text)")
    admin.execute("INSERT INTO rep_busy SELECT i, repeat('x', 200) FROM generate_series(1, 20000) i")
    admin.execute("CHECKPOINT")  # logs the running transactions a slot can restart from
    held_before = replication.held_wal_bytes(admin, slot)
    assert held_before is not None and held_before > 4_000_000
    idle = replication.peek(admin, slot, pub)
    assert idle.transactions == () and not idle.cut_short
    assert idle.read_to == idle.upto_lsn  # rule 3: read to the flush position
    replication.advance(admin, slot, idle.read_to)
    held_after = replication.held_wal_bytes(admin, slot)
    assert held_after is not None and held_after < 1_000_000, (held_before, held_after)
    # and nothing written after the position read to is lost
    admin.execute(f"INSERT INTO {table} VALUES (42)")
    assert ids(replication.peek(admin, slot, pub).transactions) == [42]


def test_an_existing_slot_of_another_plugin_is_an_error_naming_it(admin: Any) -> None:
    admin.execute("SELECT pg_create_logical_replication_slot('rep_other_plugin', 'test_decoding')")
    with pytest.raises(SlotProblem, match=r"slot 'rep_other_plugin' exists but is a logical "
                                          r"slot of plugin 'test_decoding'"):
        replication.ensure_slot(admin, "rep_other_plugin")


def test_a_publication_that_misses_a_captured_table_is_an_error_naming_the_table(
        admin: Any) -> None:
    admin.execute("CREATE TABLE rep_in (id int PRIMARY KEY)")
    admin.execute("CREATE TABLE rep_out (id int PRIMARY KEY)")
    admin.execute("CREATE PUBLICATION rep_partial FOR TABLE rep_in")
    with pytest.raises(PublicationProblem, match=r"publication 'rep_partial' exists but does "
                                                 r"not publish public.rep_out: add them"):
        replication.ensure_publication(admin, "rep_partial",
                                       [TableName.parse("rep_in"), TableName.parse("rep_out")])


def test_a_dropped_slot_or_publication_is_a_clear_error_when_reading(admin: Any) -> None:
    table, slot, pub = fresh(admin)
    admin.execute(f"DROP PUBLICATION {pub}")
    admin.execute(f"INSERT INTO {table} VALUES (1)")
    with pytest.raises(PublicationProblem, match=rf'publication "{pub}" does not exist'):
        replication.peek(admin, slot, pub)
    replication.drop_slot(admin, slot)
    with pytest.raises(SlotProblem, match=rf"replication slot '{slot}' does not exist "
                                          r"\(was it dropped\?\)"):
        replication.peek(admin, slot, pub)
    with pytest.raises(SlotProblem, match="does not exist"):
        replication.advance(admin, slot, 1)


def test_a_slot_whose_wal_the_server_removed_is_a_clear_error_saying_changes_were_lost(
        admin: Any) -> None:
    """``max_slot_wal_keep_size`` lets the server drop WAL a lagging slot still needs and
    invalidate the slot: reading or confirming it then says so, and how to go on."""
    table, slot, pub = fresh(admin)
    admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    admin.execute("SELECT pg_reload_conf()")
    try:
        for i in range(4):  # new WAL segments past the slot, then a checkpoint removes them
            admin.execute(f"INSERT INTO {table} VALUES ({i})")
            admin.execute("SELECT pg_switch_wal()")
        admin.execute("CHECKPOINT")
        status = admin.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = "
                               "%s", (slot,)).fetchone()
        assert status == ("lost",)
        with pytest.raises(SlotProblem, match=rf"replication slot '{slot}' was invalidated.*"
                                              r"start again with a snapshot"):
            replication.peek(admin, slot, pub)
        with pytest.raises(SlotProblem, match=rf"replication slot '{slot}' was invalidated"):
            replication.advance(admin, slot, replication.current_flush_lsn(admin))
    finally:
        admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        admin.execute("SELECT pg_reload_conf()")
        replication.drop_slot(admin, slot)


def test_a_role_without_replication_is_told_it_lacks_that_right(
        admin: Any, plain_options: ConnectionOptions) -> None:
    table, slot, pub = fresh(admin)
    with plain_options.connect() as plain:
        with pytest.raises(MissingRights, match=r"role 'cdc_plain' lacks the REPLICATION "
                                                r"attribute, needed to create the logical "
                                                r"replication slot 'rep_plain_slot' \(ALTER ROLE "
                                                r"\"cdc_plain\" REPLICATION"):
            replication.ensure_slot(plain, "rep_plain_slot")
        with pytest.raises(MissingRights, match=r"REPLICATION"):
            replication.peek(plain, slot, pub)
    assert replication.slot_info(admin, "rep_plain_slot") is None


def test_a_role_that_does_not_own_a_table_is_told_it_cannot_publish_it(
        admin: Any, plain_options: ConnectionOptions) -> None:
    admin.execute("CREATE TABLE rep_admins (id int PRIMARY KEY)")
    admin.execute("GRANT SELECT ON rep_admins TO cdc_plain")
    with plain_options.connect() as plain:
        plain.execute("CREATE TABLE rep_plains (id int PRIMARY KEY)")
        with pytest.raises(MissingRights, match=r"role 'cdc_plain' may not create publication "
                                                r"'rep_mixed': it does not own table "
                                                r"public.rep_admins \(owned by 'cdc_admin'\)"):
            replication.ensure_publication(plain, "rep_mixed", [
                TableName.parse("rep_plains"), TableName.parse("rep_admins")])
        # its own table it may publish
        assert replication.ensure_publication(plain, "rep_own", [TableName.parse("rep_plains")])


def test_a_run_of_peeks_commits_and_crashes_delivers_every_transaction_once(
        admin: Any) -> None:
    """The coordinator's use of rules 1 to 4, randomized: each batch peeks after what was
    delivered, and either commits (then the slot is advanced to the batch's read_to, at once
    or a batch later) or is lost in a crash (the next batch starts over from the slot's
    confirmed position). Committed rows are every inserted id, once, in order."""
    seed = int(os.environ.get("SPARKCOORD_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (SPARKCOORD_SEED={seed} to repeat)")
    rng = random.Random(seed)
    table, slot, pub = fresh(admin)
    written: list[int] = []
    committed: list[int] = []
    delivered_to = 0  # end LSN of the last committed batch's last transaction
    to_confirm: list[int] = []  # read_to of committed batches not yet confirmed
    next_id = 0
    for _ in range(60):
        for _ in range(rng.randrange(0, 4)):  # transactions of 1 to 3 rows
            rows = list(range(next_id, next_id + rng.randrange(1, 4)))
            next_id += len(rows)
            admin.execute(f"INSERT INTO {table} VALUES " + ", ".join(f"({r})" for r in rows))
            written.extend(rows)
        batch = replication.peek(admin, slot, pub, after_lsn=delivered_to,
                                 upto_nchanges=rng.choice([None, 4, 9, 20]))
        if rng.random() < 0.2:  # a crash: this batch never commits
            # the restart confirms what the last committed checkpoint recorded, and reads the
            # rest again from the slot
            for position in to_confirm:
                replication.advance(admin, slot, position)
            to_confirm, delivered_to = [], 0
            continue
        committed.extend(ids(batch.transactions))
        if batch.transactions:
            delivered_to = max(delivered_to, batch.transactions[-1].end_lsn)
        to_confirm.append(batch.read_to)
        if rng.random() < 0.6:  # the checkpoint notification arrives now (or a batch later)
            for position in to_confirm:
                replication.advance(admin, slot, position)
            to_confirm = []
    for position in to_confirm:
        replication.advance(admin, slot, position)
    final = replication.peek(admin, slot, pub, after_lsn=delivered_to)
    committed.extend(ids(final.transactions))
    assert committed == written, f"seed {seed}"
