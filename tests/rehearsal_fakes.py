"""Fakes of what slime and Polar write, built from the recorded upstream lines (configs/upstream/rehearsal-keys.json):
samples as Polar's adapter builds them (src/slime_bridge/adapter.py `_build_sample`), slime's training-step and
perf log lines formatted from the recorded f-strings, so a fake cannot drift from the real output unnoticed."""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarstack.checks.rehearsal_report import parse_slime_log
from polarstack.engine.emulator.tokenizer_manager import length_problem
from polarstack.offline.rehearsal_keys import record
from polarstack.paths import TRAINER_RUN_DIR, train_run_dir
from polarstack.train import gate, learning_signal

FACTS = record()
_SESSIONS = itertools.count()  # a fresh session id per sample (id() of a dead object repeats)
POLAR = {name: fact["key"] for name, fact in FACTS["polar"]["facts"].items()}


@dataclass
class Sample:  # the fields of slime's Sample that Polar's adapter fills
    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    reward: Any
    status: str = "completed"
    remove_sample: bool = False
    metadata: dict = field(default_factory=dict)


# sglang's refusal of a turn past the context, as the emulator says it (polarstack.engine.emulator.tokenizer_manager)
CONTEXT_REFUSAL = length_problem(30000, 4096, 32768)


def sample(
    reward=1.0,
    *,
    tool=True,
    trainable=True,
    clipped=False,
    placeholder=False,
    invalid=False,
    session=None,
    outcome=None,
):
    """outcome: None, "failed", "timed_out" (as the adapter marks FAILED / ABORTED sessions: training_filter reason,
    loss mask 0, remove_sample) or "context_limit" (a failed session whose error is sglang's refusal)."""
    polar: dict[str, Any] = {POLAR["session_id"]: session or f"s-{next(_SESSIONS)}"}
    if outcome:
        reason = POLAR["session_timeout"] if outcome == "timed_out" else POLAR["session_error"]
        polar["training_filter"] = {"masked": True, "reason": reason, "detail": "x"}
        polar[POLAR["session_status"]] = "TIMEOUT" if outcome == "timed_out" else "ERROR"
        polar["result_error"] = f"agent exited: API Error 400 {CONTEXT_REFUSAL}" if outcome == "context_limit" else "x"
        status = "aborted" if outcome == "timed_out" else "failed"
        return Sample([1, 2, 3, 4, 5, 6], 3, [0, 0, 0], {"score": 0.0}, status, True, {"polar": polar})
    calls = [{"id": "c1", "type": "function", "function": {"name": "Edit", "arguments": "{}"}}] if tool else []
    polar[POLAR["response_messages"]] = {
        "finish_reason": "stop",
        "response_messages": [{"role": "assistant", "content": "", "tool_calls": calls}],
    }
    if clipped:
        polar[POLAR["token_clipping"]] = {"strategy": "causal_prefix", "dropped_response_tokens": 10}
    if invalid:
        polar["training_filter"] = {"masked": False, "reason": POLAR["parser_invalid"]}
    if placeholder:
        polar[POLAR["placeholder"]] = True
        return Sample([0, 0], 1, [0], {"score": 0.0}, "aborted", True, {"polar": polar})
    mask = [1, 1, 1] if trainable else [0, 0, 0]
    return Sample([1, 2, 3, 4, 5, 6], 3, mask, {"score": reward}, "completed", False, {"polar": polar})


def summary(
    rollout_id: int, groups: list[list[Sample]], dropped: int = 0, polar_metrics: dict | None = None
) -> dict[str, Any]:
    """polar_metrics: what Polar's worker exports for the rollout (e.g. {"polar/dropped_failed_groups_delta": 1})."""
    rows = [learning_signal.group_summary(g, gate.sample_reward, gate.trainable_tokens) for g in groups]
    return learning_signal.rollout_summary(rollout_id, rows, dropped, 10.0, gate.polar_drops(polar_metrics or {}))


def _template(fact: str) -> str:
    return re.search(r'f"(.*)"\)', FACTS["slime"]["facts"][fact]["text"]).group(1)


SLIME_KEYS = {name: fact["key"] for name, fact in FACTS["slime"]["facts"].items()}


