"""``sparkcoord tail``'s progress line ends with a newline when stdout is not a terminal
(issue 25 item 6): rich prints a live display's last state once, at its end, without one, so
the command's summary line ran into it (``... 1,000 rows; splits: 4 read1,000 rows read``)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from sparkcoord.sources.console import progress_line


def test_the_progress_line_ends_with_a_newline_when_the_output_is_not_a_terminal() -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=200)
    assert not console.is_terminal  # a pipe or a file, as `sparkcoord tail ... > log`
    with progress_line(console) as live:
        live.update("data -> out: 1,000 rows; splits: 4 read, 0 reading, 0 waiting")
    print("1,000 rows read into out", file=screen)
    # the summary is a line of its own, after the progress line's last state
    assert screen.getvalue().splitlines() == [
        "data -> out: 1,000 rows; splits: 4 read, 0 reading, 0 waiting",
        "1,000 rows read into out"]


def test_the_progress_line_ends_with_a_newline_also_when_the_run_raised() -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=200)
    try:
        with progress_line(console) as live:
            live.update("data -> out: 5 rows; splits: listing")
            raise RuntimeError("the query failed")
    except RuntimeError:
        pass
    assert screen.getvalue() == "data -> out: 5 rows; splits: listing\n"


def test_on_a_terminal_the_summary_also_starts_on_a_line_of_its_own() -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=200, force_terminal=True)
    with progress_line(console) as live:
        live.update("data -> out: 7 rows; splits: 1 read, 0 reading, 0 waiting")
    print("7 rows read into out", file=screen)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # colours, cursor
    # rich's own newline, and not a second one from us (no blank line before the summary)
    assert text.splitlines()[-2:] == [
        "data -> out: 7 rows; splits: 1 read, 0 reading, 0 waiting", "7 rows read into out"]
