"""Grade a test command's output the way Polar's `test_on_output` evaluator does, by the rule recorded in
configs/upstream/polar-grading.json (this project's own implementation of that record, for the tests: the
verifier's output must hold exactly one status line, and it must be the verifier's decision); and build the
evaluation a slime Sample then carries (`evaluation`, `sample_metadata`), from the record's names alone, so the
project's readers (the in-job gate) are tested on the shape Polar's node produces, not an invented one."""

from __future__ import annotations

import json
import re
from pathlib import Path

RECORD = json.loads((Path(__file__).resolve().parents[1] / "configs/upstream/polar-grading.json").read_text())
RULE = RECORD["parse"]
SHAPE = RECORD["evaluation"]  # where _grade's report lands (BasePatchEvaluator.evaluate)
CARRIED = RECORD["carried"]  # the gateway's merge and the bridge's copy to the Sample
ARTIFACTS = "/tmp/polar-session/artifacts"  # a session's artifacts directory: only paths under it reach the metadata
_ANSI = re.compile(RULE["ansi_pattern"])


def node_id(text: str) -> str:
    """The id a status line names: cut at the first `id_cut_at`, then the last one or two `id_separator` parts."""
    head = text.split(RULE["id_cut_at"], 1)[0]
    parts = head.split(RULE["id_separator"])
    if len(parts) > 2:
        return RULE["id_join_last_two"].join(parts[-2:])
    return parts[-1]


def status_lines(output: str) -> list[tuple[str, str]]:
    """(status, node id) for every line Polar reads as a status, in order (empty ids are skipped)."""
    found = []
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).strip()
        if not any(line.startswith(word) for word in RULE["statuses"]):
            continue
        words = line.split(None, 1)
        if len(words) == 2 and node_id(words[1]):
            found.append((words[0], node_id(words[1])))
    return found


def parsed_map(output: str) -> dict[str, str]:
    """Node id -> status, the last line per id winning."""
    return {node: status for status, node in status_lines(output)}


def reward(stdout: str, stderr: str, expected: dict[str, str]) -> float:
    """1.0 when the parsed map of stdout + stderr is non-empty and equals `expected` (ids normalized alike)."""
    parsed = parsed_map(stdout + stderr)
    wanted = {node_id(key): value for key, value in expected.items()}
    return 1.0 if parsed and parsed == wanted else 0.0


def _graded(evaluator_metadata: dict, outcome_reward: float) -> dict:
    """trajectory.metadata["evaluation"] as the gateway merges an EvalResult (CARRIED["gateway"])."""
    merged = dict.fromkeys(CARRIED["gateway"]["keys_before_metadata"])
    merged.update(strategy=SHAPE["mode"], outcome_reward=outcome_reward)
    assert list(merged) == CARRIED["gateway"]["keys_before_metadata"], merged
    assert set(evaluator_metadata) <= set(SHAPE["metadata_keys"]), evaluator_metadata
    return {**merged, **evaluator_metadata}


def evaluation(stdout: str, stderr: str, return_code: int, expected: dict[str, str]) -> dict:
    """The evaluation of a session whose test command printed `stdout` and `stderr` and exited `return_code`,
    graded against `expected`: the report `_grade` builds (each recorded key from its recorded source), stored
    under the recorded key beside the mode, the patch's path and the output's path (the output text itself stays in
    a log file), merged by the gateway. A recorded source not handled here raises KeyError: the evaluator changed,
    read it again."""
    parsed = parsed_map(stdout + stderr)
    wanted = {node_id(key): value for key, value in expected.items()}
    resolved = bool(parsed) and parsed == wanted
    sources = {
        "False": False,
        RECORD["grade"]["resolved"]: resolved,
        "result.return_code": return_code,
        SHAPE["report"]["parsed_tests"]: parsed,
        SHAPE["report"]["expected_tests"]: wanted,
    }
    report = {key: sources[source] for key, source in SHAPE["report"].items()}
    metadata = {
        "mode": SHAPE["mode"],
        "patch_path": f"{ARTIFACTS}/patch.diff",
        SHAPE["report_key"]: report,
        SHAPE["output_path_key"]: f"{ARTIFACTS}/expected_output.test_output.log",
    }
    return _graded(metadata, 1.0 if resolved else 0.0)


def unapplied(patch: str) -> dict:
    """The evaluation of a session whose patch did not apply on the fresh runtime: `_grade` never ran, so the report
    is the one `evaluate` starts with (failed_apply_patch set) and the patch's head rides in the metadata."""
    report = dict.fromkeys(SHAPE["report_before_grade"], False)
    report["failed_apply_patch"] = True
    metadata = {
        "mode": SHAPE["mode"],
        "patch_path": f"{ARTIFACTS}/patch.diff",
        SHAPE["report_key"]: report,
        "apply_patch_output_path": f"{ARTIFACTS}/apply_patch.stdout.log",
        "apply_patch_output": "error: patch failed: solution.py:1\n",
        "apply_patch_patch_head": patch[:4000],
    }
    return _graded(metadata, 0.0)


def sample_metadata(evaluated: dict) -> dict:
    """A slime Sample's metadata holding `evaluated` where Polar's bridge copies it (CARRIED["sample"]["path"])."""
    for key in reversed(CARRIED["sample"]["path"]):
        evaluated = {key: evaluated}
    return evaluated
