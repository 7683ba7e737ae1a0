"""The two file stores behave alike: a local directory through os, memory:// through fsspec."""

from __future__ import annotations

import pathlib
import posixpath

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


@pytest.mark.parametrize("scheme", ["file:", "file://", "local:", "local://"])
def test_every_local_scheme_fsspec_takes_names_the_same_local_directory(
        tmp_path: pathlib.Path, scheme: str) -> None:
    # a local:// checkpoint kept the storage's local layout (one appended inbound log, fsync)
    # when it went through fsspec's local filesystem; it must not turn into the object-store
    # layout, and file:/x must name /x in every process (decision 85)
    from sparkcoord.runtime.storage import CheckpointStorage

    files, root = files_for(f"{scheme}{tmp_path}/j")
    assert isinstance(files, LocalFiles) and root == f"{tmp_path}/j"
    storage = CheckpointStorage(f"{scheme}{tmp_path}/k", fsync=True)
    assert storage._local and storage.root == f"{tmp_path}/k"
    storage.start_inbound_log(0)
    storage.append_inbound(0, b"frame")
    assert storage.files.read(storage._log_path(0)) == b"frame"  # one file, not segments
    storage.close()


def test_a_private_local_write_is_never_readable_by_others_not_even_its_temporary_file(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import stat

    files = LocalFiles()
    path = f"{tmp_path}/run/channel.json"
    files.write_atomic(path, b"old, world-readable")  # an earlier file of wider mode
    os.chmod(path, 0o644)
    old_umask = os.umask(0o022)  # the usual umask: a plain write would be 0644
    renamed: list[tuple[str, int]] = []
    real_replace = os.replace

    def inspecting_replace(src: str, dst: str) -> None:
        renamed.append((posixpath.basename(src), stat.S_IMODE(os.stat(src).st_mode)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", inspecting_replace)
    try:
        files.write_atomic(path, b'{"secret": "..."}', private=True)
        files.write_atomic(f"{tmp_path}/run/public", b"p")
    finally:
        os.umask(old_umask)
    (private_tmp, private_mode), (_, public_mode) = renamed
    assert private_tmp.startswith(".channel.json.") and private_mode == 0o600
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert files.read(path) == b'{"secret": "..."}'
    assert public_mode == 0o644  # not private: 0666 less the umask, as before
    assert sorted(files.names(f"{tmp_path}/run")) == ["channel.json", "public"]


def test_a_private_write_to_an_fsspec_store_is_accepted_and_written(tmp_path: pathlib.Path) -> None:
    files, root = files_for(f"memory://files-test/{tmp_path.name}-private")
    files.write_atomic(f"{root}/channel.json", b"x", private=True)  # no modes: ignored
    assert files.read(f"{root}/channel.json") == b"x"
