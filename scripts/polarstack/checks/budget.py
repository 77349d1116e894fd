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

Per request (issue 18 point 2): the pinned sglang (SGLANG_VERSION) refuses a request whose input tokens + max_new_tokens exceed
the engine's context (srt/managers/tokenizer_manager.py `_validate_one_request`, ~l.973-997: "Requested token
count exceeds the model's maximum context length ..."), and Polar's Anthropic transform passes the harness's
max_tokens through. The pinned CLI asks 32000 by default, so 11.5k + 32000 > 32768 fails on the first turn. The
stack caps it instead of `--allow-auto-truncate` on the engines: the cap keeps every request the agent sends the
request the engine runs (auto-truncate would lower max_new_tokens silently, ~l.980, and cut an over-long prompt
from its end, ~l.959, so the model would answer a conversation whose newest turn it never saw, and the trace would
hold ids of a prompt the agent did not send). The cap is CLAUDE_CODE_MAX_OUTPUT_TOKENS in the agent's env, which
the pinned CLI reads (HARNESS_RECORD `agent_env_read_by_cli`, measured: it then asks max_tokens = the cap), and
harness + margin + task prompt + response + cap <= the engine context keeps the last request of a full trace inside.
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.paths import load_yaml, train_defaults
from polarstack.pins import pins, repo_root

HARNESS_RECORD = "configs/upstream/harness-prompt.json"


def harness_record() -> dict[str, Any]:
    return json.loads((repo_root() / HARNESS_RECORD).read_text())


AGENT_OUTPUT_ENV = "CLAUDE_CODE_MAX_OUTPUT_TOKENS"


def agent_output_cap(config: dict[str, Any]) -> int | None:
    """context.agent_max_output_tokens (None or 0: no cap, the CLI's default applies)."""
    value = (config.get("context") or {}).get("agent_max_output_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def agent_env(config: dict[str, Any]) -> dict[str, str]:
    """What the task template's agent.env gets: the output-token cap the pinned CLI reads."""
    cap = agent_output_cap(config)
    return {AGENT_OUTPUT_ENV: str(cap)} if cap else {}


def request_max_tokens(config: dict[str, Any], record: dict[str, Any] | None = None) -> int:
    """max_tokens of each agent request: the cap when set (the record shows the CLI asks exactly the env value), else
    what the CLI asks without it (measured)."""
    record = record or harness_record()
    cap = agent_output_cap(config)
    if cap:
        return cap
    return int(record.get("max_tokens_without_agent_env") or record["max_tokens_requested"])


def env_max_tokens(agent_env: dict[str, str], record: dict[str, Any] | None = None) -> int:
    """max_tokens of each agent request under a rendered agent.env (the plan's), as request_max_tokens."""
    raw = str(agent_env.get(AGENT_OUTPUT_ENV, "")).strip()
    cap = int(raw) if raw.isdigit() and int(raw) > 0 else None
    return request_max_tokens({"context": {"agent_max_output_tokens": cap}}, record)


def harness_request_shape() -> tuple[int, int]:
    """(prompt tokens, max_tokens) of the agent's first request under configs/train/defaults.yaml: what the smoke's
    tool exchange sends (polarstack.checks.tool_exchange), so a configuration the engine would refuse fails the smoke."""
    record = harness_record()
    config = load_yaml(train_defaults().read_text(encoding="utf-8"))
    return int(record["agent_turn"]["harness_prompt_tokens"]), request_max_tokens(config, record)


def request_problems(train_args: list[str], config: dict[str, Any], record: dict[str, Any] | None = None) -> list[str]:
    """sglang's total-token check for the last request of a full trace: harness + margin + task prompt + response +
    per-request max_tokens <= the engine's context (the model's, as the engines run without --context-length)."""
    record = record or harness_record()
    problems = []
    cap = agent_output_cap(config)
    if cap:
        measured = (record.get("agent_env") or {}).get(AGENT_OUTPUT_ENV)
        if not (record.get("agent_env_read_by_cli") or {}).get(AGENT_OUTPUT_ENV) or measured is None:
            problems.append(
                f"{HARNESS_RECORD} does not show the pinned CLI reading {AGENT_OUTPUT_ENV}; rerun "
                f"scripts/tools/measure_harness_prompt.py --agent-env {AGENT_OUTPUT_ENV}={cap}"
            )
        elif int(record["max_tokens_requested"]) != int(measured):
            problems.append(
                f"with {AGENT_OUTPUT_ENV}={measured} the pinned CLI asked max_tokens {record['max_tokens_requested']} "
                f"({HARNESS_RECORD}), so the cap does not reach its requests"
            )
    context = config["context"]
    harness = int(record["agent_turn"]["harness_prompt_tokens"]) + int(context["harness_margin_tokens"])
    prompt = flag_value(train_args, "--rollout-max-prompt-len") or 0
    response = flag_value(train_args, "--rollout-max-response-len") or 0
    per_request = request_max_tokens(config, record)
    engine = int(context["model_context_length"])
    total = harness + prompt + response + per_request
    if total > engine:
        problems.append(
            f"harness prompt {harness} + task prompt {prompt} + response {response} + per-request max_tokens "
            f"{per_request} = {total} tokens exceed the engine context {engine}: sglang refuses such a request "
            "(\"Requested token count exceeds the model's maximum context length\") and the agent's session fails; "
            f"set context.agent_max_output_tokens (rendered as {AGENT_OUTPUT_ENV}) to at most "
            f"{max(engine - harness - prompt - response, 0)} or lower grpo.rollout_max_response_len"
        )
    return problems


def turn_cap(config: dict[str, Any], record: dict[str, Any] | None = None) -> int:
    """Turns one agent session may take (issue 26 point 4), chosen from the budget: the first request's input is the
    harness prompt + margin + task prompt (rollout_max_prompt_len); each turn adds at most the per-request max_tokens
    of the model's own output; sglang refuses a request once input + max_tokens passes the engine context
    (tokenizer_manager.py ~973-998). The k-th request fits while first + (k - 1) x max_tokens + max_tokens <= context,
    so the cap is (context - first) // max_tokens (32,768, 11,563 + 1,024 + 2,048, 4,096: 4). What tools return is
    bounded by no setting, so a session can still reach the context sooner: the rehearsal's report and the in-job
    watch count the sessions that did (polarstack.train.learning_signal). One CLI turn asks the engine once: not
    measured here."""
    record = record or harness_record()
    context = config["context"]
    first = (
        int(record["agent_turn"]["harness_prompt_tokens"])
        + int(context["harness_margin_tokens"])
        + int(config["grpo"]["rollout_max_prompt_len"])
    )
    return max(0, (int(context["model_context_length"]) - first) // request_max_tokens(config, record))


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
    return problems + request_problems(train_args, config, record)


def summary(train_args: list[str], config: dict[str, Any]) -> str:
    record = harness_record()
    return (
        f"harness {record['agent_turn']['harness_prompt_tokens']}+{config['context']['harness_margin_tokens']} "
        f"+ prompt {flag_value(train_args, '--rollout-max-prompt-len')} + response "
        f"{flag_value(train_args, '--rollout-max-response-len')} <= seq {flag_value(train_args, '--seq-length')} "
        f"<= {flag_value(train_args, '--max-tokens-per-gpu')} x CP "
        f"{flag_value(train_args, '--context-parallel-size') or 1}, <= model {config['context']['model_context_length']}; "
        f"+ per-request max_tokens {request_max_tokens(config, record)} <= engine {config['context']['model_context_length']}"
    )
