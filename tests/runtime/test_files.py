"""The two file stores behave alike: a local directory through os, memory:// through fsspec."""

from __future__ import annotations

import pathlib

import pytest

from sparkcoord.runtime.files import FsspecFiles, LocalFiles, files_for, is_local_url


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: pathlib.Path):
    if request.param == "local":
        return files_for(str(tmp_path / "root"))
    return files_for(f"memory://files-test/{tmp_path.name}")


def test_a_file_is_written_atomically_read_back_and_overwritten(store) -> None:
    files, root = store
    files.write_atomic(f"{root}/a/b/1.state", b"one")
    files.write_atomic(f"{root}/a/b/1.state", b"two", fsync=True)
    assert files.read(f"{root}/a/b/1.state") == b"two"
    assert files.names(f"{root}/a/b") == ["1.state"]  # no temporary file left behind


def test_missing_files_and_directories_are_reported_or_empty(store) -> None:
    files, root = store
    with pytest.raises(FileNotFoundError):
        files.read(f"{root}/nothing")
    assert files.names(f"{root}/no/such/dir") == []
    files.remove(f"{root}/nothing")  # quiet


def test_remove_deletes_a_file_or_a_whole_directory(store) -> None:
    files, root = store
    files.write_atomic(f"{root}/d/x", b"x")
    files.write_atomic(f"{root}/d/sub/y", b"y")
    files.write_atomic(f"{root}/keep", b"k")
    files.remove(f"{root}/d/x")
    assert sorted(files.names(f"{root}/d")) == ["sub"]
    files.remove(f"{root}/d")
    assert files.names(f"{root}/d") == []
    assert files.read(f"{root}/keep") == b"k"


def test_paths_and_file_urls_are_local_and_need_no_fsspec(tmp_path: pathlib.Path) -> None:
    assert is_local_url("relative/dir") and is_local_url("/abs") and is_local_url("file:///x")
    assert not is_local_url("memory://x") and not is_local_url("s3://bucket/x")
    files, root = files_for(f"file://{tmp_path}/j/")
    assert isinstance(files, LocalFiles) and root == f"{tmp_path}/j"
    assert isinstance(files_for("memory://x")[0], FsspecFiles)
