#!/usr/bin/env python3
"""Record which slime API Polar's slime bridge needs, and which of it the pinned slime defines (read with `ast`).

Two steps, each writing one file under configs/upstream/ (checked by `make verify-offline`,
scripts/polarstack/checks/bridge.py):

  polar: from a Polar source checkout at POLAR_COMMIT, for each bridge entry point the launch can name
         (a `module.Name` that slime loads with load_function), the slime symbols it needs:
         - a class deriving from a slime class: every `self.X` it reads and every `super().X` it calls that the
           class does not define itself -> `<slime base>.X` (required: an AttributeError otherwise);
         - a function: every `from slime... import Name` of its module (required, with the function it is in),
           every `data_source.X(...)` call (required of the configured data source class) and every
           `getattr(...data_source, "X", None)` (optional: the bridge falls back when it is missing).
           python scripts/tools/record_bridge_api.py polar --polar DIR --commit POLAR_COMMIT \
               slime_bridge.rollout.generate_rollout_polar_async ... > configs/upstream/polar-bridge.json
  slime: from a slime git directory (bare is fine) at SLIME_COMMIT, whether each symbol of polar-bridge.json (and
         of the slime data source classes it names) is defined there, following base classes, and the defaults
         and choices of the slime options named with --option (slime/utils/arguments.py add_argument calls):
           python scripts/tools/record_bridge_api.py slime --slime-git GITDIR --commit SLIME_COMMIT \
               --bridge configs/upstream/polar-bridge.json --option --data-source-path ... > configs/upstream/slime-api.json
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import subprocess
import sys
import warnings
from pathlib import Path

# --------------------------------------------------------------------------------------------- polar side


def _module_file(root: Path, module: str) -> Path:
    rel = Path(*module.split("."))
    for base in (root / "src", root):
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
            if candidate.exists():
                return candidate
    raise SystemExit(f"{module} not found under {root} (src/ or top level)")


def slime_imports(tree: ast.AST) -> dict[str, tuple[str, int]]:
    """Local name -> (slime symbol, line) for every `from slime... import N [as M]` anywhere in the module."""
    out: dict[str, tuple[str, int]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and (node.module == "slime" or node.module.startswith("slime."))
        ):
            for alias in node.names:
                out[alias.asname or alias.name] = (f"{node.module}.{alias.name}", node.lineno)
    return out


def _enclosing_functions(tree: ast.AST) -> dict[int, str]:
    """id(node) -> name of the innermost function (or class.method) containing it."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            child_name = name
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                child_name = f"{name}.{child.name}" if name else child.name
            elif isinstance(child, ast.ClassDef):
                child_name = child.name
            owner[id(child)] = child_name
            visit(child, child_name)

    visit(tree, "")
    return owner


def class_requirements(cls: ast.ClassDef, base: str) -> list[dict]:
    defined = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            defined.add(node.attr)
    uses: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(method):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            value = node.value
            is_self = isinstance(value, ast.Name) and value.id == "self" and node.attr not in defined
            is_super = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
            if is_self or is_super:
                uses.setdefault(node.attr, set()).add(method.name)
                lines.setdefault(node.attr, node.lineno)
    return [
        {"symbol": f"{base}.{name}", "need": "required", "line": lines[name], "where": ", ".join(sorted(methods))}
        for name, methods in sorted(uses.items())
    ]


