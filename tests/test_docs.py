"""The docs stay short, in step and self-contained: the README's size and commands,
BENCHMARKS.md's cells, docstring lengths in ``src/stoker``, the API reference's coverage of
the public names, and citations that stay inside the repository.

A word is a whitespace-separated token holding a letter or a digit, so table bars and rules
do not count; a docstring's doctest examples are code, not prose, and do not count either.
"""

from __future__ import annotations

import ast
import doctest
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "stoker"

README_WORDS_MAX = 650
CELL_WORDS_MAX = 45
DOCSTRING_WORDS_MAX = 150

# Docstrings still allowed over the limit, as ``file:name``; keep it empty: explain a long
# design in docs/ and point to it instead.
DOCSTRINGS_ALLOWED: set[str] = set()


PUBLIC_MODULES = ("stoker", "stoker.torch", "stoker.vision", "stoker.formats")
REFERENCE = ROOT / "docs" / "api"
# A name the reference documents: an autodoc directive, or a hand-written entry.
_ENTRY = re.compile(
    r"^\.\. (?:auto(?:class|function|exception|data|module)|py:(?:class|function|exception"
    r"|data|module)|module):: ([\w.]+)$",
    re.M,
)
# A mention of an api, architecture, performance or reliability page, with its path.
_PAGE = re.compile(r"[\w./-]*\b(?:api|architecture|performance|reliability)\.md", re.I)
# A path of one machine's file system.
_MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|root|home|Users|tmp|mnt)/")


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


def _public_names(module: str) -> list[str]:
    """The ``__all__`` of a public package, read from its source (nothing is imported)."""
    path = SRC.parent.joinpath(*module.split("."), "__init__.py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return [str(name) for name in ast.literal_eval(node.value)]
    raise AssertionError(f"{path} has no __all__")


def _reference_text() -> str:
    pages = sorted(REFERENCE.glob("*.rst"))
    assert pages, f"no reference pages in {REFERENCE}"
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def test_the_reference_documents_every_public_name() -> None:
    """docs/api has an entry for each public package and each name of its ``__all__``."""
    documented = set(_ENTRY.findall(_reference_text()))
    wanted = [*PUBLIC_MODULES, *(f"{m}.{n}" for m in PUBLIC_MODULES for n in _public_names(m))]
    missing = [name for name in wanted if name not in documented]
    assert missing == [], f"add an entry to docs/api/*.rst for each of {missing}"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_an_example(module: str) -> None:
    """Each public class, function and module has a ``>>>`` example in its docstring (so
    the doctests run it); a constant has one in its entry of the reference."""
    mod = pytest.importorskip(module)
    reference = _reference_text()
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if isinstance(obj, (type, ModuleType)) or callable(obj):
            text = obj.__doc__ or ""
        else:
            entry = re.search(
                rf"^\.\. py:data:: {re.escape(module)}\.{name}$(.*?)(?=^\.\. |\Z)",
                reference,
                re.M | re.S,
            )
            text = entry.group(1) if entry else ""
        if ">>>" not in text:
            missing.append(name)
    assert missing == [], f"{module}: no example for {missing}"


def test_the_reference_pages_examples_run() -> None:
    """The examples written in docs/api's pages themselves pass as doctests."""
    pytest.importorskip("PIL")
    for page in sorted(REFERENCE.glob("*.rst")):
        result = doctest.testfile(
            str(page), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False
        )
        assert result.failed == 0, f"{page.name}: {result.failed} examples failed (see stdout)"


def test_ci_builds_the_reference_with_warnings_as_errors() -> None:
    """`.ci/run` builds docs/api with Sphinx, a warning failing the build."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    build = re.search(r"^.*-m sphinx .*$", ci, flags=re.M)
    assert build is not None, "`.ci/run` does not build the API reference"
    assert " -W " in build.group(0) and "docs/api" in build.group(0), build.group(0)


def _repository_files() -> list[Path]:
    """The repository's text files: git's list (tracked, and new files not ignored) where
    this is a checkout, else every file outside build and cache folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        paths = [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache"}
        paths = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    files = [p for p in paths if p.is_file()]
    return [p for p in files if b"\0" not in p.read_bytes()[:8192]]


def test_pages_outside_the_repository_are_never_cited() -> None:
    """Every mention of an ``api``, ``architecture``, ``performance`` or ``reliability``
    page is a relative path to a file in the repository (from the file, or from the root)."""
    bad = []
    for path in _repository_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _PAGE.finditer(text):
            target = match.group(0)
            here = (path.parent / target).is_file() or (ROOT / target).is_file()
            if target.startswith("/") or not here:
                bad.append(f"{path.relative_to(ROOT)}: {target}")
    assert bad == [], f"cite pages by a relative path to a file in the repository: {bad}"


def test_no_path_of_one_machine() -> None:
    """No file names a place on one machine's disk (a home, a work folder, a scratch
    folder under /tmp): a command or test makes its folders where it is told or in a
    temporary folder of its own."""
    bad = []
    for path in _repository_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if _MACHINE_PATH.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert bad == [], bad


def test_markdown_links_reach_files_in_the_repository() -> None:
    """Every relative link of a Markdown page leads to a file or folder that exists."""
    bad = []
    for page in _repository_files():
        if page.suffix != ".md":
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            where = target.split("#", 1)[0]
            if where.startswith("/") or not (page.parent / where).exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert bad == [], bad
