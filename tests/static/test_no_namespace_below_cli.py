"""Issue 35: no argparse Namespace or SimpleNamespace travels below cli/.

A command's parsed arguments stay in scripts/polarstack/cli/: the layers below take typed values (the site, the
smoke's SmokeOptions, a plan's request). The check parses every module of the package with ast:
- below cli/, no `SimpleNamespace` is named (a stand-in of an upstream object is a small class of its own);
- below cli/, no parameter is annotated `Namespace` / `argparse.Namespace`, and `parse_args` is called only in a
  module's own `main` (a `python -m` entry point that parses its own flags), whose result is read there attribute by
  attribute, never handed whole to another call;
- in cli/, a handler's `args` is handed whole only to cli/'s own functions and to `from_args`, the one conversion of
  a parsed command line into options (polarstack.checks.smoke_inputs.SmokeOptions.from_args, as sglang's
  ServerArgs.from_cli_args).
Planted modules show each rule catches its form."""

import ast
from pathlib import Path

import pytest

from polarstack.pins import repo_root

pytestmark = pytest.mark.unit
PACKAGE = repo_root() / "scripts" / "polarstack"
CONVERSIONS = {"from_args"}  # the one place a parsed command line becomes options
BUILTINS = {"getattr", "hasattr", "setattr", "vars"}  # reading or setting one attribute of it


def _bare_names(call: ast.Call) -> set[str]:
    return {a.id for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name)}


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def below_cli_problems(tree: ast.AST, rel: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and _callee(node) == "SimpleNamespace":
            found.append(f"{rel}:{node.lineno}: SimpleNamespace")
        if isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] == "SimpleNamespace":
            found.append(f"{rel}:{node.lineno}: SimpleNamespace")
        if isinstance(node, ast.arg) and node.annotation is not None:
            text = ast.unparse(node.annotation)
            if text.split(".")[-1].strip("'\"") == "Namespace":
                found.append(f"{rel}:{node.lineno}: parameter {node.arg} is a Namespace")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parsed = {
                target.id
                for stmt in ast.walk(node)
                if isinstance(stmt, ast.Assign)
                and isinstance(stmt.value, ast.Call)
                and _callee(stmt.value.func) == "parse_args"
                for target in stmt.targets
                if isinstance(target, ast.Name)
            }
            if parsed and node.name != "main":
                found.append(f"{rel}:{node.lineno}: {node.name} parses a command line (only a module's main may)")
            for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
                handed = _bare_names(call) & parsed
                if handed and _callee(call.func) not in CONVERSIONS:
                    found.append(f"{rel}:{call.lineno}: {node.name} hands its parsed {sorted(handed)[0]} whole on")
    return found


def cli_problems(tree: ast.AST, rel: str) -> list[str]:
    """In cli/: a function with an `args` parameter hands it whole only to cli/'s own functions or a conversion."""
    own: set[str] = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("polarstack.cli"):
            own |= {alias.asname or alias.name for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if "args" not in {a.arg for a in node.args.args}:
            continue
        for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
            if "args" not in _bare_names(call):
                continue
            func = call.func
            name = _callee(func)
            local = isinstance(func, ast.Name) and name in own
            handler = isinstance(func, ast.Attribute) and ast.unparse(func) == "args.handler"
            if not (local or handler or name in CONVERSIONS or (isinstance(func, ast.Name) and name in BUILTINS)):
                found.append(f"{rel}:{call.lineno}: {node.name} hands args to {ast.unparse(func)}")
    return found


def package_problems(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        found = cli_problems(tree, rel) if rel.startswith("cli/") else below_cli_problems(tree, rel)
        out += sorted(set(found), key=lambda line: int(line.split(":")[1]))
    return out


def test_no_namespace_travels_below_cli():
    problems = package_problems(PACKAGE)
    assert not problems, "a parsed command line below cli/ (take typed values instead):\n" + "\n".join(problems)


def test_planted_namespaces_are_caught(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "fake.py").write_text(
        "import argparse\n"
        "from types import SimpleNamespace\n\n"
        "def run(args: argparse.Namespace):\n"
        "    return SimpleNamespace(x=args.x)\n\n"
        "def helper(argv):\n"
        "    opts = argparse.ArgumentParser().parse_args(argv)\n"
        "    return opts.x\n\n"
        "def main(argv=None):\n"
        "    args = argparse.ArgumentParser().parse_args(argv)\n"
        "    print(args.x)\n"
        "    return run(args)\n"
    )
    (tmp_path / "cli" / "handlers.py").write_text(
        "from polarstack.checks import fake\n"
        "from polarstack.checks.smoke_inputs import SmokeOptions\n"
        "from polarstack.cli.site import build\n\n"
        "def _local(args):\n"
        "    return args.x\n\n"
        "def _cmd(args):\n"
        "    options = SmokeOptions.from_args(args)\n"
        "    build(args)\n"
        "    _local(args)\n"
        "    return fake.run(args), options\n"
    )
    assert package_problems(tmp_path) == [
        "checks/fake.py:2: SimpleNamespace",
        "checks/fake.py:4: parameter args is a Namespace",
        "checks/fake.py:5: SimpleNamespace",
        "checks/fake.py:7: helper parses a command line (only a module's main may)",
        "checks/fake.py:14: main hands its parsed args whole on",
        "cli/handlers.py:12: _cmd hands args to fake.run",
    ]