def function_requirements(tree: ast.AST) -> list[dict]:
    owner = _enclosing_functions(tree)
    out: dict[str, dict] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and (node.module == "slime" or node.module.startswith("slime."))
        ):
            for alias in node.names:
                key = f"{node.module}.{alias.name}"
                entry = out.setdefault(key, {"symbol": key, "need": "required", "line": node.lineno, "where": set()})
                entry["where"].add(owner.get(id(node)) or "<module>")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and _names_data_source(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            key = f"<data_source>.{node.args[1].value}"
            entry = out.setdefault(key, {"symbol": key, "need": "optional", "line": node.lineno, "where": set()})
            entry["where"].add(owner.get(id(node), ""))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _names_data_source(node.func.value)
        ):
            key = f"<data_source>.{node.func.attr}"
            entry = out.setdefault(key, {"symbol": key, "need": "required", "line": node.lineno, "where": set()})
            entry["need"] = "required"
            entry["where"].add(owner.get(id(node), ""))
    return [{**e, "where": ", ".join(sorted(w for w in e["where"] if w))} for _, e in sorted(out.items())]


def _names_data_source(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "data_source") or (
        isinstance(node, ast.Attribute) and node.attr == "data_source"
    )


def record_polar(root: Path, commit: str, entry_points: list[str]) -> dict:
    out: dict[str, dict] = {}
    for entry in entry_points:
        module, _, name = entry.rpartition(".")
        path = _module_file(root, module)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports = slime_imports(tree)
        node = next(
            (
                n
                for n in tree.body
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
            ),
            None,
        )
        if node is None:
            raise SystemExit(f"{entry}: no top-level {name} in {path}")
        record: dict = {"file": str(path.relative_to(root)), "line": node.lineno}
        if isinstance(node, ast.ClassDef):
            bases = [imports[b.id][0] for b in node.bases if isinstance(b, ast.Name) and b.id in imports]
            record["kind"] = "data_source" if bases else "class"
            record["slime_base"] = bases[0] if bases else None
            record["requires"] = class_requirements(node, bases[0]) if bases else []
        else:
            record["kind"] = "function"
            record["requires"] = function_requirements(tree)
        out[entry] = record
    return {
        "what": "slime API each Polar slime-bridge entry point needs (record_bridge_api.py polar)",
        "polar_commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_bridge_api.py polar",
        "entry_points": out,
    }


# --------------------------------------------------------------------------------------------- slime side


