"""One table of each format behind one face, so every sink test runs on Delta and Iceberg."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkcoord.sinks.delta import DeltaCommitter
from sparkcoord.sinks.files import DataFile, TaskFileWriter
from sparkcoord.sinks.iceberg import IcebergCommitter
from tests.sinks.conftest import SCHEMA


class Lake:
    """A table in ``root``: committers of it, its location, and its contents read back."""

    def __init__(self, kind: str, root: Any, storage_options: dict[str, Any] | None = None,
                 delta_options: dict[str, str] | None = None, *,
                 catalog_dir: Any = None, warehouse: str | None = None,
                 iceberg_io: dict[str, str] | None = None) -> None:
        """``catalog_dir``: where the Iceberg SQL catalog's sqlite file lives (default
        ``root``); ``warehouse``: its warehouse URL (default ``file://{root}/warehouse``);
        ``iceberg_io``: its FileIO properties (an S3 endpoint and keys)."""
        self.kind = kind
        self.root = str(root)
        self.storage_options = storage_options
        self.delta_options = delta_options
        self._catalog: Any = None
        if kind == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog

            self._catalog = SqlCatalog(
                "sinks", uri=f"sqlite:///{catalog_dir or root}/catalog.db",
                warehouse=warehouse or f"file://{root}/warehouse", **(iceberg_io or {}))
            self._catalog.create_namespace_if_not_exists("lake")

    def committer(self, job_id: str = "job", run_id: str | None = None) -> Any:
        if self.kind == "delta":
            return DeltaCommitter(f"{self.root}/table", job_id, SCHEMA, run_id=run_id,
                                  storage_options=self.delta_options)
        return IcebergCommitter(self._catalog, "lake.t", job_id, SCHEMA, run_id=run_id)

    def location(self, committer: Any) -> str:
        return committer.table_location if self.kind == "iceberg" else committer.table_uri

    def write(self, committer: Any, epoch: int, data: pa.Table, *, subtask: int = 0,
              attempt: int = 0, target_file_bytes: int = 1 << 30) -> list[DataFile]:
        writer = TaskFileWriter(self.location(committer), committer.job_id, epoch, subtask,
                                attempt, SCHEMA, target_file_bytes=target_file_bytes,
                                row_group_rows=200, storage_options=self.storage_options)
        return writer.write_all([data])

    def read(self) -> pa.Table:
        """The table's contents, sorted by id (deltalake / pyiceberg scans)."""
        if self.kind == "delta":
            from deltalake import DeltaTable

            table = DeltaTable(f"{self.root}/table", storage_options=self.delta_options)
            data = pa.table(table.to_pyarrow_table())
        else:
            data = self._catalog.load_table("lake.t").scan().to_arrow()
        return data.cast(SCHEMA).sort_by("id")

    def file_stats(self) -> dict[str, dict[str, Any]]:
        """Per data file the table holds: rows, and min/max/nulls of ``id`` as recorded."""
        out: dict[str, dict[str, Any]] = {}
        if self.kind == "delta":
            from deltalake import DeltaTable

            adds = pa.table(DeltaTable(f"{self.root}/table", storage_options=self.delta_options)
                            .get_add_actions(flatten=True)).to_pylist()
            for a in adds:
                out[a["path"]] = {"rows": a["num_records"], "min": a["min.id"],
                                  "max": a["max.id"], "nulls": a["null_count.name"]}
            return out
        from pyiceberg.conversions import from_bytes

        table = self._catalog.load_table("lake.t")
        schema = table.schema()
        fid, nid = schema.find_field("id").field_id, schema.find_field("name").field_id
        id_type = schema.find_field("id").field_type
        location = table.location().rstrip("/") + "/"
        for task in table.scan().plan_files():
            f = task.file
            out[f.file_path.removeprefix(location)] = {
                "rows": f.record_count, "min": from_bytes(id_type, f.lower_bounds[fid]),
                "max": from_bytes(id_type, f.upper_bounds[fid]),
                "nulls": f.null_value_counts[nid]}
        return out
