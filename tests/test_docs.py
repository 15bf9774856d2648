"""The docs stay short, in step and self-contained: the README's size and commands,
BENCHMARKS.md's cells, docstring lengths in ``src/stoker``, the API reference's coverage of
the public names, and citations that stay inside the repository.

A word is a whitespace-separated token holding a letter or a digit, so table bars and rules
do not count; a docstring's doctest examples are code, not prose, and do not count either.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "stoker"

README_WORDS_MAX = 650
CELL_WORDS_MAX = 45
DOCSTRING_WORDS_MAX = 150

# Docstrings still allowed over the limit, as ``file:name``; keep it empty: explain a long
# design in docs/ and point to it instead.
DOCSTRINGS_ALLOWED: set[str] = set()


def _words(text: str) -> int:
    return len(re.findall(r"\S*[A-Za-z0-9]\S*", text))


def _prose(doc: str) -> str:
    """``doc`` without its doctest examples (each ``>>>`` line, its ``...`` continuations
    and its expected output, up to the next blank line)."""
    kept: list[str] = []
    in_example = False
    for line in doc.splitlines():
        if line.lstrip().startswith(">>>"):
            in_example = True
        elif not line.strip():
            in_example = False
        if not in_example:
            kept.append(line)
    return "\n".join(kept)


def _fenced_bash(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)\n```$", text, flags=re.M | re.S)


def _readme_before_links() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## More$", text, flags=re.M)
    assert match is not None, "README.md has no '## More' section of links"
    return text[: match.start()]


def _table_cells(text: str) -> list[str]:
    cells: list[str] = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"[|:\- ]+", line):
            cells.extend(cell.strip() for cell in line.strip().strip("|").split("|"))
    return cells


def long_docstrings(limit: int = DOCSTRING_WORDS_MAX) -> dict[str, int]:
    """Every docstring in ``src/stoker`` over ``limit`` words, as ``file:name`` -> words."""
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(tree):
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            doc = ast.get_docstring(node)
            if doc is not None and _words(_prose(doc)) > limit:
                name = "<module>" if isinstance(node, ast.Module) else node.name
                found[f"{rel}:{name}"] = _words(_prose(doc))
    return found


def test_readme_is_short_before_its_links() -> None:
    """The README says what it must in under 650 words before its '## More' links."""
    words = _words(_readme_before_links())
    assert words < README_WORDS_MAX, f"README.md has {words} words before '## More'"


def test_ci_runs_the_readmes_test_command() -> None:
    """`.ci/run` picks the README's second fenced bash command (the tests); the first runs
    the demo."""
    commands = _fenced_bash((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(commands) >= 2, commands
    assert commands[0].endswith("stoker demo"), commands[0]
    assert "pytest" in commands[1], commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pick = re.search(r"^cmd=\$\((awk .*)\)$", ci, flags=re.M)
    assert pick is not None, "`.ci/run` no longer picks its command from the README with awk"
    if shutil.which("awk") is None:
        pytest.skip("awk is not installed")
    out = subprocess.run(
        ["bash", "-c", pick.group(1)], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == commands[1]


def test_docs_name_tests_that_exist() -> None:
    """Every ``test_x.py::test_y`` that a page of docs/ or the README names is in tests/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {
        (page.name, file, test)
        for page in pages
        for file, test in re.findall(
            r"(test_\w+\.py)::(test_\w+)", page.read_text(encoding="utf-8")
        )
    }
    assert named, "no test names found in the docs"
    missing = [
        f"{page}: {file}::{test}"
        for page, file, test in sorted(named)
        if not (ROOT / "tests" / file).exists()
        or not re.search(
            rf"^\s*def {test}\b", (ROOT / "tests" / file).read_text(encoding="utf-8"), re.M
        )
    ]
    assert missing == [], missing


def test_readme_keeps_every_difference_from_torch() -> None:
    """The differences table has a row per difference and a way back to torch's in each."""
    text = _readme_before_links()
    table = text[text.index("## Differences from torch") :]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 21, len(rows)
    assert all(len(_table_cells(row)) == 3 for row in rows)


def test_benchmark_table_cells_fit_a_screen() -> None:
    """No cell of a table in BENCHMARKS.md runs over 45 words."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    long = [cell for cell in _table_cells(text) if _words(cell) > CELL_WORDS_MAX]
    assert long == [], long


def test_prose_leaves_out_doctest_examples() -> None:
    """Examples, their continuations and their output are left out; the prose after stays."""
    doc = "One two.\n\n>>> f(1,\n...   2)\n[1, 2]\n\nThree four."
    assert _prose(doc) == "One two.\n\n\nThree four."
    assert _words(_prose(doc)) == 4


def test_docstrings_are_short() -> None:
    """No docstring in ``src/stoker`` runs over 150 words of prose (examples left out),
    beyond the allow-list."""
    found = long_docstrings()
    over = {key: words for key, words in found.items() if key not in DOCSTRINGS_ALLOWED}
    assert over == {}, over
    stale = sorted(DOCSTRINGS_ALLOWED - set(found))
    assert stale == [], f"now short, remove from DOCSTRINGS_ALLOWED: {stale}"