def step_line(
    step: int, loss: float = 0.01, grad: float = 0.5, pg_loss: float | None = 0.01, logprob_diff: float | None = 0.02
) -> str:
    """slime's training-step line; pg_loss / logprob_diff None: the key is not logged (slime logs the log-prob
    difference only when the samples carry rollout_log_probs, loss.py l.1074)."""
    log_dict = {"train/loss": loss, "train/grad_norm": grad, "train/kl_loss": 0.0}
    if pg_loss is not None:
        log_dict[SLIME_KEYS["pg_loss_key"]] = pg_loss
    if logprob_diff is not None:
        log_dict[SLIME_KEYS["logprob_abs_diff_key"]] = logprob_diff
    body = _template("train_step_line").format(role_tag="", accumulated_step_id=step, log_dict=log_dict)
    return f"[2026-12-01 09:00:00] model.py:909 - {body}"


def perf_line(rollout: int, seconds: float = 60.0) -> str:
    body = _template("perf_line").format(
        rollout_id=rollout, log_dict={"perf/rollout_time": seconds, "rollout/truncated_ratio": 0.0}
    )
    return f"[2026-12-01 09:00:00] rollout.py:1306 - {body}"


def mixed_groups() -> list[list[Sample]]:
    return [[sample(1.0), sample(0.0), sample(1.0), sample(0.0)] for _ in range(3)]


def passing_evidence() -> dict[str, Any]:
    rollouts = [{**summary(r, mixed_groups()), "phase": "train" if r < 2 else "resume"} for r in range(3)]
    log = "\n".join([step_line(0), perf_line(0), step_line(1), perf_line(1), step_line(2), perf_line(2)])
    return {
        "rollouts": rollouts,
        "slime": parse_slime_log(log),
        "weight_versions": {
            "before": {"http://127.0.0.1:30000": "default"},
            "after_train": {"http://127.0.0.1:30000": "2"},
            "after_resume": {"http://127.0.0.1:30000": "3"},
        },
        "checkpoint": {"after_train": "1", "after_resume": "2"},
        "reward_path": {"task": "HumanEval/0", "canonical_reward": 1.0, "wrong_reward": 0.0},
        "supervisor": {
            "injected_exit": 75,
            "attempts": [
                {"resume": True, "exit": 75, "checkpoint": 2},
                {"resume": True, "exit": 0, "checkpoint": None},
            ],
        },
        "phases": {"up": 120.0, "train": 300.0, "resume": 200.0},
        "seven_b": seven_b_evidence(),
        "first": 2,
        "after_resume": 1,
        "expected_steps": 3,
        "max_dropped_or_clipped_share": 0.5,
        "min_mixed_reward_groups": 1,
    }


def seven_b_evidence(peak: float = 101.3, exit: int = 0, reload_ok: bool = True) -> dict[str, Any]:
    """What rehearsal_run.seven_b_parts records for the 7B's step and reload (peak in decimal GB per trainer GPU)."""
    return {
        "estimate_gb": 116.755,
        "capacity_gb": 140.0,
        "sample_ms": 500,
        "exit": exit,
        "steps": 1 if exit == 0 else 0,
        "peak_gpu_gb": {"0": peak, "1": round(peak - 0.4, 2), "2": round(peak - 0.2, 2)},
        "reload": {
            "engine": "http://127.0.0.1:30000",
            "wanted": "rehearsal-7b-reload",
            "version_before": "default",
            "success": reload_ok,
            "message": "Succeeded to update model weights." if reload_ok else "Failed to load lm_head.weight",
            "seconds": 21.4,
            "version_after": "rehearsal-7b-reload" if reload_ok else "default",
        },
    }


def gpu_log(peak_mib: int, gpus: int = 3) -> str:
    """nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits, sampled three times."""
    return "".join(f"{i}, {peak_mib * f // 4}\n" for f in (1, 4, 2) for i in range(gpus))


