"""Values at the edges of their type's range reach Delta and Iceberg tables, appended and merged
(issue 43 finding 1): a timestamp of 9999-12-31 23:59:59.999999 once made every Delta commit of
its epoch fail (its statistic rounded up past ``datetime.max``), and the commit worker retried
it for good. A bound that cannot be represented is left out (sinks/files.py rule 3); a commit
that can never succeed fails at once, naming the table, the column and the value."""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.sinks.changes import reduce_changes
from sparkcoord.sinks.delta import DeltaCommitter, delta_stats
from sparkcoord.sinks.fencing import COMMIT
from sparkcoord.sinks.files import TaskFileWriter

UTC = datetime.timezone.utc
LOW = datetime.datetime(1, 1, 1, 0, 0, 0, 0)
HIGH = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
ROW = pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC")),
                 pa.field("local", pa.timestamp("us")), pa.field("day", pa.date32())])
EDGES = [
    {"id": 1, "at": LOW.replace(tzinfo=UTC), "local": LOW, "day": datetime.date.min},
    {"id": 2, "at": HIGH.replace(tzinfo=UTC), "local": HIGH, "day": datetime.date.max},
    # the last microsecond of each millisecond near the top: the old rounding's whole range
    {"id": 3, "at": HIGH.replace(microsecond=999001, tzinfo=UTC),
     "local": HIGH.replace(microsecond=999001), "day": datetime.date.max},
]
CHANGES = pa.schema([pa.field("op", pa.string()), pa.field("lsn", pa.int64()),
                     pa.field("seq", pa.int32()),
                     pa.field("key", pa.struct([pa.field("id", pa.int64())])),
                     pa.field("after", pa.struct(list(ROW))),
                     pa.field("unchanged", pa.list_(pa.string()))])


class Table:
    """A Delta or Iceberg table of ``ROW`` in ``root``."""

    def __init__(self, kind: str, root: Any) -> None:
        self.kind, self.root = kind, root
        if kind == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog

            self.catalog = SqlCatalog("edges", uri=f"sqlite:///{root}/catalog.db",
                                      warehouse=f"file://{root}/warehouse")
            self.catalog.create_namespace_if_not_exists("lake")

    def committer(self) -> Any:
        if self.kind == "delta":
            c: Any = DeltaCommitter(str(self.root / "table"), "job", ROW, run_id="run")
        else:
            from sparkcoord.sinks.iceberg import IcebergCommitter

            c = IcebergCommitter(self.catalog, "lake.t", "job", ROW, run_id="run")
        c.open()
        return c

    def location(self, c: Any) -> str:
        return c.table_location if self.kind == "iceberg" else c.table_uri

    def rows(self) -> list[dict[str, Any]]:
        if self.kind == "delta":
            from deltalake import DeltaTable

            data = pa.table(DeltaTable(str(self.root / "table")).to_pyarrow_table())
        else:
            data = self.catalog.load_table("lake.t").scan().to_arrow()
        return sorted(data.cast(ROW).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_timestamps_and_dates_at_both_ends_of_their_range_are_appended_exactly(
        kind: str, tmp_path: Any) -> None:
    table = Table(kind, tmp_path)
    c = table.committer()
    writer = TaskFileWriter(table.location(c), "job", 0, 0, 0, ROW)
    files = writer.write_all([pa.Table.from_pylist(EDGES, schema=ROW)])
    assert c.commit(0, files) == COMMIT
    assert table.rows() == EDGES
    # a filter at the top edge finds its rows: the bounds kept still contain every value
    if kind == "delta":
        from deltalake import DeltaTable, QueryBuilder

        # delta-rs's DataFusion reader: its pyarrow dataset prunes a file for a filter on a
        # column the file's statistics leave out (docs/sinks.md, "Reading the table")
        hits = pa.table(QueryBuilder().register("t", DeltaTable(str(tmp_path / "table")))
                        .execute("select id from t where local >= arrow_cast("
                                 "'9999-12-31T23:59:59.999001', "
                                 "'Timestamp(Microsecond, None)')").read_all())
    else:
        hits = table.catalog.load_table("lake.t").scan(
            row_filter=f"local >= '{HIGH.replace(microsecond=999001).isoformat()}'").to_arrow()
    assert sorted(hits.column("id").to_pylist()) == [2, 3]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_timestamps_and_dates_at_both_ends_of_their_range_are_merged_by_key_exactly(
        kind: str, tmp_path: Any) -> None:
    table = Table(kind, tmp_path)
    c = table.committer()

    def change(op: str, lsn: int, row: dict[str, Any]) -> dict[str, Any]:
        return {"op": op, "lsn": lsn, "seq": 0, "key": {"id": row["id"]},
                "after": row, "unchanged": None}

    first = reduce_changes(pa.Table.from_pylist([change("r", 1, r) for r in EDGES],
                                                schema=CHANGES), "public.t")
    assert c.merge(0, lambda: first, ["id"]) == COMMIT
    assert table.rows() == EDGES
    # the second merge reads the files holding its keys by their recorded bounds
    swapped = [{**EDGES[0], "id": 2}, {**EDGES[1], "id": 1}]
    second = reduce_changes(pa.Table.from_pylist([change("u", 2, r) for r in swapped],
                                                 schema=CHANGES), "public.t")
    assert c.merge(1, lambda: second, ["id"]) == COMMIT
    assert table.rows() == sorted([*swapped, EDGES[2]], key=lambda r: r["id"])


def test_a_delta_maximum_that_cannot_be_rounded_up_to_the_millisecond_is_left_out() -> None:
    from sparkcoord.sinks.files import ColumnStats, DataFile

    file = DataFile("data/x.parquet", 10, 100, (
        ("local", ColumnStats(0, LOW, HIGH, 10)),
        ("at", ColumnStats(0, LOW.replace(tzinfo=UTC), HIGH.replace(tzinfo=UTC), 10)),
        ("exact", ColumnStats(0, LOW, HIGH.replace(microsecond=999000), 10))))
    stats = delta_stats(file)
    # no bound at all rather than one below the real maximum (files.py rule 3)
    assert "local" not in stats["maxValues"] and "at" not in stats["maxValues"]
    assert "local" not in stats["minValues"] and "at" not in stats["minValues"]
    assert stats["maxValues"]["exact"] == "9999-12-31T23:59:59.999"
    assert stats["minValues"]["exact"] == "0001-01-01T00:00:00.000"
    assert stats["nullCount"] == {"local": 0, "at": 0, "exact": 0}
