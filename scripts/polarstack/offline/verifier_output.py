"""The verifier's output against Polar's grading as recorded (configs/upstream/polar-grading.json, issue 25): the
verifier writes only the recorded status words, and no detail it renders can break a line where Polar's reader
splits, carry what the recorded ANSI pattern removes, or hold the node id's recorded cut or separator."""

from __future__ import annotations

import json
import re

from polarstack.pins import repo_root
from polarstack.reward.verifier import verdict

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
