"""verify-offline: the rehearsal's readers read what the pinned upstreams write (configs/upstream/rehearsal-keys.json).

Each recorded fact is an exact line of a pinned source (scripts/tools/record_rehearsal_keys.py). This check:
- the record's revisions are the pins (SLIME_COMMIT, SGLANG_VERSION; Polar at the recorded revision, named);
- the report's parsers accept what those lines write: slime's `step N: {...}` / `perf N: {...}` f-strings are
  formatted from the recorded text and parsed by polarstack.checks.rehearsal_report, and the metric names the report
  reads are the recorded keys; a sample carrying Polar's recorded metadata keys is counted by
  polarstack.train.learning_signal (session, tool call, clipping, placeholder, unparsed tool call);
- the sources still say so: sglang's lines are searched in the pinned wheel's own source, slime's at SLIME_COMMIT
  in a local clone when there is one (POLARSTACK_SLIME_GIT), else the record stands (said in the detail).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarstack.checks import rehearsal_report
from polarstack.engine import tool_parser
from polarstack.engine.emulator.tokenizer_manager import length_problem
from polarstack.engine.protocol import source_dir
from polarstack.errors import StackError
from polarstack.pins import pins, repo_root
from polarstack.train import gate, learning_signal, rehearsal_run

RECORD = "configs/upstream/rehearsal-keys.json"
DEFAULT_SLIME_GIT = "/work/.mirror/THUDM+slime/repo"  # where this project's sessions keep slime's mirror; optional


def _report_settings() -> dict[str, Any]:
    import yaml

    return (yaml.safe_load((repo_root() / "configs/train/preflight.yaml").read_text()) or {}).get("report") or {}


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def _fstring(text: str) -> str:
    """The template of the f-string in a recorded `logger.info(f"...")` line."""
    match = re.search(r'f"(.*)"\)', text)
    return match.group(1) if match else ""


def parser_problems(facts: dict[str, Any]) -> list[str]:
    problems = []
    step = _fstring(facts["train_step_line"]["text"]).format(
        role_tag="", accumulated_step_id=3, log_dict={"train/loss": 0.5, "train/grad_norm": float("nan")}
    )
    perf = _fstring(facts["perf_line"]["text"]).format(rollout_id=2, log_dict={"perf/rollout_time": 12.5})
    parsed = rehearsal_report.parse_slime_log(f"[2026-12-01 00:00:00] model.py:909 - {step}\n{perf}")
    if [s.get("step") for s in parsed["steps"]] != [3] or parsed["steps"][0].get("train/loss") != 0.5:
        problems.append(f"the report does not parse slime's training-step line ({facts['train_step_line']['text']})")
    if [p.get("rollout") for p in parsed["perf"]] != [2]:
        problems.append(f"the report does not parse slime's perf line ({facts['perf_line']['text']})")
    for name, constant in (
        ("loss_key", rehearsal_report.LOSS_KEY),
        ("grad_norm_key", rehearsal_report.GRAD_KEY),
        ("rollout_time_key", rehearsal_report.ROLLOUT_TIME_KEY),
    ):
        if facts[name]["key"] != constant:
            problems.append(f"the report reads {constant}, slime writes {facts[name]['key']} ({facts[name]['file']})")
    return problems


def verdict_problems(facts: dict[str, Any], report_settings: dict[str, Any] | None = None) -> list[str]:
    """Issue 32 point 7: the report's tolerances mean what slime's lines say. The log-prob difference is logged
    under `train/` + the reported_loss key, and slime's --ci-test bounds that key by the report's default; a step line
    formatted from the recorded template above the bound fails `logprob_mismatch`, one at it passes; pg_loss is
    -ratio x advantage (0 with zero advantages), logged as the report reads it; preflight.yaml is not looser."""
    problems = []
    prefix = facts["train_metric_prefix"]["key"]
    logged = re.search(r'reported_loss\["(\w+)"\]', facts["logprob_abs_diff_key"]["text"])
    if not logged or prefix + logged.group(1) != rehearsal_report.LOGPROB_DIFF_KEY:
        problems.append(
            f"slime logs the log-prob difference as {facts['logprob_abs_diff_key']['text']!r} under {prefix!r}, the "
            f"report reads {rehearsal_report.LOGPROB_DIFF_KEY}"
        )
    bound = re.search(r'assert log_dict\["([^"]+)"\] <= ([0-9.]+)', facts["logprob_abs_diff_ci_bound"]["text"])
    if not bound or bound.group(1) != rehearsal_report.LOGPROB_DIFF_KEY:
        problems.append(f"slime's --ci-test does not bound {rehearsal_report.LOGPROB_DIFF_KEY} ({RECORD})")
    elif float(bound.group(2)) != rehearsal_report.DEFAULT_MAX_LOGPROB_DIFF:
        problems.append(
            f"slime's --ci-test bounds {bound.group(1)} by {bound.group(2)}, the report's default is "
            f"{rehearsal_report.DEFAULT_MAX_LOGPROB_DIFF}"
        )
    configured = (report_settings or {}).get("max_train_rollout_logprob_abs_diff")
    if bound and configured is not None and float(configured) > float(bound.group(2)):
        problems.append(
            f"configs/train/preflight.yaml report.max_train_rollout_logprob_abs_diff={configured} is looser than "
            f"slime's own --ci-test bound {bound.group(2)}"
        )
    if "|" not in facts["logprob_abs_diff_mean"]["key"] or ".abs()" not in facts["logprob_abs_diff_mean"]["text"]:
        problems.append("slime's train_rollout_logprob_abs_diff is no longer a mean absolute difference")
    if prefix + re.search(r'"(\w+)"', facts["pg_loss_key"]["text"]).group(1) != rehearsal_report.PG_LOSS_KEY:
        problems.append(
            f"slime logs pg_loss as {facts['pg_loss_key']['text']!r}, the report reads {rehearsal_report.PG_LOSS_KEY}"
        )
    if not re.search(r"= -ratio \* advantages$", facts["pg_loss_is_advantage_times_ratio"]["text"]):
        problems.append(
            "slime's policy-gradient loss is no longer -ratio x advantage: 0 with zero advantages no longer holds "
            "(the report's loss_and_grad rule rests on it)"
        )
    template = _fstring(facts["train_step_line"]["text"])
    key = prefix + (logged.group(1) if logged else "")

    def judged(value: float) -> str:
        line = template.format(role_tag="", accumulated_step_id=0, log_dict={"train/loss": 0.1, key: value})
        return rehearsal_report.logprob_mismatch({"slime": rehearsal_report.parse_slime_log(line)}).verdict

    limit = float(bound.group(2)) if bound else rehearsal_report.DEFAULT_MAX_LOGPROB_DIFF
    if judged(limit) != "pass" or judged(limit * 1.5) != "fail":
        problems.append(
            f"the report does not fail slime's logged {key} above {limit} and pass it at {limit} ({RECORD})"
        )
    return problems


@dataclass(frozen=True)
class _Sample:
    """The fields of slime's Sample (slime/utils/types.py) that polarstack.train.learning_signal reads."""

    metadata: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    status: str = "completed"


