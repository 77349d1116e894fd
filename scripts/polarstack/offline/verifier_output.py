"""The verifier's output against Polar's grading as recorded (configs/upstream/polar-grading.json, issue 25): the
verifier writes only the recorded status words, and no detail it renders can break a line where Polar's reader
splits, carry what the recorded ANSI pattern removes, or hold the node id's recorded cut or separator.

And the in-job gate's reading of that grade (`gate_problems`): every key polarstack.train.gate reads from a sample
(SAMPLE_PATH, REPORT_KEY, REPORT_READS) is one the record holds, the report's exit code is
the test command's and its parsed map the parser's; and the gate, handed a sample built only from the record's key
names, reads the verifier's refusal from the exit code alone and from the parsed map alone, and no refusal from the
verifier's ordinary FAILED line nor from its PASSED line beside the limits note."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from polarstack.pins import repo_root
from polarstack.reward.verifier import verdict
from polarstack.train import gate

RECORD = "configs/upstream/polar-grading.json"
# Texts a candidate may raise: each str.splitlines separator, ANSI, the id cut and separator, the markers.
_HOSTILE = [
    *(f"x::{sep}PASSED n{sep}" for sep in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
    "\x1b[0m\rPASSED n",
    "a - b::c",
    "(not verified) polarstack-verifier: x",
    "\ud800",
    "y" * 100_000,
]


def problems() -> list[str]:
    record = json.loads((repo_root() / RECORD).read_text())
    rule, found = record["parse"], []
    if list(verdict.STATUS_WORDS) != rule["statuses"]:
        found.append(f"the verifier's status words {verdict.STATUS_WORDS} are not Polar's {rule['statuses']}")
    if record["grade"]["output"].split(",")[0] != "stdout + stderr":
        found.append(
            f"Polar grades {record['grade']['output']!r}; the verifier's one-line rule assumes stdout + stderr"
        )
    ansi = re.compile(rule["ansi_pattern"])
    for text in _HOSTILE:
        line = verdict.failed_line("n", "failed", text)
        detail = line[len("FAILED n (failed: ") : -1]
        broken = (
            len(line.splitlines()) != 1
            or ansi.search(line)
            or rule["id_cut_at"] in detail
            or rule["id_separator"] in detail
            or verdict.is_refusal(line)
            or len(detail) > verdict.DETAIL_LIMIT
        )
        if broken:
            found.append(f"a detail raised as {text[:40]!r} renders as {line[:120]!r}, which Polar's reader splits")
    return found


@dataclass
class _Sample:  # the one field of slime's Sample the gate's refusal reader takes
    metadata: dict = field(default_factory=dict)


def _recorded_parse(output: str, rule: dict) -> dict[str, str]:
    """Node id -> status as the recorded parser reads `output` (the last line per id wins)."""
    ansi, parsed = re.compile(rule["ansi_pattern"]), {}
    for raw in output.splitlines():
        line = ansi.sub("", raw).strip()
        words = line.split(None, 1)
        if len(words) != 2 or not line.startswith(tuple(rule["statuses"])):
            continue
        parts = words[1].split(rule["id_cut_at"])[0].split(rule["id_separator"])
        node = rule["id_join_last_two"].join(parts[-2:]) if len(parts) > 2 else parts[-1]
        if node:
            parsed[node] = words[0]
    return parsed


def _recorded_sample(record: dict, exit_code: int, output: str) -> _Sample:
    """A sample whose evaluation is built from the record's names alone: the report's exit code under the key whose
    value is the command's return code, the parsed map under the key whose value is `parsed`."""
    shape, carried = record["evaluation"], record["carried"]
    sources = {"result.return_code": exit_code, "parsed": _recorded_parse(output, record["parse"])}
    report = {key: sources.get(source) for key, source in shape["report"].items()}
    evaluation: Any = {key: None for key in carried["gateway"]["keys_before_metadata"]}
    evaluation.update({key: None for key in shape["metadata_keys"]})
    evaluation[shape["report_key"]] = report
    for key in reversed(carried["sample"]["path"]):
        evaluation = {key: evaluation}
    return _Sample(metadata=evaluation)


def gate_problems(record: dict | None = None) -> list[str]:
    record = record or json.loads((repo_root() / RECORD).read_text())
    shape, found = record["evaluation"], []
    path = tuple(record["carried"]["sample"]["path"])
    if gate.SAMPLE_PATH != path:
        found.append(f"the gate reads a sample's evaluation at {gate.SAMPLE_PATH}; the record carries it at {path}")
    if gate.REPORT_KEY != shape["report_key"]:
        found.append(
            f"the gate reads evaluation[{gate.REPORT_KEY!r}]; test_on_output stores its report under "
            f"{shape['report_key']!r}"
        )
    for key in gate.REPORT_READS:
        if key not in shape["report"]:
            found.append(
                f"the gate reads report[{key!r}], which test_on_output's report does not hold ({sorted(shape['report'])})"
            )
    meaning = {gate.REPORT_EXIT_CODE: "result.return_code", gate.REPORT_PARSED_TESTS: "parsed"}
    for key, source in meaning.items():
        if shape["report"].get(key, source) != source:
            found.append(f"report[{key!r}] is {shape['report'][key]!r} in the record, not {source!r}")
    if shape["result"] != "runtime.exec(self.test_command, ...)" or shape["parsed"] != "_parse_expected_output(output)":
        found.append(
            f"the report's result and parsed map are no longer the test command's ({shape['result']!r}, "
            f"{shape['parsed']!r})"
        )
    name = "humaneval_verifier"
    refusal = verdict.refusal_line(name) + "\n" + verdict.refusal_note("the sandbox cannot be set up") + "\n"
    failed = verdict.failed_line(name, "failed", "1 check(s) failed") + "\n"
    passed = verdict.limits_note("the watchdog") + "\n" + verdict.passed_line(name) + "\n"
    cases = [  # (what, exit code, output, whether the gate must read a refusal)
        ("the refusal's exit code alone", gate.REFUSAL_EXIT_CODE, failed, True),
        ("the refusal line alone", 1, refusal, True),
        ("the verifier's refusal", gate.REFUSAL_EXIT_CODE, refusal, True),
        ("an ordinary FAILED line", 1, failed, False),
        ("a PASSED line beside the limits note", 0, passed, False),
    ]
    for what, code, output, refused in cases:
        if (gate.refusal_reason(_recorded_sample(record, code, output)) is not None) != refused:
            found.append(
                f"the gate {'misses' if refused else 'reads a refusal in'} {what} (exit {code}) in a "
                "report shaped as recorded"
            )
    return found
