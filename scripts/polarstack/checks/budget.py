"""The token budget of one agent trace: harness prompt + task prompt + response <= seq_length <= max_tokens_per_gpu x CP.

Why it matters (../shared/reference/gpu-node.md, docs/gpu-node.md "Sequence length"):
- slime sets `--seq-length` to 4096 when it is not given (slime/backends/megatron_utils/arguments.py,
  lines 158-160 at SLIME_COMMIT: `if args.seq_length is None: args.seq_length = 4096`, then
  `max_position_embeddings = seq_length`);
- Polar's bridge caps each trace at min(max_tokens_per_gpu x context-parallel size, seq_length) and its adapter
  drops a trace whose prompt leaves no room for a response;
- every request of the `claude_code` harness starts with the CLI's system prompt, its tool schemas and its
  wrapping of the task, measured for the pinned CLI in configs/upstream/harness-prompt.json
  (scripts/tools/measure_harness_prompt.py).
So a budget below harness + task + response turns every trace into a dropped or clipped one: training runs and
learns nothing. `make verify-offline` and `make train` check the inequality on the rendered train_async.py flags.
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.pins import pins, repo_root

HARNESS_RECORD = "configs/upstream/harness-prompt.json"


def harness_record() -> dict[str, Any]:
    return json.loads((repo_root() / HARNESS_RECORD).read_text())


def flag_value(args: list[str], flag: str) -> int | None:
    if flag not in args:
        return None
    return int(args[args.index(flag) + 1])


def check(train_args: list[str], config: dict[str, Any]) -> list[str]:
    """Problems (sentences) with the trace budget of the rendered train_async.py arguments; [] when it holds."""
    record = harness_record()
    problems = []
    pinned = pins().get("AGENT_CLI_VERSION")
    if record["agent_cli"]["version"] != pinned:
        problems.append(
            f"{HARNESS_RECORD} was measured for the agent CLI {record['agent_cli']['version']}, not "
            f"AGENT_CLI_VERSION={pinned}; rerun scripts/tools/measure_harness_prompt.py"
        )
    context = config["context"]
    harness = int(record["agent_turn"]["harness_prompt_tokens"]) + int(context["harness_margin_tokens"])
    seq = flag_value(train_args, "--seq-length")
    if seq is None:
        return problems + [
            "train_async.py gets no --seq-length, so slime uses 4096 tokens, below the harness prompt "
            f"alone ({harness} tokens with margin, {HARNESS_RECORD}); set context.seq_length"
        ]
    prompt = flag_value(train_args, "--rollout-max-prompt-len") or 0
    response = flag_value(train_args, "--rollout-max-response-len") or 0
    per_gpu = flag_value(train_args, "--max-tokens-per-gpu") or 0
    cp = flag_value(train_args, "--context-parallel-size") or 1
    if harness + prompt + response > seq:
        problems.append(
            f"harness prompt {harness} + task prompt {prompt} + response {response} = "
            f"{harness + prompt + response} tokens exceed --seq-length {seq}: Polar would clip or drop "
            "every trace; raise context.seq_length or lower grpo.rollout_max_response_len"
        )
    if seq > per_gpu * cp:
        problems.append(
            f"--seq-length {seq} exceeds --max-tokens-per-gpu {per_gpu} x context-parallel size {cp}: "
            "Polar caps a trace at the smaller of the two; raise grpo.max_tokens_per_gpu"
        )
    model_context = int(context["model_context_length"])
    if seq > model_context:
        problems.append(
            f"--seq-length {seq} exceeds the model's context length {model_context} (context.model_context_length)"
        )
    return problems


def summary(train_args: list[str], config: dict[str, Any]) -> str:
    record = harness_record()
    return (
        f"harness {record['agent_turn']['harness_prompt_tokens']}+{config['context']['harness_margin_tokens']} "
        f"+ prompt {flag_value(train_args, '--rollout-max-prompt-len')} + response "
        f"{flag_value(train_args, '--rollout-max-response-len')} <= seq {flag_value(train_args, '--seq-length')} "
        f"<= {flag_value(train_args, '--max-tokens-per-gpu')} x CP "
        f"{flag_value(train_args, '--context-parallel-size') or 1}, <= model {config['context']['model_context_length']}"
    )
