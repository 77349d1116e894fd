"""No text of the repository names a module of the package's old flat layout (issue 35 point 6): every project path
written as `polarstack/<x>.py`, `scripts/{polarstack,entrypoints,tools}/<x>.py` or `tests/<x>.py`, in any tracked file
(docstrings, comments, docs, and the launch.sh the plan generates, which tests/fixtures/single-node-plans.json holds
as rendered), names a file that exists; every dotted `polarstack.<module>[.<name>]` names a module that exists and a
name bound at its top level; and the file names of the flat layout's modules (FLAT_LAYOUT) that no file has any more
appear nowhere. Before the fix the generated launch.sh named exposure.py and assets.py directly under polarstack/
(they live under polarstack/stack/) and cli/main.py's docstring listed the flat layout's cli_<group> modules.
This file spells no stale name out, so that `git grep` for one finds nothing."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

# A project path: not the tail of a longer path (`ray/scripts/scripts.py` is Ray's, `/opt/polarstack/...` an image's).
PROJECT_PATH = re.compile(
    r"(?<![\w./-])(?:polarstack/|scripts/(?:polarstack|entrypoints|tools)/|tests/)[\w./-]*?\.py\b"
)
DOTTED = re.compile(r"(?<![\w./-])polarstack(?:\.[A-Za-z_]\w*)+")
# Dotted names that are not module paths of the package: the name protocol.py gives the sglang module it loads, a
# module attribute, and a made-up import in a test's fixture source.
NOT_MODULES = {"polarstack._sglang_protocol", "polarstack.__file__", "polarstack.x"}
# The flat layout's module files (git log --diff-filter=RD of scripts/polarstack/), without their .py, whose name no
# file has now. Names as generic as `cli.py`, `train.py` or `verifier.py` (Ray's job CLI, slime's trainer, the task's
# generated eval/verifier.py) are left to the path checks above.
FLAT_LAYOUT = (
    "bridge_check",
    "cli_bench",
    "cli_docker",
    "cli_local",
    "cli_routers",
    "cli_tasks",
    "polar_findings",
    "polar_model",
    "polar_opinion",
    "polar_rules",
    "polar_switch",
    "router_catalog",
    "routing_bench",
    "sglang_protocol",
    "smoke_judge",
    "smoke_route",
    "toolcheck",
    "train_launch",
    "verify_offline",
)
FLAT_NAME = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(n) for n in FLAT_LAYOUT) + r")\.py)\b")


def tracked_texts() -> dict[str, str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout (git ls-files: {done.stderr.strip()})")
    texts = {}
    for name in done.stdout.split():
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images (docs/*.png)
            continue
    assert len(texts) > 100, f"git ls-files listed only {len(texts)} text files"
    return texts


def occurrences(pattern: re.Pattern) -> list[tuple[str, int, str]]:
    found = []
    for name, text in tracked_texts().items():
        for match in pattern.finditer(text):
            found.append((name, text.count("\n", 0, match.start()) + 1, match.group(0)))
    return found


def exists(path: str) -> bool:
    return (SCRIPTS / path).is_file() if path.startswith("polarstack/") else (ROOT / path).is_file()


def test_every_project_path_named_exists():
    named = occurrences(PROJECT_PATH)
    assert any(p == "polarstack/train/cluster_plan.py" for _, _, p in named), "the pattern misses launch.sh's paths"
    missing = [f"{name}:{line}: {path}" for name, line, path in named if not exists(path)]
    assert not missing, "paths that name no file (moved in the layered layout?):\n" + "\n".join(missing)


def top_level_names(module: Path) -> set[str]:
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(dotted: str) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):  # the longest prefix that is a module or a package
        base = SCRIPTS.joinpath(*parts[:end])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            break
    else:
        return "no such module"
    rest = parts[end:]
    if rest and rest[0] not in top_level_names(module):
        return f"{module.relative_to(ROOT)} defines no {rest[0]}"
    return None


def test_every_dotted_module_name_exists():
    named = [o for o in occurrences(DOTTED) if o[2] not in NOT_MODULES]
    assert any(d == "polarstack.train.gate" for _, _, d in named), "the pattern misses the package's module names"
    problems = [f"{name}:{line}: {d} ({why})" for name, line, d in named if (why := dotted_problem(d))]
    assert not problems, "dotted names that name nothing:\n" + "\n".join(problems)


def test_no_file_name_of_the_flat_layout_remains():
    stale = [f"{name}:{line}: {n}" for name, line, n in occurrences(FLAT_NAME)]
    assert not stale, "names of the old flat layout (see scripts/polarstack/*/README.md for the homes):\n" + "\n".join(
        stale
    )


@pytest.mark.parametrize("name", FLAT_LAYOUT)
def test_the_flat_layout_names_are_gone_from_the_tree(name):
    # The list above stays a list of stale names: none of them is a file again.
    assert not list(SCRIPTS.rglob(f"{name}.py")), f"{name}.py exists again; drop it from FLAT_LAYOUT"