def polar_problems(facts: dict[str, Any]) -> list[str]:
    keys = {name: fact["key"] for name, fact in facts.items()}
    polar = {
        keys["session_id"]: "s-1",
        keys["response_messages"]: {"response_messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]},
        keys["token_clipping"]: {"strategy": "causal_prefix"},
        "training_filter": {"reason": keys["parser_invalid"]},
        keys["placeholder"]: True,
    }
    sample = _Sample(metadata={"polar": polar}, loss_mask=[1], reward=1.0)
    got = learning_signal.group_summary([sample], lambda s: 1.0, lambda g: 1)
    expected = {"sessions_with_tool_calls": 1, "clipped": 1, "placeholders": 1, "parser_invalid_tool_calls": 1}
    wrong = [k for k, v in expected.items() if got[k] != v]
    # Sessions Polar's adapter masks (issue 26 point 2): its training_filter reasons and the session's status.
    outcomes = {
        "failed": {"training_filter": {"reason": keys["session_error"]}},
        "timed_out": {"training_filter": {"reason": keys["session_timeout"]}},
        "timed_out ": {"training_filter": {"reason": keys["agent_timeout"]}},
        "failed ": {keys["session_status"]: "ERROR"},
    }
    for want, meta in outcomes.items():
        one = _Sample(metadata={"polar": meta}, loss_mask=[0])
        if learning_signal.session_outcome(one) != want.strip():
            wrong.append(f"{want.strip()} ({next(iter(meta))})")
    return [f"learning_signal does not read Polar's adapter keys for {', '.join(wrong)} ({RECORD})"] if wrong else []


def worker_problems(facts: dict[str, Any]) -> list[str]:
    """The gate reads Polar's drop counters under the names the worker exports (`<key>_delta`)."""
    problems = []
    suffix = facts["delta_suffix"]["key"]
    for name, key in gate.POLAR_DROP_COUNTERS.items():
        if name not in facts:
            problems.append(f"{RECORD} records no Polar counter for {name} (the gate reads {key})")
            continue
        if facts[name]["key"] != key:
            problems.append(f"the gate reads {key}, Polar's worker counts {facts[name]['key']} ({facts[name]['file']})")
        if gate.polar_drops({f"{facts[name]['key']}{suffix}": 2})[name] != 2.0:
            problems.append(f"gate.polar_drops does not read Polar's exported {facts[name]['key']}{suffix}")
    return problems


def context_limit_problems(facts: dict[str, Any]) -> list[str]:
    """The markers the watch looks for are sglang's own refusals (the emulator says them in full; the differential
    test holds it to the real engine)."""
    problems = []
    said = " ".join(filter(None, [length_problem(40, None, 32), length_problem(20, 20, 32)]))
    for name in ("context_limit_total", "context_limit_input"):
        marker = facts[name]["key"]
        if marker not in learning_signal.CONTEXT_LIMIT_MARKERS:
            problems.append(f"learning_signal does not look for sglang's refusal {marker!r}")
        if marker not in said:
            problems.append(f"sglang's refusal {marker!r} is not what the emulator's length_problem says")
    return problems


def reload_problems(io_struct: str) -> list[str]:
    """Issue 32 point 8: the rehearsal's 7B reload sends what sglang's /update_weights_from_disk reads: the fields of
    UpdateWeightFromDiskReqInput in the pinned wheel's io_struct.py include every key RELOAD_SCRIPT posts."""

    match = re.search(r"class UpdateWeightFromDiskReqInput\(.*?\):\n(.*?)\n\n\nclass ", io_struct, re.S)
    if not match:
        return ["sglang's io_struct.py has no UpdateWeightFromDiskReqInput: the 7B reload's request is unchecked"]
    fields = set(re.findall(r"^    (\w+):", match.group(1), re.M))
    body = re.search(r"body = json\.dumps\(\{(.*?)\}\)", rehearsal_run.RELOAD_SCRIPT)
    sent = set(re.findall(r"'(\w+)':", body.group(1))) if body else set()
    missing = sorted(sent - fields)
    problems = []
    if not sent or missing:
        problems.append(f"the 7B reload posts {sorted(sent)}, sglang's UpdateWeightFromDiskReqInput has no {missing}")
    if "model_path" not in fields:
        problems.append("sglang's UpdateWeightFromDiskReqInput no longer takes model_path")
    return problems


def source_problems(data: dict[str, Any], slime_git: str | None) -> tuple[list[str], str]:
    problems, notes = [], []
    try:
        root = source_dir()
        for fact in data["sglang"]["facts"].values():
            path = Path(root) / fact["file"]
            text = path.read_text(errors="replace") if path.is_file() else tool_parser.wheel_text(fact["file"])
            if fact["needle"] not in text:
                problems.append(f"sglang {data['sglang']['version']} {fact['file']} no longer has {fact['needle']!r}")
            if fact["file"].endswith("managers/io_struct.py"):
                problems += reload_problems(text)
        notes.append("sglang lines found in the pinned wheel")
    except StackError as exc:
        problems.append(f"cannot read the pinned sglang source ({exc.message})")
    if slime_git and Path(slime_git).exists():
        commit = data["slime"]["commit"]
        for fact in data["slime"]["facts"].values():
            proc = subprocess.run(
                ["git", "-C", slime_git, "show", f"{commit}:{fact['file']}"], capture_output=True, text=True
            )
            lines = proc.stdout.splitlines()
            if proc.returncode != 0 or len(lines) < fact["line"] or fact["needle"] not in lines[fact["line"] - 1]:
                problems.append(f"slime {commit[:12]} {fact['file']} l.{fact['line']} is not {fact['needle']!r}")
        notes.append(f"slime lines re-read at {commit[:12]}")
    else:
        notes.append("slime lines from the record (set POLARSTACK_SLIME_GIT to a slime clone to re-read them)")
    return problems, "; ".join(notes)


def check(slime_git: str | None = None) -> tuple[list[str], str]:
    data = record()
    problems = []
    table = pins()
    if data["slime"]["commit"] != table["SLIME_COMMIT"]:
        problems.append(f"{RECORD} was recorded at slime {data['slime']['commit'][:12]}, not SLIME_COMMIT; rerecord it")
    if data["sglang"]["version"] != table["SGLANG_VERSION"]:
        problems.append(f"{RECORD} names sglang {data['sglang']['version']}, not SGLANG_VERSION; rerecord it")
    if data["polar"]["polar_commit"] != table["POLAR_COMMIT"]:
        problems.append(f"{RECORD}'s Polar facts were read for another POLAR_COMMIT; reread them")
    problems += parser_problems(data["slime"]["facts"])
    problems += verdict_problems(data["slime"]["facts"], _report_settings())
    problems += polar_problems(data["polar"]["facts"])
    problems += worker_problems(data["polar_worker"]["facts"])
    problems += context_limit_problems(data["sglang"]["facts"])
    found, detail = source_problems(
        data,
        slime_git
        or os.environ.get("POLARSTACK_SLIME_GIT")
        or (DEFAULT_SLIME_GIT if Path(DEFAULT_SLIME_GIT).exists() else None),
    )
    return problems + found, detail


__all__ = [
    "check",
    "record",
    "parser_problems",
    "verdict_problems",
    "reload_problems",
    "polar_problems",
    "worker_problems",
    "context_limit_problems",
]
