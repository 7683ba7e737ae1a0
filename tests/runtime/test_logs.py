"""sparkcoord's log lines without a logging configuration: one stderr handler in log4j's shape
on the ``sparkcoord`` logger, installed only when the process configured nothing itself."""

from __future__ import annotations

import logging

import pytest

from sparkcoord.runtime import logs


@pytest.fixture
def bare_logging():
    """No handlers on the root and sparkcoord loggers for the test body (pytest adds its own
    to the root when the test starts, so they are removed here, at first use); restored
    afterwards."""
    root, ours = logging.getLogger(), logging.getLogger("sparkcoord")
    saved = (list(root.handlers), list(ours.handlers), ours.level, ours.propagate)

    def clear() -> logging.Logger:
        root.handlers.clear()
        ours.handlers.clear()
        return ours
    yield clear
    root.handlers[:] = saved[0]
    ours.handlers[:] = saved[1]
    ours.setLevel(saved[2])
    ours.propagate = saved[3]


def test_without_a_configuration_info_lines_go_to_stderr_with_level_and_logger_name(
        bare_logging, capsys) -> None:
    bare_logging()
    assert logs.install_log_handler("info") is True
    logging.getLogger("sparkcoord.runtime.service").info("sealed epoch %d", 3)
    logging.getLogger("sparkcoord.runtime.service").debug("not shown")
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert " INFO sparkcoord.runtime.service: sealed epoch 3" in err


def test_a_second_install_changes_only_the_level(bare_logging, capsys) -> None:
    ours = bare_logging()
    logs.install_log_handler("INFO")
    assert logs.install_log_handler("WARNING") is True
    assert len(ours.handlers) == 1
    logging.getLogger("sparkcoord.x").info("hidden now")
    assert capsys.readouterr().err == ""


def test_a_program_that_configured_logging_keeps_its_configuration(bare_logging) -> None:
    ours = bare_logging()
    logging.getLogger().addHandler(logging.NullHandler())
    assert logs.install_log_handler("DEBUG") is False
    assert ours.handlers == [] and ours.propagate


def test_an_unknown_level_is_refused_naming_the_levels() -> None:
    with pytest.raises(ValueError, match="log_level 'loud': use one of DEBUG, INFO"):
        logs.check_level("loud")
