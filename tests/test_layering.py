"""The dependency rules: the core is sans-IO, and dependencies point inward."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "sparkcoord"

# layer -> sparkcoord packages it may import (besides itself)
ALLOWED_INTERNAL = {
    "core": set(),
    "coordinator": {"core"},
    "operator": {"core"},
    "runtime": {"core", "coordinator"},
    # the reader test base (testing/readers.py) drives the split framework's readers
    "testing": {"core", "coordinator", "operator", "runtime", "sources"},
    "channel": {"core"},
    "spark": {"core", "coordinator", "operator", "runtime", "channel"},
    "committer": {"core"},
    "sources": {"core", "coordinator", "operator", "runtime", "channel", "spark", "committer"},
    "inspection": {"core", "runtime", "spark"},
    "sinks": {"core", "coordinator", "operator", "runtime", "channel", "spark", "committer"},
    # the examples a user copies, on the public layers
    "examples": {"core", "coordinator", "operator", "runtime", "sources"},
    # the entry points, outermost: the command line and its demos (nothing imports them)
    "demo": {"core", "runtime", "spark", "examples"},
    "demo_pipeline": {"core", "runtime", "spark", "sources", "sinks", "testing", "demo"},
    "cli": {"core", "spark", "inspection", "sources", "demo", "demo_pipeline"},
}
#: the package's own ``__init__`` loads its public names lazily (core/lazy.py)
ROOT_MODULES = {"__init__.py", "py.typed"}
ENTRY_POINTS = ("cli", "demo", "demo_pipeline")
#: the split framework of sources/ (what any source is built on): it knows no file source and
#: no Spark (a source reaches Spark through the adapter, in its own builder module)
SOURCE_FRAMEWORK = ("splits", "reader", "enumerator", "discovering", "handout", "state",
                    "aligning", "assigners", "alignment", "backlog", "values")
#: the file source: the package sources/files/ (options, listing, discovery, split, reading,
#: metadata, schema, the text parser, the seen files, its builder and its command), and the
#: paths its modules had before they moved into it (each the same module: MOVED_TO_FILES)
FILE_SOURCE = ("files", "stream", "parsing", "seen", "tail")
MOVED_TO_FILES = ("stream", "parsing", "seen", "tail")
#: the file source's modules that reach Spark's adapter (sparkcoord.spark): the builder, and the
#: ``sparkcoord tail`` command that runs a job with it
FILE_SOURCE_TO_SPARK = ("stream", "tail")
FORBIDDEN_IN_CORE = {"pyspark", "socket", "threading", "asyncio", "time", "concurrent",
                     "os", "fsspec", "selectors", "subprocess", "multiprocessing", "signal",
                     "pathlib", "io", "random", "datetime", "_thread", "queue", "logging"}


def imported_modules(path: pathlib.Path, nested: bool = True) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (``nested``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree) if nested else tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def layer_of(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem != "__init__" else "root"


def modules_of(layer: str) -> list[pathlib.Path]:
    target = PACKAGE / layer
    return sorted(target.rglob("*.py")) if target.is_dir() else [PACKAGE / f"{layer}.py"]


@pytest.mark.parametrize("path", modules_of("core"), ids=lambda p: p.name)
def test_core_modules_import_no_io_threads_clock_or_spark(path: pathlib.Path) -> None:
    bad = {m for m in imported_modules(path) if m.split(".")[0] in FORBIDDEN_IN_CORE}
    assert not bad, f"{path.name} imports {sorted(bad)}; the core must stay sans-IO"


@pytest.mark.parametrize("layer", sorted(ALLOWED_INTERNAL))
def test_dependencies_point_inward(layer: str) -> None:
    for path in modules_of(layer):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] != "sparkcoord" or len(parts) < 2:
                continue
            target = parts[1]
            if target == layer:
                continue
            assert target in ALLOWED_INTERNAL[layer], (
                f"{path.relative_to(PACKAGE)} (layer {layer}) imports {module}")


def test_the_checker_sees_imports_in_a_module() -> None:
    # guard against a checker that silently finds nothing
    assert "sparkcoord.core.errors" in imported_modules(PACKAGE / "core" / "valve.py")
    assert "pickle" in imported_modules(PACKAGE / "core" / "codec.py")


@pytest.mark.parametrize("name", SOURCE_FRAMEWORK)
def test_the_split_framework_imports_no_file_source_and_no_spark(name: str) -> None:
    path = PACKAGE / "sources" / f"{name}.py"
    for module in imported_modules(path, nested=True):
        parts = module.split(".")
        assert parts[0] != "pyspark", f"sources/{name}.py imports {module}"
        assert parts[:2] != ["sparkcoord", "spark"], f"sources/{name}.py imports {module}"
        assert not (parts[:2] == ["sparkcoord", "sources"] and len(parts) > 2
                    and parts[2] in FILE_SOURCE), f"sources/{name}.py imports {module}"


def file_source_modules() -> list[pathlib.Path]:
    return sorted((PACKAGE / "sources" / "files").rglob("*.py"))


@pytest.mark.parametrize("path", file_source_modules(),
                         ids=lambda p: str(p.relative_to(PACKAGE / "sources")))
def test_the_file_source_reaches_spark_only_through_its_builder(path: pathlib.Path) -> None:
    if path.parent.name == "files" and path.stem in FILE_SOURCE_TO_SPARK:
        return
    for module in imported_modules(path, nested=True):
        assert module.split(".")[:2] != ["sparkcoord", "spark"], (
            f"{path.relative_to(PACKAGE)} imports {module}; the file source reaches Spark "
            f"through its builder sources/files/stream.py")


@pytest.mark.parametrize("path", sorted((PACKAGE / "sources" / "files").rglob("*.py")),
                         ids=lambda p: p.name)
def test_the_file_source_package_imports_no_pyspark_at_its_top(path: pathlib.Path) -> None:
    # its modules run in Spark's source runner and Python workers too; Spark's types are
    # imported inside the functions that need them (the metadata column, the Arrow schema)
    bad = {m for m in imported_modules(path, nested=False) if m.split(".")[0] == "pyspark"}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)} at its top"


def test_the_file_source_checks_see_the_package() -> None:
    # guard against a glob that silently finds nothing
    names = {p.name for p in file_source_modules()}
    assert {"discovery.py", "reading.py", "options.py", "parsing.py", "stream.py"} <= names
    assert "sparkcoord.sources.files.options" in imported_modules(
        PACKAGE / "sources" / "files" / "stream.py")


@pytest.mark.parametrize("name", MOVED_TO_FILES)
def test_a_file_source_module_s_old_path_is_the_same_module(name: str) -> None:
    # issue 44 item 2: the file source lives in sources/files/; imports and pickles of the
    # old paths keep working, and nothing can hold a twin of the module
    import importlib

    assert (importlib.import_module(f"sparkcoord.sources.{name}")
            is importlib.import_module(f"sparkcoord.sources.files.{name}"))
    assert {"importlib", "sys"} == imported_modules(PACKAGE / "sources" / f"{name}.py")


#: the lake sinks reach Spark only through their builder (sinks/stream.py), which imports
#: pyspark inside its functions only (the package runs in Spark's tasks and source runner)
SINKS = PACKAGE / "sinks"
SINKS_TO_SPARK = ("stream",)
#: the PostgreSQL source reaches Spark only through its builder (sources/postgres/stream.py)
#: and its command (command.py), which import pyspark inside their functions only (the
#: package runs in Spark's processes too)
POSTGRES_SOURCE = PACKAGE / "sources" / "postgres"
POSTGRES_TO_SPARK = ("stream", "command")


def no_spark_modules() -> list[pathlib.Path]:
    return sorted([*(p for p in SINKS.rglob("*.py") if p.stem not in SINKS_TO_SPARK),
                   *(p for p in POSTGRES_SOURCE.rglob("*.py")
                     if p.stem not in POSTGRES_TO_SPARK)])


@pytest.mark.parametrize("path", no_spark_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_postgres_source_and_the_lake_sinks_import_no_spark_and_no_file_source(
        path: pathlib.Path) -> None:
    for module in imported_modules(path, nested=True):
        parts = module.split(".")
        assert parts[0] != "pyspark", f"{path.relative_to(PACKAGE)} imports {module}"
        assert parts[:2] != ["sparkcoord", "spark"], f"{path.relative_to(PACKAGE)} imports {module}"
        assert not (parts[:2] == ["sparkcoord", "sources"] and len(parts) > 2
                    and parts[2] in FILE_SOURCE), f"{path.relative_to(PACKAGE)} imports {module}"


@pytest.mark.parametrize("name", SINKS_TO_SPARK)
def test_the_sink_builder_imports_pyspark_only_inside_functions_and_no_source(name: str) -> None:
    path = SINKS / f"{name}.py"
    top = {m for m in imported_modules(path, nested=False) if m.split(".")[0] == "pyspark"}
    assert not top, f"sinks/{name}.py imports {sorted(top)} at its top"
    for module in imported_modules(path, nested=True):
        assert not module.startswith("sparkcoord.sources"), f"sinks/{name}.py imports {module}"


@pytest.mark.parametrize("name", POSTGRES_TO_SPARK)
def test_the_postgres_builder_imports_pyspark_only_inside_functions_and_no_file_source(
        name: str) -> None:
    path = POSTGRES_SOURCE / f"{name}.py"
    top = {m for m in imported_modules(path, nested=False) if m.split(".")[0] == "pyspark"}
    assert not top, f"sources/postgres/{name}.py imports {sorted(top)} at its top"
    for module in imported_modules(path, nested=True):
        parts = module.split(".")
        assert not (parts[:2] == ["sparkcoord", "sources"] and len(parts) > 2
                    and parts[2] in FILE_SOURCE), f"sources/postgres/{name}.py imports {module}"


#: what the PostgreSQL source's sans-IO core (sources/postgres/core/) never imports: I/O,
#: threads, clocks, the source's I/O package and the runtime around it
FORBIDDEN_IN_POSTGRES_CORE = {"pyspark", "psycopg", "socket", "threading", "asyncio", "time",
                              "os", "subprocess", "select", "selectors", "signal", "queue",
                              "logging", "fsspec"}
POSTGRES_MOVED = {"core": ("pgoutput", "values", "names", "chunks", "watermarks", "splits"),
                  "io": ("connection", "replication", "catalog")}


@pytest.mark.parametrize("path", sorted((POSTGRES_SOURCE / "core").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_postgres_source_s_core_does_no_io(path: pathlib.Path) -> None:
    for module in imported_modules(path, nested=True):
        parts = module.split(".")
        if path.name == "values.py" and parts[0] == "psycopg":
            continue  # psycopg's text[] parser (a pure function of text; no connection)
        assert parts[0] not in FORBIDDEN_IN_POSTGRES_CORE, (
            f"sources/postgres/core/{path.name} imports {module}")
        assert parts[:2] != ["sparkcoord", "runtime"] and parts[:2] != ["sparkcoord", "spark"]
        assert parts[:4] != ["sparkcoord", "sources", "postgres", "io"], (
            f"sources/postgres/core/{path.name} imports {module}: the core does no I/O")
        assert not (parts[:3] == ["sparkcoord", "sources", "postgres"] and len(parts) == 4
                    and parts[3] not in ("core", "errors")), (
            f"sources/postgres/core/{path.name} imports {module}, outside the core")


@pytest.mark.parametrize("package,name", [(k, n) for k, v in POSTGRES_MOVED.items() for n in v])
def test_a_postgres_module_s_old_path_is_the_same_module(package: str, name: str) -> None:
    import importlib

    assert (importlib.import_module(f"sparkcoord.sources.postgres.{name}")
            is importlib.import_module(f"sparkcoord.sources.postgres.{package}.{name}"))
    assert {"importlib", "sys"} == imported_modules(POSTGRES_SOURCE / f"{name}.py")


#: the PostgreSQL reader's and the slot module's parts (docs/decisions/104-postgres-modules.md):
#: every name the two modules defined stays importable from them, as the object of its new home
#: ((old module, new module) -> {name in the old module: name in the new})
POSTGRES_SPLIT_NAMES = {
    ("reader", "core.output"): {"arrow_schema": "arrow_schema", "record_batch": "record_batch",
                                "_key_dict": "_key_dict", "_array": "_array",
                                "_read_batch": "snapshot_batch"},
    ("reader", "core.decoding"): {n: n for n in ("RowDecoder", "decode_transaction", "_old_image")},
    ("reader", "io.key_order"): {n: n for n in ("KeyOrder", "INTEGER_KEYS", "_TEXT_CASTS")},
    ("reader", "io.waits"): {n: n for n in ("slot_in_use", "while_slot_busy", "wait_for_flush")},
    ("reader", "io.chunk_read"): {n: n for n in ("ChunkRead", "read_chunk_watermarked",
                                                 "ALL_KEYS", "_touched_keys", "_copy_texts")},
    ("reader", "io.stream_read"): {n: n for n in ("StreamRead", "read_stream")},
    ("reader", "io.reader_config"): {"ReaderConfig": "ReaderConfig"},
    ("io.replication", "io.set_up"): {
        **{n: n for n in ("PLUGIN", "RoleRights", "SlotInfo", "role_rights", "slot_info",
                          "ensure_slot", "drop_slot", "published_tables", "ensure_publication",
                          "_lsn", "_need_replication", "_check_slot", "_rights_error")},
        "_one": "one_row"},
    ("io.replication", "io.slot_watch"): {
        n: n for n in ("SLOT_WAIT_WARN_S", "QUERY_SHOWN", "Backend", "shown_query",
                       "slot_creation_blockers", "slot_wait_text", "SlotCreationWatch",
                       "_AFTER_PASSWORD")},
}


@pytest.mark.parametrize("old,new", sorted(POSTGRES_SPLIT_NAMES), ids="->".join)
def test_a_name_the_postgres_reader_or_slot_module_had_is_importable_from_it(
        old: str, new: str) -> None:
    import importlib

    before = importlib.import_module(f"sparkcoord.sources.postgres.{old}")
    home = importlib.import_module(f"sparkcoord.sources.postgres.{new}")
    for name, there in POSTGRES_SPLIT_NAMES[old, new].items():
        assert getattr(before, name) is getattr(home, there), f"{old}.{name}"


def test_the_postgres_reader_s_reads_import_no_psycopg_at_their_top() -> None:
    # the reader is imported where the builder runs; psycopg comes with the read, lazily
    # (sources/postgres/__init__.py), as before the reader's reads moved to io/
    for name in ("reader", "io/chunk_read", "io/stream_read", "io/key_order", "io/waits",
                 "io/reader_config", "core/decoding", "core/rows", "core/output"):
        top = imported_modules(POSTGRES_SOURCE / f"{name}.py", nested=False)
        assert not {m for m in top if m.split(".")[0] == "psycopg"}, name
        assert "sparkcoord.sources.postgres.io.replication" not in top, name


#: the channel server's parts (docs/decisions/100-channel-server-split.md): dispatch hands the
#: decoded frames to the service and does no socket I/O of its own (it writes through a
#: connection's writer); the names the server module had stay importable from it, as the
#: objects of their new homes (module -> {name in channel/server.py: name there})
NO_SOCKET_IO = {"socket", "socketserver", "select", "selectors"}
CHANNEL_SERVER_NAMES = {
    "dispatch": {"InboundHandler": "InboundHandler", "DeliveryHandler": "DeliveryHandler",
                 "_VERDICTS": "VERDICTS", "_no_hold": "no_hold", "_response": "response",
                 "_add_range": "add_range"},
    "admission": {"_Throttle": "Throttle", "_peer": "peer_of"},
    "connection": {"_Connection": "Connection", "_Writer": "Writer"},
}


def test_the_channel_dispatch_does_no_socket_io() -> None:
    path = PACKAGE / "channel" / "dispatch.py"
    bad = {m for m in imported_modules(path) if m.split(".")[0] in NO_SOCKET_IO}
    assert not bad, f"channel/dispatch.py imports {sorted(bad)}: dispatch does no socket I/O"
    assert "sparkcoord.channel.connection" in imported_modules(path)  # the checker sees it


@pytest.mark.parametrize("module", sorted(CHANNEL_SERVER_NAMES))
def test_a_name_the_channel_server_had_is_importable_from_it(module: str) -> None:
    import importlib

    server = importlib.import_module("sparkcoord.channel.server")
    home = importlib.import_module(f"sparkcoord.channel.{module}")
    for old, new in CHANNEL_SERVER_NAMES[module].items():
        assert getattr(server, old) is getattr(home, new), f"channel.server.{old}"


#: names that moved out of a module and stay importable from it, as the objects of their new
#: homes (docs/decisions/107-file-reading-and-sink-modules.md): old module -> new module ->
#: {name in the old module: name in the new}
ROWS_NAMES = ("READ", "CREATE", "UPDATE", "DELETE", "TRUNCATE", "Key", "RowValues", "Unchanged",
              "UNCHANGED", "RowChange", "TxChanges", "OutRow", "Visibility")
MOVED_NAMES = {
    "sources.files.reading": {
        "sources.files.lines": {n: n for n in ("line_range", "read_line_range", "lines_before")},
        "sources.files.packed": {"MemberFetcher": "MemberFetcher", "_BLANK_LINE": "BLANK_LINE",
                                 "_record_count": "record_count",
                                 "_joined_tables": "joined_tables", "_cumulative": "cumulative"}},
    "sinks.coordinator": {
        "sinks.committing": {"FilesMissing": "FilesMissing", "ValueOutOfRange": "ValueOutOfRange",
                             "_written_paths": "written_paths", "_epoch_of": "epoch_of"}},
    "sources.postgres.core.watermarks": {
        "sources.postgres.core.rows": {**{n: n for n in ROWS_NAMES}, "_precedes": "precedes"}},
}


@pytest.mark.parametrize("old", sorted(MOVED_NAMES))
def test_a_name_that_moved_out_of_a_module_is_importable_from_it(old: str) -> None:
    import importlib

    module = importlib.import_module(f"sparkcoord.{old}")
    for new, names in MOVED_NAMES[old].items():
        home = importlib.import_module(f"sparkcoord.{new}")
        for old_name, new_name in names.items():
            assert getattr(module, old_name) is getattr(home, new_name), f"{old}.{old_name}"


def test_the_sink_coordinator_s_errors_keep_their_name_and_its_commit_path_its_place() -> None:
    # a failed job's text names a permanent error by its qualified name (runtime/holder.py),
    # and tests override the commit worker's methods on the coordinator's class
    from sparkcoord.sinks import committing, coordinator

    for error in (committing.FilesMissing, committing.ValueOutOfRange):
        assert error.__module__ == "sparkcoord.sinks.coordinator", error
    assert issubclass(coordinator.SinkCoordinator, committing.EpochCommits)
    for name in ("_open", "_commit", "_sweep", "_check_files_present"):
        assert getattr(coordinator.SinkCoordinator, name) is getattr(committing.EpochCommits,
                                                                      name)
    assert "sparkcoord.sinks.committing" in imported_modules(SINKS / "coordinator.py")
    assert "sparkcoord.sinks.coordinator" not in imported_modules(SINKS / "committing.py")

#: the holder's and the service's parts (docs/decisions/105-runtime-modules.md): every name the
#: two modules had stays importable from them, as the object of its new home
#: (old module -> new module -> {name in the old module: name in the new one})
RUNTIME_NAMES = {
    "holder": {
        "holder_context": {"CoordinatorFenced": "CoordinatorFenced", "_Context": "Context",
                           "_Gateway": "Gateway", "_Periodic": "Periodic", "_name_of": "name_of",
                           "user_traceback": "user_traceback", "_failed": "_failed",
                           "_dumps": "_dumps", "_PROTOCOL": "_PROTOCOL"},
        "holder_checkpoints": {"HolderListener": "HolderListener"},
    },
    "service": {
        "service_checkpoints": {"CLIENTS_KEY": "CLIENTS_KEY", "PreparedCheckpoint":
                                "PreparedCheckpoint", "CheckpointDeclined": "CheckpointDeclined"},
        "service_restore": {"CoordinatorSpec": "CoordinatorSpec", "MailboxFactory":
                            "MailboxFactory", "restore_line": "restore_line",
                            "_counted": "_counted"},
    },
}


@pytest.mark.parametrize("old,new", [(o, n) for o, v in RUNTIME_NAMES.items() for n in v])
def test_a_name_the_holder_or_the_service_had_is_importable_from_it(old: str, new: str) -> None:
    import importlib

    module = importlib.import_module(f"sparkcoord.runtime.{old}")
    home = importlib.import_module(f"sparkcoord.runtime.{new}")
    for name, there in RUNTIME_NAMES[old][new].items():
        assert getattr(module, name) is getattr(home, there), f"runtime.{old}.{name}"
        if isinstance(getattr(home, there), type) and issubclass(getattr(home, there), Exception):
            # an error line and a pickled error read as before the move
            assert getattr(home, there).__module__ == module.__name__, f"runtime.{old}.{name}"

#: the enumerators' parts (docs/decisions/108-enumerator-modules.md): the names their modules
#: had stay importable from them, as the objects of their new homes (old module -> {name: home})
ENUMERATOR_NAMES = {
    "sparkcoord.sources.enumerator": {
        "SplitDiscovery": "sparkcoord.sources.discovering",
        "EnumeratorState": "sparkcoord.sources.state"},
    "sparkcoord.sources.postgres.enumerator": {
        **dict.fromkeys(("CdcEnumeratorState", "PlanningState", "ChunkPlanning", "INITIAL",
                         "LATEST", "STARTUP_MODES"), "sparkcoord.sources.postgres.planning"),
        "SLOT": "sparkcoord.sources.postgres.streaming"},
}


@pytest.mark.parametrize("old", sorted(ENUMERATOR_NAMES))
def test_a_name_an_enumerator_module_had_is_importable_from_it(old: str) -> None:
    import importlib

    module = importlib.import_module(old)
    for name, home in ENUMERATOR_NAMES[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), (
            f"{old}.{name}")


def test_the_no_spark_checks_see_the_postgres_source_and_the_sinks() -> None:
    # guard against a glob that silently finds nothing
    names = {p.name for p in no_spark_modules()}
    assert {"pgoutput.py", "watermarks.py", "enumerator.py", "delta.py", "iceberg.py",
            "coordinator.py", "task.py"} <= names
    assert "stream.py" not in names
    assert "sparkcoord.spark.spec" in imported_modules(POSTGRES_SOURCE / "stream.py")


#: the lake sink's table formats (sinks/formats/, decision 101): a package per format, and
#: what a format may import of the sink (the modules below the formats; its own package)
FORMATS = SINKS / "formats"
BELOW_FORMATS = ("changes", "fencing", "files", "mergefiles", "mergefold", "tables")
#: the modules that moved into sinks/formats/, by their old path (each an alias of the module)
MOVED_TO_FORMATS = {"delta": "formats.delta.commit", "iceberg": "formats.iceberg.commit",
                    "icebergmerge": "formats.iceberg.rewrite"}
#: in a format, which of its modules each may import (formats/__init__.py rule 3)
WITHIN_A_FORMAT = {"commit": {"merge", "actions", "names", "rewrite"},
                   "merge": {"actions", "names", "rewrite"},
                   "actions": set(), "names": set(), "rewrite": set()}


def format_modules() -> list[pathlib.Path]:
    return sorted(p for p in FORMATS.rglob("*.py") if p.stem != "__init__")


def imported_sparkcoord_modules(path: pathlib.Path) -> set[str]:
    """:func:`imported_modules`, with ``from package import module`` as the module."""
    names = set(imported_modules(path))
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = PACKAGE.parent.joinpath(*node.module.split("."))
            names.update(f"{node.module}.{a.name}" for a in node.names
                         if (base / f"{a.name}.py").is_file() or (base / a.name).is_dir())
            if base.is_dir() and all((base / f"{a.name}.py").is_file() for a in node.names):
                names.discard(node.module)
    return names


@pytest.mark.parametrize("path", format_modules(), ids=lambda p: str(p.relative_to(FORMATS)))
def test_a_format_imports_of_the_sink_only_what_lies_below_the_formats(
        path: pathlib.Path) -> None:
    # formats/__init__.py rules 1 and 3: no other format, nothing of the sink above the formats
    # (the coordinator, the target that picks a format, the builder), so no circle can form
    own = path.parent.name
    assert path.stem in WITHIN_A_FORMAT, (
        f"formats/{own}/{path.name}: add it to WITHIN_A_FORMAT (and docs/layout.md)")
    for module in imported_sparkcoord_modules(path):
        parts = module.split(".")
        if parts[:2] != ["sparkcoord", "sinks"]:
            continue
        where = f"sinks/formats/{own}/{path.name} imports {module}"
        if parts[2:3] == ["formats"]:
            assert parts[3:4] == [own], f"{where}: a format imports no other format"
            assert len(parts) == 5 and parts[4] in WITHIN_A_FORMAT[path.stem], (
                f"{where}: in a format, {path.stem}.py imports only "
                f"{sorted(WITHIN_A_FORMAT[path.stem])} (formats/__init__.py rule 3)")
        else:
            assert len(parts) == 3 and parts[2] in BELOW_FORMATS, (
                f"{where}: a format imports of the sink only {BELOW_FORMATS}")


@pytest.mark.parametrize("path", sorted(FORMATS.rglob("__init__.py")),
                         ids=lambda p: str(p.relative_to(FORMATS)))
def test_the_format_packages_import_nothing(path: pathlib.Path) -> None:
    # formats/__init__.py rule 2: a format's library is loaded only with its committer
    assert imported_modules(path) == set(), f"{path.relative_to(PACKAGE)} imports something"


@pytest.mark.parametrize("path", sorted(p for p in SINKS.rglob("*.py")
                                        if FORMATS not in p.parents),
                         ids=lambda p: str(p.relative_to(SINKS)))
def test_of_the_sink_only_the_target_imports_a_format(path: pathlib.Path) -> None:
    # formats/__init__.py rule 1: the target picks a format; the modules below the formats
    # (and the coordinator, which is handed a committer) know none
    if path.name == "target.py":
        return
    for module in imported_sparkcoord_modules(path):
        assert not module.startswith("sparkcoord.sinks.formats"), (
            f"sinks/{path.relative_to(SINKS)} imports {module}; only target.py picks a format")


@pytest.mark.parametrize("old", sorted(MOVED_TO_FORMATS))
def test_a_format_module_s_old_path_is_the_same_module(old: str) -> None:
    # issue 44 item 3: imports, monkeypatches and pickles of the old paths reach the moved
    # module itself, never a twin
    import importlib

    assert (importlib.import_module(f"sparkcoord.sinks.{old}")
            is importlib.import_module(f"sparkcoord.sinks.{MOVED_TO_FORMATS[old]}"))
    assert {"importlib", "sys"} == imported_modules(SINKS / f"{old}.py")


def test_the_format_checks_see_the_formats() -> None:
    # guard against a glob that silently finds nothing
    names = {str(p.relative_to(FORMATS)) for p in format_modules()}
    assert {"delta/commit.py", "delta/merge.py", "iceberg/commit.py", "iceberg/merge.py",
            "iceberg/rewrite.py"} <= names
    assert "sparkcoord.sinks.formats.delta.merge" in imported_modules(FORMATS / "delta" /
                                                                      "commit.py")
    assert "sparkcoord.sinks.formats.iceberg.rewrite" in imported_sparkcoord_modules(
        FORMATS / "iceberg" / "merge.py")
    assert "sparkcoord.sinks.formats.delta.commit" in imported_modules(SINKS / "target.py")
    assert {str(p.relative_to(SINKS)) for p in no_spark_modules() if FORMATS in p.parents} >= {
        "formats/delta/commit.py", "formats/iceberg/commit.py"}


def test_every_package_and_module_of_sparkcoord_has_a_layer_rule() -> None:
    entries = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
               if p.name not in ROOT_MODULES and not p.name.startswith(("_", "."))}
    assert entries <= set(ALLOWED_INTERNAL), (
        f"no layer rule for {sorted(entries - set(ALLOWED_INTERNAL))}: add it to "
        f"ALLOWED_INTERNAL (and docs/layout.md)")


@pytest.mark.parametrize("layer", sorted(set(ALLOWED_INTERNAL) - set(ENTRY_POINTS)))
def test_no_layer_imports_an_entry_point(layer: str) -> None:
    for path in modules_of(layer):
        bad = {m for m in imported_modules(path)
               if m.split(".")[:2] in (["sparkcoord", e] for e in ENTRY_POINTS)}
        assert not bad, f"{path.relative_to(PACKAGE)} imports the entry point(s) {sorted(bad)}"


def module_graph() -> dict[str, set[str]]:
    """sparkcoord module -> the sparkcoord modules it imports (at its top, inside functions
    and under TYPE_CHECKING alike; ``from package import module`` as the module)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in names else node.module)
        graph[module] = {e for e in edges if e in names and e != module}
    return graph


def test_no_import_circle_joins_two_modules() -> None:
    graph = module_graph()
    reach: dict[str, set[str]] = {}

    def reachable(start: str) -> set[str]:
        if start not in reach:
            seen, todo = set(), list(graph[start])
            while todo:
                m = todo.pop()
                if m not in seen:
                    seen.add(m)
                    todo.extend(graph[m])
            reach[start] = seen
        return reach[start]
    circles = sorted({" <-> ".join(sorted((a, b))) for a in graph for b in graph[a]
                      if a in reachable(b)})
    assert not circles, "import circles (each pair imports the other, maybe through " \
        "others):\n" + "\n".join(circles)
