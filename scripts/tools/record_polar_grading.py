#!/usr/bin/env python3
"""Record how Polar's `test_on_output` evaluator grades a test command's output (read with `ast`, no code copied).

The evaluator is not stored for NVIDIA-NeMo/ProRL-Agent-Server at any revision the code store holds; it is in the
public forks jxliu1216/ProRL-Agent-Server (c04b8146) and Fraser-Greenlee/ProRL-Agent-Server-1 (006edf09). From a
checkout of one of them (the directory holding src/):

    python scripts/tools/record_polar_grading.py --polar DIR --repo jxliu1216/ProRL-Agent-Server \
        --commit c04b8146832afcba97e9e68e86cde03a09c472f2 > configs/upstream/polar-grading.json

What it reads: in src/polar/trajectory/evaluator/test_on_output.py, how `_grade` joins the command's output
(`stdout + stderr`) and decides `resolved`; in `_parse_expected_output`, the status prefixes a line must start
with and how a line is split into status and node id; in `_normalize_expected_nodeid`, the cut and separator of
the node id; in src/polar/trajectory/evaluator/_patch_utils.py, the pattern of ANSI_ESCAPE_RE removed from each
line. tests/polar_grading.py grades output by this record (the tests' own implementation), and the verifier's
line rule (scripts/polarstack/reward/verifier/verdict.py) is checked against it in tests/unit/reward.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

EVALUATOR = "src/polar/trajectory/evaluator/test_on_output.py"
PATCH_UTILS = "src/polar/trajectory/evaluator/_patch_utils.py"


def _function(tree: ast.AST, name: str) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise SystemExit(f"{EVALUATOR}: no function {name}; the evaluator changed, read it again")


def _calls(node: ast.AST, attribute: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attribute
    ]


def _constant_args(call: ast.Call) -> list:
    return [a.value for a in call.args if isinstance(a, ast.Constant)]


def read_parse(tree: ast.AST) -> dict:
    parse = _function(tree, "_parse_expected_output")
    statuses = [
        [e.value for e in c.args[0].elts]
        for c in _calls(parse, "startswith")
        if c.args and isinstance(c.args[0], ast.Tuple)
    ]
    splits = _calls(parse, "split")
    maxsplit = [k.value.value for c in splits for k in c.keywords if k.arg == "maxsplit"]
    if len(statuses) != 1 or maxsplit != [1] or not _calls(parse, "splitlines") or not _calls(parse, "strip"):
        raise SystemExit(f"{EVALUATOR}: _parse_expected_output no longer reads lines as recorded; read it again")
    uses_ansi = any(
        isinstance(c.func.value, ast.Name) and c.func.value.id == "ANSI_ESCAPE_RE" for c in _calls(parse, "sub")
    )
    normalize = _function(tree, "_normalize_expected_nodeid")
    cuts = [_constant_args(c) for c in sorted(_calls(normalize, "split"), key=lambda c: (c.lineno, c.col_offset))]
    joins = [c.func.value.value for c in _calls(normalize, "join") if isinstance(c.func.value, ast.Constant)]
    if len(cuts) != 2 or len(joins) != 1:
        raise SystemExit(f"{EVALUATOR}: _normalize_expected_nodeid changed shape; read it again")
    return {
        "statuses": statuses[0],
        "split_lines": "str.splitlines",
        "ansi_removed_per_line": uses_ansi,
        "strip": True,
        "status_and_id": "line.split(maxsplit=1): the first whitespace-separated word is the status",
        "id_cut_at": cuts[0][0],
        "id_separator": cuts[1][0],
        "id_join_last_two": joins[0],
        "empty_id_skipped": True,
        "last_wins": True,
    }


def read_grade(tree: ast.AST) -> dict:
    grade = _function(tree, "_grade")
    order = []
    for node in ast.walk(grade):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "output" for t in node.targets):
            order = [n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)]
    rule = None
    for node in ast.walk(grade):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "resolved":
                    rule = ast.unparse(value)
    if order != ["stdout", "stderr"] or rule != "bool(parsed) and parsed == expected":
        raise SystemExit(f"{EVALUATOR}: _grade joins or decides differently ({order}, {rule}); read it again")
    return {"output": "stdout + stderr, concatenated with no separator", "resolved": rule}


def read_ansi(tree: ast.AST) -> str:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ANSI_ESCAPE_RE" for t in node.targets
        ):
            call = node.value
            if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
                return call.args[0].value
    raise SystemExit(f"{PATCH_UTILS}: no ANSI_ESCAPE_RE = re.compile(...); read it again")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--polar", required=True, type=Path, help="a checkout of the fork (the directory with src/)")
    parser.add_argument("--repo", required=True, help="owner/name of the checkout")
    parser.add_argument("--commit", required=True, help="the revision checked out")
    args = parser.parse_args(argv)
    evaluator = ast.parse((args.polar / EVALUATOR).read_text(encoding="utf-8"))
    patch_utils = ast.parse((args.polar / PATCH_UTILS).read_text(encoding="utf-8"))
    record = {
        "what": (
            "How Polar's test_on_output evaluator turns the test command's output into a reward, read with ast by "
            "scripts/tools/record_polar_grading.py (no code copied). tests/polar_grading.py grades by it; the "
            "verifier's output rule (verifier/verdict.py) must leave exactly one status line of its own under it."
        ),
        "repo": args.repo,
        "commit": args.commit,
        "files": [EVALUATOR, PATCH_UTILS],
        "also_in": "Fraser-Greenlee/ProRL-Agent-Server-1 at 006edf09 (same evaluator); not stored for "
        "NVIDIA-NeMo/ProRL-Agent-Server",
        "grade": read_grade(evaluator),
        "parse": dict(read_parse(evaluator), ansi_pattern=read_ansi(patch_utils)),
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
