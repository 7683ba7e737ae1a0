"""The file source's checkpointed classes read the bytes sparkcoord wrote before the file
source became a package (issue 26 item 2), when a pickle named a class by its module: these
bytes are in checkpoints (reader and enumerator state, backlog chunks named by their hash) and
in the request log, whose re-sent items count as the same when they decode to the same value
(core/encoding.py rules 4 and 6). The hex below was written by ``sparkcoord/sources/files.py``
(the single module), with pickle protocol 5; what the code writes now names the classes by
their encoding (rule 1)."""

from __future__ import annotations

import pickle

from sparkcoord.core.encoding import loads, named_globals, same_value
from sparkcoord.sources.files.discovery import FileDiscoveryState
from sparkcoord.sources.files.split import PICKLED_MODULE, FileSplit

SPLIT = bytes.fromhex(
    "800595a5000000000000008c18737061726b636f6f72642e736f75726365732e66696c6573948c0946696c65"
    "53706c69749493942981947d94288c0873706c69745f6964948c0b2f642f612e6a736f6e2330948c047369"
    "7a65944b0a8c0470617468948c092f642f612e6a736f6e948c0966696c655f73697a65944b0a8c056d7469"
    "6d6594473ff80000000000008c09726f775f67726f7570944e8c057374617274944b008c03656e64944b0a"
    "75622e")
PACKED = bytes.fromhex(
    "800595e6000000000000008c18737061726b636f6f72642e736f75726365732e66696c6573948c0946696c65"
    "53706c69749493942981947d94288c0873706c69745f6964948c0e2f642f612e6a736f6e237061636b948c"
    "0473697a65944b1e8c0470617468948c092f642f612e6a736f6e948c0966696c655f73697a65944b0a8c05"
    "6d74696d6594473ff80000000000008c09726f775f67726f7570944e8c057374617274944b008c03656e64"
    "944b008c046c616e65948c022f64948c0566696c65739468094b0a473ff800000000000087948c092f642f"
    "622e6a736f6e944b144740040000000000008794869475622e")
STATE = bytes.fromhex(
    "800595e4000000000000008c18737061726b636f6f72642e736f75726365732e66696c6573948c1246696c65"
    "446973636f7665727953746174659493942981947d94288c066d61726b6572948c092f642f622e6a736f6e"
    "948c06726563656e74948c17737061726b636f6f72642e736f75726365732e7365656e948c095365656e46"
    "696c65739493942981947d94288c066368756e6b73945d948c047461696c947d9475628c066e6577657374"
    "944740040000000000008c0b6261636b66696c6c5f6174944740080000000000008c076368616e67656494"
    "4b008c0d6368616e6765645f7061746873945d9475622e")


def test_file_splits_load_from_the_bytes_of_the_single_module_as_the_same_items() -> None:
    split = FileSplit("/d/a.json#0", 10, "/d/a.json", 10, 1.5, start=0, end=10)
    packed = FileSplit("/d/a.json#pack", 30, "/d/a.json", 10, 1.5, lane="/d",
                       files=(("/d/a.json", 10, 1.5), ("/d/b.json", 20, 2.5)))
    assert loads(SPLIT) == split and loads(PACKED) == packed
    for old, value in ((SPLIT, split), (PACKED, packed)):
        now = pickle.dumps(value, protocol=5)
        assert now != old and same_value(old, now)
        assert named_globals(now) == {"sparkcoord.core.encoding:_decoded"}


def test_the_discovery_state_loads_from_the_bytes_of_the_single_module() -> None:
    state = FileDiscoveryState(marker="/d/b.json", newest=2.5, backfill_at=3.0)
    assert "sparkcoord.sources.files:FileDiscoveryState" not in named_globals(
        pickle.dumps(state, protocol=5))
    loaded = loads(STATE)
    assert isinstance(loaded, FileDiscoveryState)
    assert (loaded.marker, loaded.newest, loaded.backfill_at, len(loaded.recent)) == (
        "/d/b.json", 2.5, 3.0, 0)


def test_the_checkpointed_classes_are_named_by_the_package_that_exports_them() -> None:
    import sparkcoord.sources.files as package

    assert PICKLED_MODULE == package.__name__ == "sparkcoord.sources.files"
    for cls in (FileSplit, FileDiscoveryState):
        assert cls.__module__ == PICKLED_MODULE and getattr(package, cls.__name__) is cls