class FakeNode:
    """rehearsal_run.Node as a node would answer it after the jobs ran. The trainer as the jobs would leave it: slime's log lines, the gate's rollouts.jsonl, versions, tracker."""

    # Qwen2.5-3B-Instruct's config.json keys as slime's qwen2.5-3B.sh describes them (a fake, not the Hub's file)
    CONFIG = {
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "num_key_value_heads": 2,
        "hidden_size": 2048,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "intermediate_size": 11008,
        "rope_theta": 1000000.0,
    }

    def __init__(self, host_dir=None, fail_job=None, config=None, free=2 * 10**12, step_exit=0, reload_ok=True):
        """host_dir: the run's directory on the host; None: taken from each job's command (TRAINER_RUN_DIR/<run>)."""
        self._host_dir, self.fail_job, self.config = host_dir, fail_job, config or dict(self.CONFIG)
        self.jobs = 0
        self.compose_calls, self.version, self.tracker, self.env_at_up = [], 0, None, None
        self.releases = 0
        self.commands = []
        self.free = free  # bytes free on the checkpoints volume (`df`); None: unreadable
        self.removed = []  # (directory, whether the report was already written)
        self.step_exit, self.reload_ok = step_exit, reload_ok  # the 7B's train-only step and reload
        self.envs_at_up = []  # MODEL_PATH at every `up`
        self.seven_b_commands = []

    def compose(self, args):
        self.compose_calls.append(args[0])
        if args[0] == "up":
            self.env_at_up = self.env_at_up or os.environ.get("MODEL_PATH")
            self.envs_at_up.append(os.environ.get("MODEL_PATH"))
        return 0

    def release_workers(self, config):
        self.releases += 1

    def gate(self, plan):
        pass

    def trainer(self, command):
        if "launch-7b-step.sh" in command:  # the 7B's train-only step: its log line and nvidia-smi's samples
            self.seven_b_commands.append(command)
            host = self._host_dir or train_run_dir() / re.search(rf"{TRAINER_RUN_DIR}/([^/]+)/launch-", command)[1]
            (host / "job-7b-step.log").write_text((step_line(0) + "\n") if self.step_exit == 0 else "OOM\n")
            (host / "7b-gpu-memory.csv").write_text(gpu_log(96_000))
            return self.step_exit, ""
        if "/update_weights_from_disk" in command:
            self.seven_b_commands.append(command)
            ok = self.reload_ok
            return 0, json.dumps(
                {
                    "engine": "http://127.0.0.1:30000",
                    "wanted": "rehearsal-7b-reload",
                    "version_before": "default",
                    "success": ok,
                    "message": "Succeeded to update model weights." if ok else "Failed to load lm_head.weight",
                    "seconds": 20.0,
                    "version_after": "rehearsal-7b-reload" if ok else "default",
                }
            )
        if "/model_info" in command:
            return 0, json.dumps({"http://127.0.0.1:30000": str(self.version) if self.version else "default"})
        if command.startswith("cat ") and command.endswith("config.json"):
            return 0, json.dumps(self.config)
        if command.startswith("cat "):
            return (0, f"{self.tracker}\n") if self.tracker is not None else (1, "")
        if command.startswith("df -B1 --output=avail "):
            return (0, f"    Avail\n{self.free}\n") if self.free is not None else (1, "")
        if command.startswith("rm -rf -- "):
            self.removed.append(
                (command.split(" ", 3)[3], (self._host_dir or Path()).joinpath("rehearsal-report.json").is_file())
            )
            return 0, ""
        self.jobs += 1
        self.host_dir = self._host_dir or train_run_dir() / re.search(rf"{TRAINER_RUN_DIR}/([^/]+)/launch-", command)[1]
        name = "train" if "launch-train.sh" in command else "resume"
        again = name == "resume" and self.tracker == 2  # a restart of job 2 from its own checkpoint
        # slime's train_async.py generates rollout start_rollout_id before its loop: a restart with nothing left to
        # train generates one rollout and trains none
        rollouts = range(0, 2) if name == "train" else range(3, 4) if again else range(2, 3)
        lines = []
        with (self.host_dir / "rollouts.jsonl").open("a") as out:
            for r in rollouts:
                out.write(json.dumps(summary(r, mixed_groups())) + "\n")
                lines += [perf_line(r)] + ([] if again else [step_line(r)])
        log = self.host_dir / f"job-{name}.log"
        log.write_text((log.read_text() if again and log.is_file() else "") + "\n".join(lines) + "\n")
        self.commands.append(command)
        if name == self.fail_job:
            return 1, ""
        self.version += 1
        if not again:
            self.tracker = max(rollouts)
        injected = re.search(r"exit (\d+); fi", command)  # the rehearsal's injected crash after a clean end
        return (int(injected.group(1)) if injected else 0), ""