class SlimeSource:
    """Files of a slime git directory at one commit (`git show`), parsed with ast."""

    def __init__(self, git_dir: Path, commit: str):
        self.git_dir, self.commit = git_dir, commit
        self._trees: dict[str, ast.Module | None] = {}

    def text(self, path: str) -> str | None:
        proc = subprocess.run(
            ["git", f"--git-dir={self.git_dir}", "show", f"{self.commit}:{path}"], capture_output=True, text=True
        )
        return proc.stdout if proc.returncode == 0 else None

    def module(self, module: str) -> tuple[str, ast.Module] | None:
        rel = module.replace(".", "/")
        for path in (f"{rel}.py", f"{rel}/__init__.py"):
            if path not in self._trees:
                text = self.text(path)
                self._trees[path] = _parse(text) if text is not None else None
            if self._trees[path] is not None:
                return path, self._trees[path]
        return None

    def resolve(self, symbol: str) -> dict:
        """{'exists': bool, 'file', 'line'} for `slime.mod.Name` or `slime.mod.Class.attr` (attrs through bases)."""
        parts = symbol.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            found = self.module(".".join(parts[:cut]))
            if found is None:
                continue
            path, tree = found
            rest = parts[cut:]
            if not rest:
                return {"exists": True, "file": path, "line": 1}
            node = _top_level(tree, rest[0])
            if node is None:
                sub = self.module(".".join(parts[: cut + 1]))  # `from slime.utils import wandb_utils`
                if sub is not None and len(rest) == 1:
                    return {"exists": True, "file": sub[0], "line": 1}
                return {"exists": False, "file": path, "why": f"{rest[0]} is not defined in {path}"}
            if len(rest) == 1:
                return {"exists": True, "file": path, "line": node.lineno}
            if isinstance(node, ast.ImportFrom):
                return self.resolve(f"{node.module}.{rest[0]}.{'.'.join(rest[1:])}")
            if not isinstance(node, ast.ClassDef):
                return {"exists": False, "file": path, "why": f"{rest[0]} in {path} is not a class"}
            return self._class_attr(path, tree, node, rest[1])
        return {"exists": False, "why": f"no module of {symbol} in slime at {self.commit[:12]}"}

    def _class_attr(self, path: str, tree: ast.Module, cls: ast.ClassDef, attr: str) -> dict:
        line = _class_defines(cls, attr)
        if line is not None:
            return {"exists": True, "file": path, "line": line, "class": cls.name}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                target = _top_level(tree, base.id)
                if isinstance(target, ast.ClassDef):
                    found = self._class_attr(path, tree, target, attr)
                elif isinstance(target, ast.ImportFrom) and target.module and target.module.startswith("slime"):
                    found = self.resolve(f"{target.module}.{base.id}.{attr}")
                else:
                    continue
                if found["exists"]:
                    return found
        return {"exists": False, "file": path, "why": f"{cls.name} (and its slime bases) defines no {attr}"}

    def option(self, flag: str) -> dict:
        path = "slime/utils/arguments.py"
        text = self.text(path) or ""
        found: dict = {"exists": False}
        for node in ast.walk(_parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name not in ("add_argument", "reset_arg") or flag not in strings:
                continue
            found = {"exists": True, "file": path, "line": node.lineno, "call": name}
            for kw in node.keywords:
                if kw.arg in ("default", "choices", "type", "action", "dest"):
                    try:
                        found[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        found[kw.arg] = ast.unparse(kw.value)
        return found


def _parse(text: str) -> ast.Module:
    with warnings.catch_warnings():  # upstream sources may hold invalid escape sequences; they still parse
        warnings.simplefilter("ignore")
        return ast.parse(text)


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def _class_defines(cls: ast.ClassDef, attr: str) -> int | None:
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == attr:
            return item.lineno
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in item.targets):
            return item.lineno
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and node.attr == attr
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return node.lineno
    return None


def record_slime(git_dir: Path, commit: str, bridge: dict, options: list[str]) -> dict:
    source = SlimeSource(git_dir, commit)
    wanted: set[str] = set()
    data_source_classes: set[str] = set()
    for record in bridge["entry_points"].values():
        if record.get("slime_base"):
            data_source_classes.add(record["slime_base"])
        wanted.update(r["symbol"] for r in record["requires"] if r["symbol"].startswith("slime"))
    option_facts = {flag: source.option(flag) for flag in options}
    default_ds = option_facts.get("--data-source-path", {}).get("default")
    if isinstance(default_ds, str):
        data_source_classes.add(default_ds)
    calls = {
        r["symbol"].split(".", 1)[1]
        for rec in bridge["entry_points"].values()
        for r in rec["requires"]
        if r["symbol"].startswith("<data_source>.")
    }
    for cls in data_source_classes:
        wanted.update(f"{cls}.{attr}" for attr in calls)
    return {
        "what": "which slime symbols and options the bridge facts name exist at the pinned slime "
        "(record_bridge_api.py slime)",
        "slime_commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_bridge_api.py slime",
        "symbols": {s: source.resolve(s) for s in sorted(wanted)},
        "options": option_facts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("polar")
    p.add_argument("--polar", type=Path, required=True, help="Polar source checkout (has src/slime_bridge)")
    p.add_argument("--commit", required=True)
    p.add_argument("entry_points", nargs="+")
    s = sub.add_parser("slime")
    s.add_argument("--slime-git", type=Path, required=True)
    s.add_argument("--commit", required=True)
    s.add_argument("--bridge", type=Path, required=True)
    s.add_argument("--option", action="append", default=[], dest="options")
    args = parser.parse_args(argv)
    if args.step == "polar":
        data = record_polar(args.polar, args.commit, args.entry_points)
    else:
        data = record_slime(args.slime_git, args.commit, json.loads(args.bridge.read_text()), args.options)
    json.dump(data, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
