"""Versioned encodings (sparkcoord/core/encoding.py): a class moves, gains a field or a
version, and what an older sparkcoord pickled still reads; a newer checkpoint is named."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from sparkcoord.core import encoding
from sparkcoord.core.encoding import (
    REGISTRY,
    EncodingTooNew,
    encoded,
    loads,
    named_globals,
    same_value,
)


@pytest.fixture
def registry() -> Any:
    """The registry and the moved names as they were, after a test that adds to them."""
    saved, moved = dict(REGISTRY), dict(encoding.MOVED)
    yield
    REGISTRY.clear()
    REGISTRY.update(saved)
    encoding.MOVED.clear()
    encoding.MOVED.update(moved)


@dataclass(frozen=True)
class Plain:
    """As a class was before it was encoded (sparkcoord 0.1.0 pickled it by path)."""

    a: int
    b: str = "b"


@dataclass(frozen=True, slots=True)
class PlainSlots:
    a: int
    b: str = "b"


def test_an_encoded_value_names_its_stable_name_and_not_its_module_path(registry) -> None:
    @encoded("test.Point")
    @dataclass(frozen=True)
    class Point:
        x: int
        y: int = 0

    data = pickle.dumps(Point(1, 2), 5)
    assert named_globals(data) == {"sparkcoord.core.encoding:_decoded"}
    assert b"test.Point" in data and b"test_encoding" not in data
    assert loads(data) == Point(1, 2)


def test_a_pickle_of_the_class_before_it_was_encoded_reads_as_version_1(registry) -> None:
    old, old_slots = pickle.dumps(Plain(7), 5), pickle.dumps(PlainSlots(8, "x"), 5)
    # now the same classes are encoded, as sparkcoord's were after 0.1.0
    encoded("test.Plain")(Plain)
    encoded("test.PlainSlots")(PlainSlots)
    try:
        assert loads(old) == Plain(7)
        assert loads(old_slots) == PlainSlots(8, "x")
        assert named_globals(pickle.dumps(Plain(7), 5)) == {"sparkcoord.core.encoding:_decoded"}
    finally:
        del Plain.__reduce_ex__, Plain.__setstate__
        del PlainSlots.__reduce_ex__, PlainSlots.__setstate__


def test_a_new_version_upgrades_the_fields_of_the_one_before(registry) -> None:
    @encoded("test.Account")
    @dataclass
    class AccountV1:
        cents: int

    v1 = pickle.dumps(AccountV1(250), 5)
    del REGISTRY["test.Account"]  # the class of version 2 replaces it, as a new release would

    @encoded("test.Account", version=2, first_fields=("cents",),
             upgrades={1: lambda f: {"amount": f["cents"] / 100}})
    @dataclass
    class Account:
        amount: float
        currency: str = "EUR"

    assert loads(v1) == Account(2.5, "EUR")
    with pytest.raises(ValueError, match="no upgrade from version"):
        encoded("test.Other", version=3, upgrades={1: dict}, first_fields=("a",))


def test_a_class_moved_after_a_release_is_found_by_its_old_path(registry) -> None:
    old = pickle.dumps(Plain(3), 5)
    assert "tests.core.test_encoding:Plain" in named_globals(old)
    moved = old.replace(b"tests.core.test_encoding", b"tests.core.gone_encoding")
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(moved)
    encoding.MOVED["tests.core.gone_encoding:Plain"] = "tests.core.test_encoding:Plain"
    assert loads(moved) == Plain(3)


def test_a_checkpoint_of_a_newer_sparkcoord_is_refused_by_name(registry) -> None:
    @encoded("test.Later")
    @dataclass
    class Later:
        a: int

    data = pickle.dumps(Later(1), 5)
    with pytest.raises(EncodingTooNew, match="'test.Later' version 2.*newer sparkcoord"):
        loads(data.replace(b"K\x01", b"K\x02", 1))
    del REGISTRY["test.Later"]
    with pytest.raises(EncodingTooNew, match="'test.Later', which this sparkcoord does not"):
        loads(data)


def test_a_field_without_a_default_missing_from_the_checkpoint_is_named(registry) -> None:
    @encoded("test.Pair")
    @dataclass
    class Pair:
        a: int
        b: list[int] = field(default_factory=list)

    assert encoding._decoded("test.Pair", 1, {"a": 1}) == Pair(1, [])
    with pytest.raises(encoding.CorruptRecord, match="no field 'a'"):
        encoding._decoded("test.Pair", 1, {"b": [1]})


def test_a_subclass_of_an_encoded_class_keeps_its_own_fields(registry) -> None:
    @encoded("test.Base")
    @dataclass(frozen=True)
    class Base:
        a: int

    @dataclass(frozen=True)
    class Mine(Base):  # a user's subclass, not encoded: pickled by path as before
        b: str = ""

    globals()["Mine"] = Mine  # picklable by path
    Mine.__qualname__ = "Mine"
    try:
        data = pickle.dumps(Mine(1, "x"), 5)
        assert "sparkcoord.core.encoding:_decoded" not in named_globals(data)
        assert loads(data) == Mine(1, "x")
    finally:
        del globals()["Mine"]


@dataclass(frozen=True, eq=False)
class Progress:
    """A user's event whose ``__eq__`` looks at its id only."""

    id: int
    count: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Progress) and other.id == self.id

    __hash__ = object.__hash__


