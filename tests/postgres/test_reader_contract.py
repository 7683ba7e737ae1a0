"""The PostgreSQL reader keeps the split reader's contract (sparkcoord.testing.readers: every
chunk read once and reported finished once, a batch stopped by its row limit goes on from its
state, a batch run again emits the same rows and asks the same), against a real server: a
chunk is read by one batch and emitted with its report by the next (reader.py rule 1)."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import NextChunk, SnapshotChunk, TableShape
from sparkcoord.sources.postgres.io import catalog, replication
from sparkcoord.sources.postgres.io.connection import ConnectionOptions
from sparkcoord.sources.postgres.reader import PostgresReader, ReaderConfig
from sparkcoord.sources.splits import Split
from sparkcoord.testing import ScriptedEnumerator, SplitReaderContract, read_batch
from tests.postgres_server import ADMIN_PASSWORD

_names = itertools.count()


class TestPostgresReader(SplitReaderContract):
    """Three chunks of a 30-row table: keys 1-10, 11-20 and 21-30."""

    stop_after_rows = 5

    @pytest.fixture(autouse=True)
    def _table(self, admin: Any, admin_options: ConnectionOptions,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setenv("PGPASSWORD", ADMIN_PASSWORD)  # reader.py rule 5: as an executor
        n = next(_names)
        self.name, slot, pub = f"contract_{n}", f"contract_slot_{n}", f"contract_pub_{n}"
        self.table = TableName("public", self.name)
        admin.execute(f"CREATE TABLE {self.name} (id int PRIMARY KEY, note text NOT NULL)")
        admin.execute(f"INSERT INTO {self.name} SELECT g, 'row ' || g "
                      "FROM generate_series(1, 30) g")
        replication.ensure_publication(admin, pub, [self.table])
        replication.ensure_slot(admin, slot)
        self.config = ReaderConfig(pickle.loads(pickle.dumps(admin_options)), slot, pub,
                                   (TableShape.of(catalog.table_info(admin, self.table)),))
        try:
            yield
        finally:
            replication.drop_slot(admin, slot)

    def make_reader(self) -> PostgresReader:
        return PostgresReader(self.config)

    def splits(self) -> list[Split]:
        bounds = [(None, 11), (11, 21), (21, None)]
        return [SnapshotChunk(split_id=f"{self.table}#{i}", table=self.table, key_column="id",
                              index=i, start=start, end=end)
                for i, (start, end) in enumerate(bounds)]

    def expected_rows(self, split: Split) -> list[dict[str, Any]]:
        assert isinstance(split, SnapshotChunk)
        first = 1 if split.start is None else split.start
        last = 30 if split.end is None else split.end - 1
        return [{"op": "r", "table": str(self.table), "key": {"id": i},
                 "after": {"id": i, "note": f"row {i}"}} for i in range(first, last + 1)]

    def comparable(self, row: dict[str, Any]) -> Any:
        # a snapshot row's log position is the chunk's high watermark, known only by the read
        return {k: row[k] for k in ("op", "table", "key", "after")}


    def test_the_reader_asks_with_next_chunk_and_reports_each_chunk_with_its_high_watermark(
            self) -> None:
        chunks = self.splits()
        enumerator = ScriptedEnumerator(chunks)
        first = read_batch(self.make_reader(), None, enumerator.answer)
        assert first.rows == [] and first.batch_requested  # read and kept: emitted next batch
        second = read_batch(self.make_reader(), first.state, enumerator.answer, epoch=1)
        report = second.asked[0]
        assert isinstance(report, NextChunk)
        assert report.finished == tuple(c.split_id for c in chunks)
        highs = dict(report.reports)
        assert set(highs) == set(report.finished) and all(h > 0 for h in highs.values())
        assert {row["lsn"] for row in second.rows} <= set(highs.values())
        assert len(second.rows) == 30 and second.state is None
