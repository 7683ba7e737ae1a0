"""Local files without fsspec (docs/decisions/085-compiled-bench-local-files.md): the file
source lists and reads an absolute local path with ``os`` and ``open``, names every path exactly
as fsspec's local filesystem does (paths are kept in checkpoints), and gives the same splits and
rows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem as FsspecLocal

from sparkcoord.sources.files.discovery import FileDiscovery, plan_splits
from sparkcoord.sources.files.listing import FileEntry, LocalFileSystem, filesystem
from sparkcoord.sources.files.options import FileSourceOptions
from sparkcoord.sources.files.reading import FileReader

SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


@pytest.mark.parametrize("form", ["{d}", "{d}/", "{d}//", "file://{d}", "file:{d}", "local://{d}",
                                  "local:{d}/", "{d}/./sub/../x", "{d}//double", "{d}/*.csv"])
def test_an_absolute_local_path_is_served_without_fsspec_and_named_as_fsspec_names_it(
        tmp_path, form) -> None:
    url = form.format(d=tmp_path)
    fs, root = filesystem(url)
    assert isinstance(fs, LocalFileSystem)
    assert root == FsspecLocal._strip_protocol(url)


@pytest.mark.parametrize("url", ["relative/dir", "~/somewhere", "file:relative", "memory://x/y"])
def test_a_relative_home_or_remote_url_still_goes_through_fsspec(url) -> None:
    fs, _ = filesystem(url)
    assert not isinstance(fs, LocalFileSystem)
    assert type(fs).__module__.startswith("fsspec")


def test_storage_options_keep_a_local_path_on_fsspec(tmp_path) -> None:
    fs, _ = filesystem(str(tmp_path), {"auto_mkdir": True})
    assert type(fs).__module__.startswith("fsspec")


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_local_files_give_the_same_splits_and_rows_as_through_fsspec(tmp_path, fmt) -> None:
    path = str(tmp_path / f"f.{fmt}")
    rows = pa.table({"id": pa.array(range(300), pa.int64())})
    if fmt == "parquet":
        pq.write_table(rows, path, row_group_size=70)
    else:
        with open(path, "w") as out:
            out.writelines(json.dumps({"id": i}) + "\n" for i in range(300))
    options = FileSourceOptions(url=str(tmp_path), format=fmt, max_split_bytes=500)
    discovery = FileDiscovery(options)
    splits, _ = discovery.discover(discovery.initial_state())
    (entry,) = {(s.path, s.file_size, s.mtime) for s in splits}
    through_fsspec = plan_splits(FsspecLocal(), FileEntry(*entry), options)
    assert splits == through_fsspec and len(splits) > 2
    reader = FileReader(options, SCHEMA_JSON)
    got = [v for s in splits for b, _ in reader.read_split(s, None) for v in b.column(0).to_pylist()]
    assert got == list(range(300))


def test_a_local_file_source_lists_plans_and_reads_without_importing_fsspec(tmp_path) -> None:
    for i in range(3):
        pq.write_table(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}),
                       str(tmp_path / f"part-{i}.parquet"))
    script = textwrap.dedent(f"""
        import sys
        from sparkcoord.sources.files.discovery import FileDiscovery
        from sparkcoord.sources.files.options import FileSourceOptions
        from sparkcoord.sources.files.reading import FileReader
        options = FileSourceOptions(url={f"file://{tmp_path}"!r}, format="parquet")
        discovery = FileDiscovery(options)
        splits, _ = discovery.discover(discovery.initial_state())
        reader = FileReader(options, {SCHEMA_JSON!r})
        ids = sorted(v for s in splits for b, _ in reader.read_split(s, None)
                     for v in b.column(0).to_pylist())
        assert ids == list(range(30)), ids
        print("fsspec" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_an_open_local_file_keeps_its_own_size_when_the_path_is_replaced(tmp_path) -> None:
    # the reader checks the open file's size against the split: the file it reads, even if the
    # path is deleted or renamed over after the open (as fsspec's files do)
    import os

    path = tmp_path / "f.json"
    path.write_bytes(b"12345\n")
    with LocalFileSystem().open(str(path), "rb") as f:
        (tmp_path / "new").write_bytes(b"a much longer file\n")
        os.replace(tmp_path / "new", path)
        assert f.size == 6 and f.read() == b"12345\n"
    with LocalFileSystem().open(str(path), "rb") as f:
        path.unlink()
        assert f.size == 19