def test_two_encodings_of_one_value_are_the_same_item_and_different_values_are_not() -> None:
    old, new = pickle.dumps(Plain(1), 4), pickle.dumps(Plain(1), 5)
    assert old != new and same_value(old, new)
    assert same_value(pickle.dumps([float("nan")], 4), pickle.dumps([float("nan")], 5))
    assert not same_value(pickle.dumps(Plain(1), 5), pickle.dumps(Plain(2), 5))
    assert not same_value(b"not a pickle", pickle.dumps(Plain(1), 5))
    # judged by this code's encoding of the values, not by their __eq__
    assert not same_value(pickle.dumps(Progress(1, 5), 4), pickle.dumps(Progress(1, 7), 5))
    assert not same_value(pickle.dumps(1, 4), pickle.dumps(True, 5))


def test_a_fresh_process_decodes_a_library_value_without_importing_its_module_first() -> None:
    import subprocess
    import sys

    from sparkcoord.sinks.coordinator import SinkState
    from sparkcoord.sources.files import FileSplit

    data = pickle.dumps([SinkState(), FileSplit("a#0", 1, "/a", 1, 1.0, start=0, end=1)], 5)
    code = ("import sys; from sparkcoord.core.encoding import loads; "
            "v = loads(sys.stdin.buffer.read()); print(sorted(type(x).__name__ for x in v))")
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "['FileSplit', 'SinkState']"


def test_every_library_encoding_names_the_module_that_registers_it() -> None:
    import importlib

    for name, module in encoding.HOMES.items():
        importlib.import_module(module)
        assert name in REGISTRY, f"{module} does not register {name!r}"
    library = {n for n in REGISTRY if not n.startswith("test.")}
    assert library <= set(encoding.HOMES), f"not in HOMES: {sorted(library - set(encoding.HOMES))}"


def test_a_slots_class_pickled_by_position_reads_by_the_fields_of_version_1(registry) -> None:
    @dataclass(frozen=True, slots=True)
    class File:
        path: str
        rows: int

    globals()["File"] = File
    File.__qualname__ = "File"
    try:
        old = pickle.dumps(File("p", 42), 5)  # 0.1.0: by path, its values by position
        with pytest.raises(ValueError, match="give first_fields"):
            encoded("test.File2", version=2, upgrades={1: dict})

        @encoded("test.File", version=2, first_fields=("path", "rows"),
                 upgrades={1: lambda f: {**f, "format": "parquet"}})
        @dataclass(frozen=True, slots=True)
        class FileV2:  # version 2 adds a field in the middle
            path: str
            format: str
            rows: int

        globals()["File"] = FileV2
        FileV2.__qualname__ = "File"
        assert loads(old) == FileV2("p", "parquet", 42)
    finally:
        del globals()["File"]


def test_every_library_encoding_lists_its_version_and_fields_as_released() -> None:
    """Rule 2: a change to an encoded class's fields adds a version. This list is the
    record of what each version holds; a test failure here means: add a version (and an
    upgrade from the one before), then a line here; never edit a line."""
    import json
    import pathlib

    import sparkcoord.sinks  # noqa: F401 - registers its encodings
    import sparkcoord.sinks.compaction  # noqa: F401
    import sparkcoord.sources  # noqa: F401
    import sparkcoord.sources.alignment  # noqa: F401
    import sparkcoord.sources.postgres  # noqa: F401
    import sparkcoord.sources.postgres.core.chunks  # noqa: F401
    import sparkcoord.sources.postgres.enumerator  # noqa: F401
    import sparkcoord.sources.postgres.reader  # noqa: F401
    import sparkcoord.spark.spec  # noqa: F401

    path = pathlib.Path(__file__).parents[1] / "fixtures" / "encodings.json"
    released = json.loads(path.read_text())
    now = {name: {str(e.version): list(e.field_names())}
           for name, e in REGISTRY.items() if not name.startswith("test.")}
    for name, versions in now.items():
        (version, fields), = versions.items()
        assert name in released, f"{name}: a new encoding; add it to {path}"
        assert released[name].get(version) == fields, (
            f"{name} version {version}: its fields are {fields}, released as "
            f"{released[name].get(version)}: add a version with an upgrade (rule 2)")
    assert set(released) <= set(now), f"encodings gone: {sorted(set(released) - set(now))}"
