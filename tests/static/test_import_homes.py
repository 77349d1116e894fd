"""Issue 35 point 5: every name is imported from its home, and no private name crosses modules.

- No `# noqa: F401` comment in any tracked Python file: a name imported only to be passed on is a re-export.
- Every from-import of the package and every `X.N` on a module X of the package reads N where it is defined (a
  def, a class, an assignment or a submodule of X), never where X itself only imported it.
- No module uses a private name (`_name`) of another polarstack module. The verifier bundle is the stated exception
  (issue 35): its modules are concatenated into one file (reward/verifier/bundle.py), so their private names are one
  namespace there, and its tests read them.

The scan reads the files' syntax (ast, tokenize), not their text, so a string that mentions a name does not count;
the last test shows the scan finds each kind of fault in a planted module.
"""

from __future__ import annotations

import ast
import io
import subprocess
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scripts" / "polarstack"
VERIFIER = "polarstack.reward.verifier"


def tracked_python() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in listed.stdout.split()]


def module_name(path: Path) -> str | None:
    try:
        parts = path.relative_to(ROOT / "scripts").with_suffix("").parts
    except ValueError:
        return None
    if parts[0] != "polarstack":
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def noqa_f401_lines(text: str) -> list[int]:
    """Lines whose comment (not a string) says `noqa: F401`."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT and "noqa: F401" in token.string:
            found.append(token.start[0])
    return found


def bound_names(tree: ast.Module, top: str = "polarstack") -> tuple[set[str], dict[str, str]]:
    """(names the module defines itself, names of the package it binds only by importing them) at its top level,
    any depth of if/try. A standard-library or third-party module it imports (os, subprocess) is not the package's:
    a test may reach it through the module to patch what that module calls."""
    defined: set[str] = set()
    imported: dict[str, str] = {}  # local name -> what it was imported as (module.name)

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(top)):
                imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, (ast.For, ast.With)):
                target = node.target if isinstance(node, ast.For) else None
                if target is not None:
                    defined.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                visit(node.body)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return defined, {name: target for name, target in imported.items() if name not in defined}


class Package:
    """What each module of scripts/polarstack defines, and which of its names it only imported."""

    def __init__(self, root: Path) -> None:
        self.defined: dict[str, set[str]] = {}
        self.imported_only: dict[str, dict[str, str]] = {}
        for path in sorted(root.rglob("*.py")):
            name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            name = name.removesuffix(".__init__")
            defined, imported_only = bound_names(ast.parse(path.read_text(encoding="utf-8")), root.name)
            self.defined[name] = defined
            self.imported_only[name] = imported_only

    def is_module(self, name: str) -> bool:
        return name in self.defined

    def home_problem(self, module: str, name: str) -> str | None:
        """Why reading `name` from `module` is not reading it at its home, or None."""
        if module not in self.defined or self.is_module(f"{module}.{name}"):
            return None
        target = self.imported_only[module].get(name)
        if target is None or self.is_module(target):  # a module bound by its import (patched where it is used)
            return None
        return f"{name} is only imported by {module}: import it from {target.rsplit('.', 1)[0]}"
        return None


def faults(path: Path, package: Package, display: str, here: str | None = None, top: str = "polarstack") -> list[str]:
    """What `path` (the module `here`, or outside the package) does against the rules above, one line each."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    here = here or module_name(path)
    in_verifier = here is not None and (here == VERIFIER or here.startswith(VERIFIER + "."))
    is_test = display.startswith("tests/")
    found = [f"{display}:{line}: # noqa: F401 (a re-export)" for line in noqa_f401_lines(text)]
    if here is not None:  # `__all__` naming what the module only imported is a re-export too
        _, imported_only = bound_names(tree, top)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                for item in ast.literal_eval(node.value):
                    if item in imported_only:
                        found.append(f"{display}:{node.lineno}: __all__ re-exports {item}")
    aliases: dict[str, str] = {}  # local name -> polarstack module it is bound to

    def private(home: str, name: str) -> bool:
        if not name.startswith("_") or name.startswith("__") or home == here:
            return False
        verifier_name = home == VERIFIER or home.startswith(VERIFIER + ".")
        return not (verifier_name and (in_verifier or is_test))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(top) and not node.level:
            for alias in node.names:
                if package.is_module(f"{node.module}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    continue
                problem = package.home_problem(node.module, alias.name)
                if problem and here != VERIFIER:  # the verifier's __init__ gathers its own modules for the bundle
                    found.append(f"{display}:{node.lineno}: {problem}")
                if private(node.module, alias.name):
                    found.append(f"{display}:{node.lineno}: private {node.module}.{alias.name} used here")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(top) and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module = aliases[node.value.id]
            problem = package.home_problem(module, node.attr)
            if problem:
                found.append(f"{display}:{node.lineno}: {problem}")
            if private(module, node.attr):
                found.append(f"{display}:{node.lineno}: private {module}.{node.attr} used here")
    return found


def test_every_name_is_read_at_its_home_and_no_private_name_crosses_modules():
    package = Package(PACKAGE)
    found = []
    for path in tracked_python():
        found += faults(path, package, str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)


def test_the_scan_finds_each_kind_of_fault(tmp_path):
    """A planted package: a re-export with its noqa, a reader of the re-exported name (by import and by attribute),
    and a private name read from another module. Each is found; the same reads at the home are not."""
    root = tmp_path / "scripts" / "planted"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "home.py").write_text("VALUE = 1\n\n\ndef _helper():\n    return 2\n")
    (root / "sub" / "relay.py").write_text("from planted.sub.home import VALUE  # noqa: F401\n")
    (root / "sub" / "face.py").write_text("from planted.sub.home import VALUE\n\n__all__ = ['VALUE']\n")
    reader = tmp_path / "reader.py"
    reader.write_text(
        "from planted.sub import relay\n"
        "from planted.sub.relay import VALUE\n"
        "from planted.sub.home import _helper\n"
        "print(relay.VALUE, VALUE, _helper())\n"
    )
    good = tmp_path / "good.py"
    good.write_text("from planted.sub import home\nfrom planted.sub.home import VALUE\nprint(home.VALUE, VALUE)\n")
    package = Package(root)
    assert len(faults(root / "sub" / "relay.py", package, "relay.py", "planted.sub.relay", "planted")) == 1
    face = faults(root / "sub" / "face.py", package, "face.py", "planted.sub.face", "planted")
    assert [f.split(": ", 1)[1] for f in face] == ["__all__ re-exports VALUE"]
    found = faults(reader, package, "reader.py", top="planted")
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "VALUE is only imported by planted.sub.relay: import it from planted.sub.home",
        "VALUE is only imported by planted.sub.relay: import it from planted.sub.home",
        "private planted.sub.home._helper used here",
    ]
    assert faults(good, package, "good.py", top="planted") == []
