#!/usr/bin/env python3
"""Record where slime, Polar and sglang write what the rehearsal's report reads (configs/upstream/rehearsal-keys.json).

  python scripts/tools/record_rehearsal_keys.py SLIME_GIT [POLAR_GIT] > configs/upstream/rehearsal-keys.json

SLIME_GIT: a clone or bare mirror of THUDM/slime holding SLIME_COMMIT. POLAR_GIT (optional): a clone of
NVIDIA-NeMo/ProRL-Agent-Server holding POLAR_REVISION below; without it the Polar facts are copied from the current
record (they were read with the code store's read_file at that revision, the stored one nearest POLAR_COMMIT).
sglang's facts are searched by `make verify-offline` in the pinned wheel's source itself, so only their needles are
recorded. Each fact is an exact substring (needle) of one file at the pinned revision, the line it is on and that
line's text; `key` is the name the report's code uses for it (polarstack.checks.rehearsal_report, learning_signal).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "configs" / "upstream" / "rehearsal-keys.json"
POLAR_REVISION = "063c94824aea5ae7f7687acec23f172a552794c1"

SLIME = {  # fact: (file, needle, key)
    "train_step_line": (
        "slime/backends/megatron_utils/model.py",
        'logger.info(f"{role_tag}step {accumulated_step_id}: {log_dict}")',
        "step N: {...}",
    ),
    "train_metric_prefix": ("slime/backends/megatron_utils/model.py", 'f"train/{role_tag}{key}": val.mean()', "train/"),
    "loss_key": ("slime/backends/megatron_utils/loss.py", '"loss": loss.clone().detach()', "train/loss"),
    "grad_norm_key": (
        "slime/backends/megatron_utils/model.py",
        'log_dict[f"train/{role_tag}grad_norm"] = grad_norm',
        "train/grad_norm",
    ),
    "perf_line": ("slime/ray/rollout.py", 'logger.info(f"perf {rollout_id}: {log_dict}")', "perf N: {...}"),
    "rollout_time_key": ("slime/ray/rollout.py", 'log_dict["rollout_time"] = rollout_time', "perf/rollout_time"),
    "perf_prefix": (
        "slime/ray/rollout.py",
        'dict_add_prefix(compute_perf_metrics_from_samples(args, samples, rollout_time), "perf/")',
        "perf/",
    ),
    "rollout_extra_metrics": ("slime/ray/rollout.py", "log_dict = {**(rollout_extra_metrics or {})}", "polarstack/"),
    "zero_std_metric": ("slime/ray/rollout.py", 'return {f"zero_std/count_{reward}": len(items)', "zero_std/"),
    "save_iteration": (
        "slime/backends/megatron_utils/actor.py",
        "save(rollout_id, self.model, self.optimizer",
        "iteration = rollout",
    ),
    "resume_start": (
        "slime/backends/megatron_utils/actor.py",
        "start_rollout_id = loaded_rollout_id + 1",
        "tracker + 1",
    ),
    "use_tensorboard": (
        "slime/utils/arguments.py",
        'parser.add_argument("--use-tensorboard", action="store_true", default=False)',
        "--use-tensorboard",
    ),
    "tensorboard_dir": ("slime/utils/tensorboard_utils.py", 'os.environ.get("TENSORBOARD_DIR"', "TENSORBOARD_DIR"),
    "use_wandb": (
        "slime/utils/arguments.py",
        'parser.add_argument("--use-wandb", action="store_true", default=False)',
        "--use-wandb",
    ),
    "wandb_key": (
        "slime/utils/arguments.py",
        'parser.add_argument("--wandb-key", type=str, default=None)',
        "--wandb-key",
    ),
    "tracker_log": ("slime/utils/logging_utils.py", "_TensorboardAdapter(args).log(data=metrics_except_step", "log"),
    # issue 32 point 7: the policy-gradient loss (exactly 0 when every advantage is 0: -ratio x 0) and the mean
    # |training pass - rollout| log-prob difference slime logs, with the bound its own --ci-test asserts
    "pg_loss_key": ("slime/backends/megatron_utils/loss.py", '"pg_loss": pg_loss.clone().detach()', "train/pg_loss"),
    "pg_loss_is_advantage_times_ratio": ("slime/utils/ppo_utils.py", "pg_losses1 = -ratio * advantages", "advantages"),
    "logprob_abs_diff_needs_rollout_logprobs": (
        "slime/backends/megatron_utils/loss.py",
        'if "rollout_log_probs" in batch and batch["rollout_log_probs"]:',
        "rollout_log_probs",
    ),
    "logprob_abs_diff_mean": (
        "slime/backends/megatron_utils/loss.py",
        "train_rollout_logprob_abs_diff = sum_of_sample_mean((log_probs_to_compare - rollout_log_probs).abs())",
        "mean |log_probs - rollout_log_probs|",
    ),
    "logprob_abs_diff_key": (
        "slime/backends/megatron_utils/loss.py",
        'reported_loss["train_rollout_logprob_abs_diff"] = train_rollout_logprob_abs_diff.clone().detach()',
        "train/train_rollout_logprob_abs_diff",
    ),
    "logprob_abs_diff_ci_bound": (
        "slime/backends/megatron_utils/model.py",
        'assert log_dict["train/train_rollout_logprob_abs_diff"] <= 0.1',
        "0.1",
    ),
    # issue 32 point 8: the 7B's train-only step on a synthetic rollout (--load-debug-rollout-data)
    "debug_load_skips_sglang": (
        "slime/utils/arguments.py",
        "skip_sglang = pre.debug_train_only or pre.load_debug_rollout_data is not None",
        "--load-debug-rollout-data",
    ),
    "debug_load_sets_train_only": ("slime/utils/arguments.py", "args.debug_train_only = True", "debug_train_only"),
    "debug_train_only_no_rollout_gpus": ("slime/ray/placement_group.py", "return actor_num_gpus, 0", "0 rollout GPUs"),
    "debug_train_only_no_weight_update": (
        "slime/backends/megatron_utils/actor.py",
        "if self.args.debug_train_only or self.args.debug_rollout_only:",
        "update_weights returns",
    ),
    "debug_load_path_format": (
        "slime/ray/rollout.py",
        "self.args.load_debug_rollout_data.format(rollout_id=rollout_id),",
        "{rollout_id}",
    ),
    "debug_load_samples_key": ("slime/ray/rollout.py", ')["samples"]', "samples"),
    "debug_load_from_dict": (
        "slime/ray/rollout.py",
        "data = [Sample.from_dict(sample) for sample in data]",
        "Sample.from_dict",
    ),
    "debug_load_no_perf_line": ("slime/ray/rollout.py", "if args.load_debug_rollout_data:", "no perf line"),
    "group_norm_needs_full_rollout": (
        "slime/ray/rollout.py",
        "if rewards.shape[-1] == self.args.n_samples_per_prompt * self.args.rollout_batch_size:",
        "n_samples_per_prompt x rollout_batch_size",
    ),
    "no_interval_no_save": ("slime/utils/misc.py", "if interval is None:", "no --save-interval: no save"),
    "disk_reload_calls_engine": (
        "slime/ray/actor_group.py",
        "engine.update_weights_from_disk.remote(",
        "update_weights_from_disk",
    ),
}
# slime's Sample at SLIME_COMMIT (slime/utils/types.py): its dataclass fields and Status values, read with ast, so
# the synthetic rollout (polarstack.train.synthetic_rollout) is checked against what Sample.from_dict accepts.
SAMPLE_FILE = "slime/utils/types.py"
POLAR = {
    "session_id": ("src/slime_bridge/adapter.py", '"session_id": result.session_id,', "session_id"),
    "response_messages": (
        "src/slime_bridge/adapter.py",
        '"response_messages": deepcopy(response_messages),',
        "trace_debug",
    ),
    "token_clipping": (
        "src/slime_bridge/adapter.py",
        'polar_metadata["token_clipping"] = clipping_metadata',
        "token_clipping",
    ),
    "parser_invalid": (
        "src/slime_bridge/adapter.py",
        '"reason": "parser_invalid_tool_call",',
        "parser_invalid_tool_call",
    ),
    "placeholder": ("src/slime_bridge/adapter.py", '"placeholder": True,', "placeholder"),
    # issue 26 point 2: sessions the adapter masks (FAILED / ABORTED, loss mask 0, remove_sample)
    "session_error": (
        "src/slime_bridge/adapter.py",
        '"session_timeout" if status == Sample.Status.ABORTED else "session_error"',
        "session_error",
    ),
    "session_timeout": (
        "src/slime_bridge/adapter.py",
        '"session_timeout" if status == Sample.Status.ABORTED else "session_error"',
        "session_timeout",
    ),
    "agent_timeout": (
        "src/slime_bridge/adapter.py",
        '_TRAINABLE_AGENT_TIMEOUT_REASON = "agent_timeout"',
        "agent_timeout",
    ),
    "session_status": ("src/slime_bridge/adapter.py", '"session_status": result.status,', "session_status"),
    "masked_invalid_execution": ("src/slime_bridge/adapter.py", "remove_sample=invalid_execution,", "remove_sample"),
}
# rollout.py at POLAR_COMMIT (stored there): the worker's drop counters by reason (issue 26 point 2)
POLAR_WORKER = {
    name: ("src/slime_bridge/rollout.py", needle, key)
    for name, needle, key in (
        (
            "zero_trainable",
            'category_metric = "polar/dropped_zero_trainable_groups"',
            "polar/dropped_zero_trainable_groups",
        ),
        (
            "low_complete_fraction",
            'category_metric = "polar/dropped_low_complete_fraction_groups"',
            "polar/dropped_low_complete_fraction_groups",
        ),
        (
            "logprob_error",
            'category_metric = "polar/dropped_logprob_error_groups"',
            "polar/dropped_logprob_error_groups",
        ),
        ("failed", 'category_metric = "polar/dropped_failed_groups"', "polar/dropped_failed_groups"),
        (
            "dynamic_filter",
            'self._inc_metric("polar/dropped_dynamic_filter_groups")',
            "polar/dropped_dynamic_filter_groups",
        ),
        ("sessions", 'self._inc_metric("polar/dropped_sessions", pending.session_cost)', "polar/dropped_sessions"),
        ("delta_suffix", 'delta_key = f"{key}_delta"', "_delta"),
        ("low_complete_raise", "raise PolarLowCompleteAcceptFractionError(", "PolarLowCompleteAcceptFractionError"),
    )
}
SGLANG = {
    "model_info_route": ("sglang/srt/entrypoints/http_server.py", '@app.get("/model_info")', "/model_info"),
    "weight_version": (
        "sglang/srt/entrypoints/http_server.py",
        '"weight_version": _global_state.tokenizer_manager.server_args.weight_version',
        "weight_version",
    ),
    # issue 26 point 4: the refusals a session that outgrows the context ends with (read from the wheel itself)
    "context_limit_total": (
        "sglang/srt/managers/tokenizer_manager.py",
        'f"Requested token count exceeds the model\'s maximum context length "',
        "Requested token count exceeds the model's maximum context length",
    ),
    "context_limit_input": (
        "sglang/srt/managers/tokenizer_manager.py",
        'f"The input ({input_token_num} tokens) is longer than the "',
        "is longer than the model's context length",
    ),
    # issue 32 point 8: the 7B reload into an engine, the call slime's disk transport makes (actor_group.py)
    "update_weights_from_disk_route": (
        "sglang/srt/entrypoints/http_server.py",
        '@app.post("/update_weights_from_disk")',
        "/update_weights_from_disk",
    ),
    "update_weights_from_disk_request": (
        "sglang/srt/managers/io_struct.py",
        "class UpdateWeightFromDiskReqInput(BaseReq, kw_only=True):",
        "model_path, weight_version",
    ),
}


def pin(name: str) -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"configs/pins.env has no {name}")


def find(repo: str, commit: str, table: dict) -> dict:
    out = {}
    for fact, (path, needle, key) in table.items():
        text = subprocess.run(
            ["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout
        lines = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
        if not lines:
            raise SystemExit(f"{path} at {commit[:12]} has no {needle!r}")
        out[fact] = {
            "file": path,
            "needle": needle,
            "key": key,
            "line": lines[0],
            "text": text.splitlines()[lines[0] - 1].strip(),
        }
    return out


def sample_fields(repo: str, commit: str) -> dict:
    """Sample's field names (in order) and Status values, from the class body in slime/utils/types.py."""
    import ast

    text = subprocess.run(
        ["git", "-C", repo, "show", f"{commit}:{SAMPLE_FILE}"], capture_output=True, text=True, check=True
    ).stdout
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sample")
    fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    status = next(n for n in cls.body if isinstance(n, ast.ClassDef) and n.name == "Status")
    values = [n.value.value for n in status.body if isinstance(n, ast.Assign)]
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("class Sample"))
    return {"file": SAMPLE_FILE, "line": line, "fields": fields, "status_values": values}


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    slime_commit = pin("SLIME_COMMIT")
    if len(sys.argv) == 3:
        polar = find(sys.argv[2], POLAR_REVISION, POLAR)
        worker = find(sys.argv[2], pin("POLAR_COMMIT"), POLAR_WORKER)
    else:
        polar = json.loads(RECORD.read_text())["polar"]["facts"]
        worker = json.loads(RECORD.read_text())["polar_worker"]["facts"]
    record = {
        "what": "where the pinned upstreams write what the rehearsal's report reads (record_rehearsal_keys.py)",
        "recorded_on": datetime.date.today().isoformat(),
        "slime": {
            "repo": "THUDM/slime",
            "commit": slime_commit,
            "facts": find(sys.argv[1], slime_commit, SLIME),
            "sample": sample_fields(sys.argv[1], slime_commit),
        },
        "polar": {
            "repo": "NVIDIA-NeMo/ProRL-Agent-Server",
            "commit": POLAR_REVISION,
            "polar_commit": pin("POLAR_COMMIT"),
            "note": "read at the stored revision nearest POLAR_COMMIT (the code store has no adapter.py at POLAR_COMMIT)",
            "facts": polar,
        },
        "polar_worker": {
            "repo": "NVIDIA-NeMo/ProRL-Agent-Server",
            "commit": pin("POLAR_COMMIT"),
            "note": "AsyncPolarRolloutWorker._submit_and_collect / mark_dynamic_filter_drop at POLAR_COMMIT: every "
            "dropped group counted by reason, exported as <key>_delta per returned rollout (snapshot_metrics)",
            "facts": worker,
        },
        "sglang": {
            "version": pin("SGLANG_VERSION"),
            "facts": {k: {"file": f, "needle": n, "key": key} for k, (f, n, key) in SGLANG.items()},
        },
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
