"""File discovery on real local files with a manual clock: the two modes (listing, lexical),
what is skipped, recursive lookup, the backfill, and a state that stays bounded."""

from __future__ import annotations

import os

import pytest

from sparkcoord.sources.files.discovery import FileDiscovery
from sparkcoord.sources.files.options import FileSourceOptions


def touch(path: str, mtime: float, body: bytes = b'{"id": 1}\n') -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(body)
    os.utime(path, (mtime, mtime))


def discovery(root: str, clock: list[float], **options) -> FileDiscovery:
    return FileDiscovery(FileSourceOptions(url=root, format="json", **options),
                         clock=lambda: clock[0])


def names(splits) -> list[str]:
    """The names of the files the splits read (a split may pack several: sources/files rule 8)."""
    return [os.path.basename(path) for s in splits for path in s.paths]


@pytest.mark.parametrize("mode", ["listing", "lexical"])
def test_the_first_cycle_finds_every_visible_file_and_the_next_only_new_ones(tmp_path, mode) -> None:
    root, clock = str(tmp_path), [1000.0]
    for name in ("b.json", "a.json", "_tmp.json", ".hidden.json", "c.txt"):
        touch(f"{root}/{name}", 900)
    d = discovery(root, clock, discovery_mode=mode, glob="*.json")
    found, state = d.discover(d.initial_state())
    assert names(found) == ["a.json", "b.json"]
    touch(f"{root}/d.json", 1001)
    again, state2 = d.discover(state)
    assert names(again) == ["d.json"]
    assert d.discover(state2)[0] == []
    assert state is not state2  # the given state is not changed


