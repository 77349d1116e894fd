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
line. And where the grade lands (the record's "evaluation"): in test_on_output.py, the dict literal `_grade` assigns
to `report` (each key with the source of its value: `exit_code` is the test command's return code, `parsed_tests`
the parsed map), what `parsed` and `expected` are and the file the joined output is written to (only its path
reaches the metadata); in _patch_utils.py, `BasePatchEvaluator.evaluate`'s `metadata[...] = report` (the key the
report is stored under), every key it sets, the report it starts with before `_grade` runs and the reward it
returns; the class's MODE. How Polar's gateway and slime bridge carry that metadata to a slime Sample is in another
repository (NVIDIA-NeMo/ProRL-Agent-Server) and was read by hand; the record says so (`CARRIED`).
tests/polar_grading.py grades output and builds a Sample's evaluation by this record (the tests' own
implementation), the verifier's line rule (scripts/polarstack/reward/verifier/verdict.py) is checked against it in
tests/unit/reward, and `make verify-offline` (polarstack.offline.verifier_output) checks that every key the in-job
gate (polarstack.train.gate) reads is one the record holds.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from polarstack.pins import pin

EVALUATOR = "src/polar/trajectory/evaluator/test_on_output.py"
PATCH_UTILS = "src/polar/trajectory/evaluator/_patch_utils.py"
# Read by hand, not by this script (another repository than --polar): how the evaluator's metadata reaches a Sample.
CARRIED = {
    "gateway": {
        "repo": "NVIDIA-NeMo/ProRL-Agent-Server",
        "commit": pin("POLAR_COMMIT"),
        "file": "src/polar/gateway/node.py",
        "function": "GatewayNodeManager._merge_eval_result",
        "fact": "trajectory.metadata['evaluation'] = {'strategy': evaluator_spec.strategy, 'outcome_reward': "
        "eval_result.outcome_reward, 'trace_rewards': eval_result.trace_rewards, **eval_result.metadata}",
        "keys_before_metadata": ["strategy", "outcome_reward", "trace_rewards"],
    },
    "sample": {
        "repo": "NVIDIA-NeMo/ProRL-Agent-Server",
        "commit": "063c94824aea5ae7f7687acec23f172a552794c1 (adapter.py is not stored at 01bc72d5)",
        "file": "src/slime_bridge/adapter.py",
        "function": "_build_sample, _build_dummy_sample",
        "fact": "Sample.metadata['polar']['trajectory_metadata'] = deepcopy(result.trajectory.metadata)",
        "path": ["polar", "trajectory_metadata", "evaluation"],
    },
    "read": "by hand, not by this script",
}


def _function(tree: ast.AST, name: str, where: str = EVALUATOR) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise SystemExit(f"{where}: no function {name}; the evaluator changed, read it again")


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


def _assigned(node: ast.AST, name: str) -> list[ast.expr]:
    """The values assigned to the plain name `name` inside `node` (`name = ...`, `name: T = ...`)."""
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            found.append(n.value)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name and n.value:
            found.append(n.value)
    return found


def _one(values: list, what: str, where: str = EVALUATOR):
    if len(values) != 1:
        raise SystemExit(f"{where}: {what} is not where it was ({len(values)} found); read it again")
    return values[0]


def _constant_keys(node: ast.Dict, what: str, where: str) -> list[str]:
    if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        raise SystemExit(f"{where}: {what} has a key that is not a literal string; read it again")
    return [k.value for k in node.keys]


def read_report(tree: ast.AST) -> dict:
    """The report `_grade` returns: each key with the source of its value, what `parsed` and `expected` are, what
    the return code is of, and the file the joined output is written to (its text is in no key of the report)."""
    grade = _function(tree, "_grade")
    report = _one([v for v in _assigned(grade, "report") if isinstance(v, ast.Dict)], "_grade's report = {...}")
    returned = [
        r.value.elts[0].id
        for r in ast.walk(grade)
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and isinstance(r.value.elts[0], ast.Name)
    ]
    if returned != ["report"]:
        raise SystemExit(f"{EVALUATOR}: _grade no longer returns (report, path); read it again")
    keys = _constant_keys(report, "_grade's report", EVALUATOR)
    command = _one([v for v in _assigned(grade, "result") if isinstance(v, ast.Await)], "_grade's result = await")
    call = command.value
    if not isinstance(call, ast.Call) or not call.args:
        raise SystemExit(f"{EVALUATOR}: _grade's result is not a call of the test command; read it again")
    written = _one(
        [
            c.func.value
            for c in _calls(grade, "write_text")
            if c.args and isinstance(c.args[0], ast.Name) and c.args[0].id == "output"
        ],
        "_grade's <path>.write_text(output)",
    )
    output_file = (
        _one(_assigned(grade, written.id), f"_grade's {written.id} = ...") if isinstance(written, ast.Name) else written
    )
    return {
        "report": dict(zip(keys, map(ast.unparse, report.values), strict=True)),
        "result": f"{ast.unparse(call.func)}({ast.unparse(call.args[0])}, ...)",
        "parsed": ast.unparse(_one(_assigned(grade, "parsed"), "_grade's parsed = ...")),
        "expected": ast.unparse(_one(_assigned(grade, "expected"), "_grade's expected = ...")),
        "output_file": ast.unparse(output_file),
    }


