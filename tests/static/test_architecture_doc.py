"""docs/architecture.md cannot go stale silently (issue 35 point 6). The page follows `make train` and `make smoke`
file by file. This test checks:
- every repository path it names exists, written from the root (`scripts/polarstack/train/plan.py`) or from the
  package (`train/plan.py`, `http.py`);
- in its step tables, every function or class of a row's "functions" column is defined in that row's file (for a
  file that is not Python, every quoted string appears in it), and every `name()` elsewhere in a row is defined in
  one of the files the tables name;
- every polarstack module that the two drivers (train/launch.py for make train, checks/smoke.py for the smoke)
  import is named on the page;
- the `ray job submit` line it quotes is, word for word and in order, the one launch.sh runs (engine-direct,
  HumanEval, as rendered in tests/fixtures/single-node-plans.json; `...` marks arguments it leaves out)."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scripts" / "polarstack"
DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")
HEADER = "| step | file | functions | what happens |"
ROOT_FILES = {"Makefile", "pyproject.toml", "README.md"}
DRIVERS = ("scripts/polarstack/train/launch.py", "scripts/polarstack/checks/smoke.py")


def quoted(text: str) -> list[str]:
    """The `quoted` words of Markdown prose (fenced code blocks left out: their fences would pair wrongly)."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def as_path(token: str) -> Path | None:
    """The repository file or folder a quoted token names; None when it is no repository path (a command, an
    absolute path inside a container, a placeholder like <run>, the git-ignored .venv or .run)."""
    if re.search(r"[\s<>*$=(){}\"',]", token) or token.startswith(("/", ".venv", ".run", "-")):
        return None
    if token in ROOT_FILES:
        return ROOT / token
    if "/" not in token and not token.endswith(".py"):
        return None  # generated files (launch.sh, polar_config.yaml) and words
    for base in (ROOT, PACKAGE):
        if (base / token.rstrip("/")).exists():
            return base / token.rstrip("/")
    return ROOT / token  # reported as missing


def named_paths() -> list[tuple[str, Path]]:
    return [(token, path) for token in quoted(TEXT) if (path := as_path(token)) is not None]


def rows() -> list[list[str]]:
    """The cells of every row of the step tables."""
    found = []
    for table in TEXT.split(HEADER)[1:]:
        for line in table.strip().splitlines()[1:]:  # after the |---| line
            if not line.startswith("|"):
                break
            found.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return found


def definitions(path: Path) -> dict[str, set[str]]:
    """Every function and class defined in `path` (at any depth), each with the functions defined in its body."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            out.setdefault(node.name, set()).update(inner)
    return out


def defined(name: str, path: Path) -> bool:
    head, _, attribute = name.removesuffix("()").partition(".")
    found = definitions(path)
    return head in found and (not attribute or attribute in found[head])


def test_the_page_has_both_paths_and_their_tables():
    assert "## `make train TASK=humaneval`" in TEXT and "## `make smoke`" in TEXT
    assert TEXT.count(HEADER) == 3, "the train table, the in-job table and the smoke table"
    assert len(rows()) > 30, f"only {len(rows())} steps parsed"


def test_every_path_named_exists():
    named = named_paths()
    assert len(named) > 40, f"only {len(named)} paths parsed"
    missing = sorted({token for token, path in named if not path.exists()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_function_named_is_defined_in_its_file():
    files = []
    problems = []
    for row in rows():
        assert len(row) == 4, f"a step row has {len(row)} cells, not 4: {row}"
        cell = quoted(row[1])
        path = as_path(cell[0]) if len(cell) == 1 else None
        if path is None or not path.is_file():
            problems.append(f"step {row[0]}: the file cell {row[1]!r} names no single repository file")
            continue
        files.append(path)
        names = quoted(row[2])
        if not names:
            problems.append(f"step {row[0]}: no function named for {cell[0]}")
        for name in names:
            if path.suffix == ".py":
                if not re.fullmatch(r"\w+(\.\w+)?(\(\))?", name) or not defined(name, path):
                    problems.append(f"step {row[0]}: {cell[0]} defines no {name}")
            elif name not in path.read_text(encoding="utf-8"):
                problems.append(f"step {row[0]}: {cell[0]} does not contain {name!r}")
    python = [f for f in files if f.suffix == ".py"]
    for row in rows():
        for name in re.findall(r"`(\w+(?:\.\w+)?)\(\)`", row[3]):
            if not any(defined(name, f) for f in python):
                problems.append(f"step {row[0]}: no file of the tables defines {name}()")
    assert not problems, "\n".join(problems)


def imported_modules(path: Path) -> set[Path]:
    """The package's files that `path` imports (`from polarstack.x import y`: x/y.py when it is a module, else x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "polarstack":
            base = ROOT / "scripts" / Path(*node.module.split("."))
            for alias in node.names:
                if (base / f"{alias.name}.py").is_file():
                    out.add(base / f"{alias.name}.py")
                elif base.with_suffix(".py").is_file():
                    out.add(base.with_suffix(".py"))
                else:
                    out.add(base / "__init__.py")
    return out


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_module_a_driver_imports_is_named(driver):
    imported = imported_modules(ROOT / driver)
    assert len(imported) > 5, f"{driver}: only {len(imported)} imports found"
    named = {path.resolve() for _, path in named_paths()}
    missing = sorted(str(p.relative_to(ROOT)) for p in imported if p.resolve() not in named)
    assert not missing, f"{driver} imports modules docs/architecture.md does not name: {missing}"


def test_the_quoted_submit_line_is_the_one_launch_sh_runs():
    quoted_lines = [line for line in TEXT.splitlines() if line.startswith("ray job submit ")]
    assert len(quoted_lines) == 1, "the page quotes one `ray job submit` line"
    plans = json.loads((ROOT / "tests" / "fixtures" / "single-node-plans.json").read_text())
    launch = plans["train"]["engine-direct/humaneval"]["files"]["launch.sh"]
    rendered = [line for line in launch.splitlines() if line.startswith("ray job submit ")]
    assert len(rendered) == 1
    words = shlex.split(rendered[0])
    at = 0
    for word in shlex.split(quoted_lines[0]):
        if word == "...":
            continue
        prefix = word.partition("...")[0] if "..." in word else None
        while at < len(words) and not (words[at].startswith(prefix) if prefix is not None else words[at] == word):
            at += 1
        assert at < len(words), f"{word!r} is not in launch.sh's submit line (engine-direct/humaneval), or out of order"
        at += 1
