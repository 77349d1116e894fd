"""Pins the package's layers (issue 17): import-linter's contracts in pyproject.toml hold on the tree and fail on a
copy with one upward import; no module imports the package's own modules dynamically, and the few function-level
imports of its own modules say which heavy dependency they defer."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scripts" / "polarstack"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_DEFERRED = 5  # issue 17: at most five function-level imports of the package's own modules


def lint_imports(source_root: Path, config_dir: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package under `source_root`, with the contracts of the pyproject.toml in `config_dir`."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=config_dir,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(PACKAGE, source / "polarstack", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return source


def test_the_layers_and_acyclic_contracts_hold_on_the_tree(tmp_path):
    done = lint_imports(copy_tree(tmp_path), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, upward",
    [
        ("polar/contract.py", "from polarstack.cli import main as _upward  # noqa: F401"),  # across layers
        ("stack/profiles.py", "from polarstack.stack import target as _upward  # noqa: F401"),  # a cycle inside stack
        ("errors.py", "from polarstack.polar import contract as _upward  # noqa: F401"),  # a root leaf reaching up
    ],
)
def test_one_upward_import_breaks_a_contract(tmp_path, module, upward):
    source = copy_tree(tmp_path)
    path = source / "polarstack" / module
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + upward + "\n" + rest if sep else upward + "\n" + text)
    done = lint_imports(source, tmp_path)
    assert done.returncode != 0, done.stdout
    assert "BROKEN" in done.stdout or "broken" in done.stdout


def test_the_contracts_name_every_subpackage_and_ignore_nothing():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    named = {part.strip() for layer in layers["layers"] for part in layer.replace(":", "|").split("|")}
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    root_modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert subpackages | root_modules == named
    assert len(list(PACKAGE.glob("*.py"))) <= 8  # issue 17: at most 8 modules at the package root
    assert any(c["type"] == "acyclic_siblings" for c in config["contracts"])
    assert not any("ignore_imports" in c for c in config["contracts"])


def _own_imports_in_functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "").startswith("polarstack")):
                    yield sub
                elif isinstance(sub, ast.Import) and any(a.name.startswith("polarstack") for a in sub.names):
                    yield sub


def test_function_level_imports_of_the_package_are_few_and_say_what_they_defer():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in _own_imports_in_functions(ast.parse("\n".join(lines))):
            comment = lines[node.lineno - 2].strip()
            found.append((path.relative_to(PACKAGE), node.lineno, comment))
    assert len(found) <= MAX_DEFERRED, found
    for where, line, comment in found:
        assert comment.startswith("# Deferred:"), f"{where}:{line} needs a '# Deferred: <dependency>' comment"


DYNAMIC = ("importlib.import_module", "__import__(", "importlib.util.spec_from_file_location")


def test_no_module_imports_the_package_dynamically():
    """The contracts cannot see a dynamic import, so none may name a polarstack module."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(call in line for call in DYNAMIC) and "polarstack" in line:
                pytest.fail(f"{path.relative_to(ROOT)}:{number} imports polarstack dynamically: {line.strip()}")
