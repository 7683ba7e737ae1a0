"""Every rule the code cites is in the repository (issue 44 item 4), without Spark.

A rule is cited by its name in docs/protocol.md (where a ``### name`` heading defines it), as in
``docs/protocol.md [seal-before-offset]``, or as a decision of the numbered log, ``decision N``
or its file ``docs/decisions/NNN-slug.md``. The brief and the notes the project started from
live outside the repository, so nothing may cite them any more. Each test names every offender
as ``file:line``.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
DECISIONS = ROOT / "docs" / "decisions"
#: what a newcomer reads: the package, the tests, the benchmarks, the scripts and the docs
SCANNED = ("sparkcoord", "tests", "bench", "scripts", "docs", "README.md")
SUFFIXES = {".py", ".md", ".json", ".txt", ".toml"}

#: references to files outside the repository: the design brief, its Spark notes, the model
OUTSIDE = re.compile(r"\bDESIGN\b|SPARK_NOTES|FINDINGS\.md|protocol-model|/work/shared|"
                     r"\.\./shared/")
#: "decision 36", "decisions 45 and 46", "docs/decisions.md 36, 38 and 76", "Decision 75's"
DECISION = re.compile(r"\b[Dd]ecisions?(?:\.md)?[ \t]+(\d+(?:(?:,[ \t]*(?:and[ \t]+)?|[ \t]+and"
                      r"[ \t]+)\d+)*)")
DECISION_FILE = re.compile(r"decisions/(\d{3})-([a-z0-9-]+)\.md")
#: "docs/protocol.md [seal-before-offset] [stored-once-parts]", also wrapped onto the next line
RULE_CITATION = re.compile(r"docs/protocol\.md((?:[ \t]*(?:\n[ \t]*#?[ \t]*)?\[[^\]\n]*\])+)")
BRACKETED = re.compile(r"\[([^\]\n]*)\]")
#: within docs/protocol.md a rule is cited as "[name]" (not a Markdown link)
LOCAL_CITATION = re.compile(r"\[([a-z0-9]+(?:-[a-z0-9]+)+)\](?!\()")
RULE_HEADING = re.compile(r"^### ([a-z0-9]+(?:-[a-z0-9]+)*)[ \t]*$", re.M)


def scanned_files(root: pathlib.Path = ROOT) -> Iterator[pathlib.Path]:
    for name in SCANNED:
        path = root / name
        if path.is_file():
            yield path
            continue
        for file in sorted(path.rglob("*")):
            if file.suffix in SUFFIXES and file.is_file() and "__pycache__" not in file.parts:
                yield file


def where(root: pathlib.Path, file: pathlib.Path, text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"{file.relative_to(root)}:{line}: {text.splitlines()[line - 1].strip()}"


def defined_rules(protocol: pathlib.Path = PROTOCOL) -> list[str]:
    return RULE_HEADING.findall(protocol.read_text())


def outside_references(root: pathlib.Path = ROOT) -> list[str]:
    here = pathlib.Path(__file__).resolve()
    found = []
    for file in scanned_files(root):
        if file.resolve() == here:  # the patterns above name what they look for
            continue
        text = file.read_text(errors="replace")
        found += [where(root, file, text, m.start()) for m in OUTSIDE.finditer(text)]
    return found


def unknown_decisions(root: pathlib.Path = ROOT) -> list[str]:
    decisions = root / "docs" / "decisions"
    numbers = {int(p.name[:3]) for p in decisions.glob("[0-9][0-9][0-9]-*.md")}
    found = []
    for file in scanned_files(root):
        text = file.read_text(errors="replace")
        for m in DECISION.finditer(text):
            missing = [n for n in re.findall(r"\d+", m.group(1)) if int(n) not in numbers]
            if missing:
                found.append(f"{where(root, file, text, m.start())} (no file for "
                             f"{', '.join(missing)})")
        for m in DECISION_FILE.finditer(text):
            if not (decisions / f"{m.group(1)}-{m.group(2)}.md").is_file():
                found.append(f"{where(root, file, text, m.start())} (no such file)")
    return found


def unknown_rules(root: pathlib.Path = ROOT) -> list[str]:
    protocol = root / "docs" / "protocol.md"
    rules = set(defined_rules(protocol))
    found = []
    for file in scanned_files(root):
        text = file.read_text(errors="replace")
        citations = [(m.start(), BRACKETED.findall(m.group(1)))
                     for m in RULE_CITATION.finditer(text)]
        if file == protocol:
            citations += [(m.start(), [m.group(1)]) for m in LOCAL_CITATION.finditer(text)]
        for offset, names in citations:
            missing = [n for n in names if n not in rules]
            if missing:
                found.append(f"{where(root, file, text, offset)} (not in docs/protocol.md: "
                             f"{', '.join(missing)})")
    return found


def test_every_rule_the_code_cites_is_in_the_repository() -> None:
    offenders = outside_references() + unknown_decisions() + unknown_rules()
    assert not offenders, "rules cited but not in the repository:\n" + "\n".join(offenders)


def test_every_rule_of_the_protocol_has_one_name_and_every_decision_one_file() -> None:
    rules = defined_rules()
    assert len(rules) >= 40
    twice = sorted({r for r in rules if rules.count(r) > 1})
    assert not twice, f"docs/protocol.md defines these names twice: {twice}"
    files = sorted(p.name for p in DECISIONS.glob("*.md"))
    numbers = [int(name[:3]) for name in files]
    assert numbers == list(range(1, len(files) + 1)), "docs/decisions/: numbers 001, 002, ..."
    index = (ROOT / "docs" / "decisions.md").read_text()
    unindexed = [name for name in files if f"(decisions/{name})" not in index]
    assert not unindexed, f"docs/decisions.md lists no line for {unindexed}"
