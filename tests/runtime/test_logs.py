"""sparkcoord's log lines without a logging configuration: one stderr handler in log4j's shape
on the ``sparkcoord`` logger, standing aside whenever the process configured logging itself."""

from __future__ import annotations

import logging

import pytest

from sparkcoord.runtime import logs


@pytest.fixture
def bare_logging(monkeypatch):
    """No handlers on the root and sparkcoord loggers for the test body (pytest adds its own
    to the root when the test starts, so they are removed at first use); restored after."""
    root, ours = logging.getLogger(), logging.getLogger("sparkcoord")
    saved = (list(root.handlers), list(ours.handlers), ours.level, ours.propagate)
    monkeypatch.setattr(logs, "_level_is_ours", False)

    def clear() -> logging.Logger:
        root.handlers.clear()
        ours.handlers.clear()
        ours.setLevel(logging.NOTSET)
        ours.propagate = True
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


def test_the_default_level_shows_warnings_only(bare_logging, capsys) -> None:
    bare_logging()
    logs.install_log_handler()
    logging.getLogger("sparkcoord.x").info("a seal")
    logging.getLogger("sparkcoord.x").warning("a stall")
    err = capsys.readouterr().err
    assert "a seal" not in err and " WARNING sparkcoord.x: a stall" in err


def test_a_second_install_changes_only_the_level_and_warn_means_warning(
        bare_logging, capsys) -> None:
    ours = bare_logging()
    logs.install_log_handler("INFO")
    assert logs.install_log_handler("WARN") is True
    assert len(ours.handlers) == 1 and ours.level == logging.WARNING
    logging.getLogger("sparkcoord.x").info("hidden now")
    assert capsys.readouterr().err == ""


def test_a_program_that_configured_logging_keeps_its_configuration(bare_logging) -> None:
    ours = bare_logging()
    logging.getLogger().addHandler(logging.NullHandler())
    assert logs.install_log_handler("DEBUG") is False
    assert ours.handlers == [] and ours.propagate and ours.level == logging.NOTSET


def test_logging_configured_after_the_install_gets_each_line_once(bare_logging, capsys) -> None:
    bare_logging()
    logs.install_log_handler("INFO")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())
    logging.getLogger().addHandler(Collect())  # the program configures logging later
    logging.getLogger("sparkcoord.x").info("restored epoch 4")
    assert seen == ["restored epoch 4"]
    assert capsys.readouterr().err == ""  # sparkcoord's handler stood aside


def test_lines_follow_a_later_redirect_of_stderr(bare_logging, capsys, monkeypatch) -> None:
    import io

    bare_logging()
    logs.install_log_handler("INFO")
    redirected = io.StringIO()
    monkeypatch.setattr("sys.stderr", redirected)  # e.g. a progress display taking stderr
    logging.getLogger("sparkcoord.x").info("sealed epoch 9")
    assert "sealed epoch 9" in redirected.getvalue()


def test_an_unknown_level_is_refused_naming_the_levels() -> None:
    with pytest.raises(ValueError, match="log_level 'loud': use one of DEBUG, INFO"):
        logs.check_level("loud")
