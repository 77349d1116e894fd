"""The verifier as one self-contained file (eval/verifier.py): the package's modules concatenated, deterministically.

Polar's `test_on_output` evaluator runs `python3 -I verifier.py --problem ... --solution ... --name ...` inside the
agent sandbox, where polarstack is not installed: the file it runs must hold the whole verifier and import only the
standard library. `source()` builds it from the modules below, in order: the package's docstring, one
`from __future__` line, the modules' standard-library imports (merged and sorted), then each module's body (the
text after its imports, comments included) and the command-line entry. Imports of polarstack are dropped: the
modules share one namespace in the file, so a top-level name may be defined by one module only (checked here).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# Dependency order: each module's body uses only names defined by the modules before it (or its own).
MODULES = (
    "limits",
    "candidate",
    "sandbox_side",
    "seccomp",
    "judge_side",
    "watchdog",
    "supervisor",
    "host",
    "cgroup",
    "verdict",
    "__init__",
)
NOT_BUNDLED = ("bundle", "__main__")  # this file and `python -m polarstack.reward.verifier`
ENTRY = '\n\nif __name__ == "__main__":\n    sys.exit(main())\n'


class BundleError(RuntimeError):
    """A module cannot be bundled into one standard-library file (a foreign import, a name defined twice)."""


def _defined(node: ast.stmt) -> set[str]:
    """Top-level names a statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, (ast.AnnAssign, ast.AugAssign))
        else []
    )
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _split(name: str, text: str) -> tuple[str | None, list[ast.stmt], str]:
    """(docstring as written, import statements, body text after them) of one module; imports come first."""
    tree = ast.parse(text, f"{name}.py")
    nodes = list(tree.body)
    first = nodes[0] if nodes else None
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    docstring = ast.get_source_segment(text, first) if is_doc else None  # as written, quotes included
    header_end = nodes[0].end_lineno if docstring is not None else 0
    imports = []
    for node in nodes[1 if docstring is not None else 0 :]:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        imports.append(node)
        header_end = node.end_lineno
    later = [n for n in nodes[len(imports) + (docstring is not None) :] if isinstance(n, (ast.Import, ast.ImportFrom))]
    if later:
        raise BundleError(
            f"verifier/{name}.py imports at line {later[0].lineno}, after its body began; move the "
            "import to the top so the bundle can hoist it"
        )
    body = "".join(text.splitlines(keepends=True)[header_end:]).strip("\n")
    return docstring, imports, body


def source() -> str:
    """The single-file verifier, the same text for the same package sources."""
    plain: set[str] = set()
    names_from: dict[str, set[str]] = {}
    defined: dict[str, str] = {}
    bodies = []
    package_doc = None
    for name in MODULES:
        docstring, imports, body = _split(name, (PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        if name == "__init__":
            package_doc = docstring
        for node in imports:
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "polarstack"):
                continue  # the package's own names: one namespace in the bundle
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for module in modules:
                if module != "__future__" and module.split(".")[0] not in sys.stdlib_module_names:
                    raise BundleError(
                        f"verifier/{name}.py imports {module}, which is not in the standard library; "
                        "the bundled verifier runs where only the standard library is installed"
                    )
            if isinstance(node, ast.ImportFrom):
                if any(a.asname for a in node.names):
                    raise BundleError(f"verifier/{name}.py renames an import (as); import it by its own name")
                if node.module != "__future__":
                    names_from.setdefault(node.module, set()).update(a.name for a in node.names)
            else:
                if any(a.asname for a in node.names):
                    raise BundleError(f"verifier/{name}.py renames an import (as); import it by its own name")
                plain.update(a.name for a in node.names)
        for node in ast.parse(body).body:
            for bound in _defined(node):
                if defined.setdefault(bound, name) != name:
                    raise BundleError(
                        f"{bound} is defined in verifier/{defined[bound]}.py and verifier/{name}.py; "
                        "the bundle holds one namespace, so give one of them another name"
                    )
        bodies.append(body)
    if package_doc is None:
        raise BundleError("verifier/__init__.py has no docstring to head the bundle with")
    header = [package_doc, "", "from __future__ import annotations", ""]
    header += [f"import {module}" for module in sorted(plain)]
    header += [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(names_from.items())]
    return "\n".join(header) + "\n\n" + "\n\n\n".join(bodies) + ENTRY


def write(path: Path) -> Path:
    """Write the single-file verifier to `path` (a task's eval/verifier.py); returns `path`."""
    path.write_text(source(), encoding="utf-8")
    return path
