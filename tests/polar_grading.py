"""Grade a test command's output the way Polar's `test_on_output` evaluator does, by the rule recorded in
configs/upstream/polar-grading.json (this project's own implementation of that record, for the tests: the
verifier's output must hold exactly one status line, and it must be the verifier's decision)."""

from __future__ import annotations

import json
import re
from pathlib import Path

RECORD = json.loads((Path(__file__).resolve().parents[1] / "configs/upstream/polar-grading.json").read_text())
RULE = RECORD["parse"]
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