def test_listing_mode_finds_a_file_whose_name_sorts_before_the_ones_already_read(tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    touch(f"{root}/m.json", 900)
    d = discovery(root, clock)
    _, state = d.discover(d.initial_state())
    touch(f"{root}/a.json", 800)  # moved in with an old modification time (mv keeps it)
    found, _ = d.discover(state)
    assert names(found) == ["a.json"]


def test_listing_mode_ignores_and_forgets_files_older_than_max_file_age(tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    touch(f"{root}/old.json", 100)
    touch(f"{root}/new.json", 1000)
    d = discovery(root, clock, max_file_age_s=500)
    found, state = d.discover(d.initial_state())
    assert names(found) == ["new.json"] and list(map(os.path.basename, state.recent)) == ["new.json"]
    touch(f"{root}/newer.json", 2000)  # new.json is now too old to be remembered
    found, state = d.discover(state)
    assert names(found) == ["newer.json"]
    assert list(map(os.path.basename, state.recent)) == ["newer.json"]


def test_lexical_mode_lists_only_after_the_marker_until_the_backfill_finds_a_late_name(
        tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    touch(f"{root}/f2.json", 990)
    d = discovery(root, clock, discovery_mode="lexical", backfill_interval_s=60,
                  max_clock_skew_s=5)
    found, state = d.discover(d.initial_state())
    assert names(found) == ["f2.json"] and state.marker.endswith("f2.json")
    touch(f"{root}/f1.json", 1010)  # a name before the marker
    touch(f"{root}/f3.json", 1010)
    clock[0] = 1020
    found, state = d.discover(state)
    assert names(found) == ["f3.json"]  # not f1: only names after the marker
    clock[0] = 1061
    found, state = d.discover(state)  # the backfill
    assert names(found) == ["f1.json"]
    clock[0] = 1200
    found, state = d.discover(state)  # the next backfill does not hand it out again
    assert found == []


def test_lexical_mode_keeps_a_flat_state_however_many_files_were_read(tmp_path) -> None:
    root, clock = str(tmp_path), [10_000.0]
    for i in range(500):
        touch(f"{root}/f{i:05d}.json", 5_000)
    d = discovery(root, clock, discovery_mode="lexical", backfill_interval_s=60,
                  max_clock_skew_s=5)
    found, state = d.discover(d.initial_state())
    assert len(names(found)) == 500
    assert d.size_of(state) == 1  # the marker only: every file is older than the listing
    touch(f"{root}/f99999.json", 10_030)
    clock[0] = 10_100
    found, state = d.discover(state)  # a backfill, then the new name
    # older than this backfill, so not kept: the next backfill looks only at newer files
    assert names(found) == ["f99999.json"] and d.size_of(state) == 1


def test_lexical_mode_does_not_descend_into_directories_wholly_before_the_marker(
        tmp_path, monkeypatch) -> None:
    root, clock = str(tmp_path), [1000.0]
    for day in ("2026-11-22", "2026-11-23"):
        touch(f"{root}/date={day}/part-0.json", 900)
    d = discovery(root, clock, discovery_mode="lexical", recursive=True)
    found, state = d.discover(d.initial_state())
    assert [os.path.relpath(s.path, root) for s in found] == [
        "date=2026-11-22/part-0.json", "date=2026-11-23/part-0.json"]
    touch(f"{root}/date=2026-11-24/part-0.json", 1001)
    scanned: list[str] = []
    real = os.scandir

    def spy(path):
        scanned.append(os.path.relpath(path, root))
        return real(path)

    monkeypatch.setattr(os, "scandir", spy)
    found, _ = d.discover(state)
    assert [os.path.relpath(s.path, root) for s in found] == ["date=2026-11-24/part-0.json"]
    assert "date=2026-11-22" not in scanned and "date=2026-11-24" in scanned


def test_without_recursive_lookup_subdirectories_are_not_read(tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    touch(f"{root}/top.json", 900)
    touch(f"{root}/sub/inner.json", 900)
    d = discovery(root, clock)
    assert names(d.discover(d.initial_state())[0]) == ["top.json"]


def test_a_cycle_takes_at_most_max_files_per_discovery_and_the_next_one_continues(tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    for i in range(5):
        touch(f"{root}/f{i}.json", 900 + i)
    for mode in ("listing", "lexical"):
        d = discovery(root, clock, discovery_mode=mode, max_files_per_discovery=3)
        first, state = d.discover(d.initial_state())
        second, _ = d.discover(state)
        assert names(first) + names(second) == [f"f{i}.json" for i in range(5)], mode


@pytest.mark.parametrize("mode", ["listing", "lexical"])
def test_a_bounded_source_s_one_listing_takes_every_file_whatever_max_files_per_discovery(
        tmp_path, mode) -> None:
    # issue 24 item 2a: a bounded source lists once, so a cap would leave files unread
    root, clock = str(tmp_path), [1000.0]
    for i in range(7):
        touch(f"{root}/f{i}.json", 900 + i)
    d = discovery(root, clock, discovery_mode=mode, max_files_per_discovery=3, bounded=True)
    found, _ = d.discover(d.initial_state())
    assert names(found) == [f"f{i}.json" for i in range(7)]


def test_a_continuous_source_s_capped_cycle_says_how_many_files_wait(tmp_path, caplog) -> None:
    root, clock = str(tmp_path), [1000.0]
    for i in range(5):
        touch(f"{root}/f{i}.json", 900 + i)
    d = discovery(root, clock, max_files_per_discovery=3)
    with caplog.at_level("INFO", logger="sparkcoord.sources"):
        first, _ = d.discover(d.initial_state())
    assert len(first) == 3
    assert "took 3 new files (maxFilesPerDiscovery); 2 more wait" in caplog.text


def test_the_lexical_backfill_reports_a_file_that_changed_after_discovery(tmp_path) -> None:
    root, clock = str(tmp_path), [1000.0]
    touch(f"{root}/f1.json", 999)
    d = discovery(root, clock, discovery_mode="lexical", backfill_interval_s=60,
                  max_clock_skew_s=5)
    _, state = d.discover(d.initial_state())
    touch(f"{root}/f1.json", 1002, body=b'{"id": 1}\n{"id": 2}\n')
    clock[0] = 1100
    found, state = d.discover(state)
    assert found == [] and state.changed == 1 and state.changed_paths[-1].endswith("f1.json")


def test_an_unknown_discovery_mode_is_refused_naming_the_choices(tmp_path) -> None:
    with pytest.raises(ValueError, match="discoveryMode 'sorted': use one of listing, lexical"):
        discovery(str(tmp_path), [0.0], discovery_mode="sorted")