def read_mode(tree: ast.AST) -> str:
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name == "TestOnOutputEvaluator":
            for value in (v for v in _assigned(cls, "MODE") if isinstance(v, ast.Constant)):
                return value.value
    raise SystemExit(f"{EVALUATOR}: no TestOnOutputEvaluator.MODE = '...'; read it again")


def read_storage(tree: ast.AST) -> dict:
    """How `BasePatchEvaluator.evaluate` stores `_grade`'s answer: `report, path = await self._grade(...)`, then
    `metadata[K] = report` (K: where the gate reads the report) and `metadata[P] = str(path)`; every key it sets;
    the report it starts with (what a sample whose patch was empty or did not apply carries); its reward."""
    evaluate = _function(tree, "evaluate", PATCH_UTILS)
    graded = _one(
        [
            n.targets[0]
            for n in ast.walk(evaluate)
            if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Await)
            and isinstance(n.value.value, ast.Call)
            and isinstance(n.value.value.func, ast.Attribute)
            and n.value.value.func.attr == "_grade"
        ],
        "evaluate's ... = await self._grade(...)",
        PATCH_UTILS,
    )
    if not (
        isinstance(graded, ast.Tuple) and len(graded.elts) == 2 and all(isinstance(e, ast.Name) for e in graded.elts)
    ):
        raise SystemExit(f"{PATCH_UTILS}: evaluate no longer unpacks (report, path) from _grade; read it again")
    report_name, path_name = (e.id for e in graded.elts)
    initial = _one(
        [v for v in _assigned(evaluate, "metadata") if isinstance(v, ast.Dict)], "metadata = {...}", PATCH_UTILS
    )
    keys = _constant_keys(initial, "evaluate's metadata", PATCH_UTILS)
    start = initial.values[keys.index("report")] if "report" in keys else None
    if not isinstance(start, ast.Dict) or ast.unparse(initial.values[keys.index("mode")]) != "self.MODE":
        raise SystemExit(f"{PATCH_UTILS}: evaluate's metadata no longer starts with mode and a report; read it again")
    stored = [
        (n.targets[0].slice.value, ast.unparse(n.value))
        for n in ast.walk(evaluate)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Subscript)
        and isinstance(n.targets[0].value, ast.Name)
        and n.targets[0].value.id == "metadata"
        and isinstance(n.targets[0].slice, ast.Constant)
    ]
    report_key = _one([k for k, v in stored if v == report_name], f"metadata[...] = {report_name}", PATCH_UTILS)
    path_key = _one(
        [k for k, v in stored if v == f"str({path_name})"], f"metadata[...] = str({path_name})", PATCH_UTILS
    )
    rewards = [
        ast.unparse(k.value)
        for c in ast.walk(evaluate)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "EvalResult"
        for k in c.keywords
        if k.arg == "outcome_reward" and report_name in ast.unparse(k.value)
    ]
    return {
        "stored_by": "BasePatchEvaluator.evaluate",
        "metadata_keys": list(dict.fromkeys(keys + [k for k, _ in stored])),
        "report_key": report_key,
        "output_path_key": path_key,
        "report_before_grade": _constant_keys(start, "evaluate's first report", PATCH_UTILS),
        "outcome_reward": _one(rewards, f"EvalResult(outcome_reward=... {report_name} ...)", PATCH_UTILS),
    }


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
            "How Polar's test_on_output evaluator turns the test command's output into a reward (grade, parse) and "
            "where that grade lands in the evaluation metadata (evaluation), read with ast by "
            "scripts/tools/record_polar_grading.py (no code copied); how the metadata reaches a slime Sample "
            "(carried) was read by hand. tests/polar_grading.py grades and builds a Sample's evaluation by it; the "
            "verifier's output rule (verifier/verdict.py) must leave exactly one status line of its own under it; "
            "the in-job gate (train/gate.py) reads only keys it holds (make verify-offline)."
        ),
        "repo": args.repo,
        "commit": args.commit,
        "files": [EVALUATOR, PATCH_UTILS],
        "also_in": "Fraser-Greenlee/ProRL-Agent-Server-1 at 006edf09 (same evaluator); not stored for "
        "NVIDIA-NeMo/ProRL-Agent-Server",
        "grade": read_grade(evaluator),
        "parse": dict(read_parse(evaluator), ansi_pattern=read_ansi(patch_utils)),
        "evaluation": {"mode": read_mode(evaluator), **read_storage(patch_utils), **read_report(evaluator)},
        "carried": CARRIED,
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
