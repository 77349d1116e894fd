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
TURN_RECORD = "configs/upstream/turn-cap.json"  # scripts/tools/measure_turn_cap.py (issue 34 point 12)


def harness_record() -> dict[str, Any]:
    return json.loads((repo_root() / HARNESS_RECORD).read_text())


AGENT_OUTPUT_ENV = "CLAUDE_CODE_MAX_OUTPUT_TOKENS"
BASH_OUTPUT_ENV = "BASH_MAX_OUTPUT_LENGTH"  # the pinned CLI's Bash tool: longer output is saved, a 2 KB preview sent


def turn_record() -> dict[str, Any]:
    return json.loads((repo_root() / TURN_RECORD).read_text())


def bash_output_chars(config: dict[str, Any]) -> int | None:
    """context.agent_bash_output_chars (None or 0: the CLI's default, ~30,000 characters inline)."""
    value = (config.get("context") or {}).get("agent_bash_output_chars")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def tool_tokens(config: dict[str, Any]) -> int:
    """context.tool_output_tokens_per_turn: what one turn's tool result may add to the next request."""
    return int((config.get("context") or {}).get("tool_output_tokens_per_turn") or 0)


def agent_output_cap(config: dict[str, Any]) -> int | None:
    """context.agent_max_output_tokens (None or 0: no cap, the CLI's default applies)."""
    value = (config.get("context") or {}).get("agent_max_output_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def agent_env(config: dict[str, Any]) -> dict[str, str]:
    """What the task template's agent.env gets: the output-token cap and the Bash output cut the pinned CLI reads."""
    cap, chars = agent_output_cap(config), bash_output_chars(config)
    return {**({AGENT_OUTPUT_ENV: str(cap)} if cap else {}), **({BASH_OUTPUT_ENV: str(chars)} if chars else {})}


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
    """Turns one agent session may take (issue 26 point 4; issue 34 point 12), chosen from the budget: the first
    request's input is the harness prompt + margin + task prompt (rollout_max_prompt_len); each turn adds at most the
    per-request max_tokens of the model's own output and one tool result (context.tool_output_tokens_per_turn, which
    covers the Bash result the CLI sends back under BASH_MAX_OUTPUT_LENGTH: configs/upstream/turn-cap.json); sglang
    refuses a request once input + max_tokens passes the engine context (tokenizer_manager.py ~973-998). The k-th
    request fits while first + (k - 1) x (max_tokens + tool) + max_tokens <= context, so the cap is
    1 + (context - first - max_tokens) // (max_tokens + tool) (32,768, 11,563 + 1,024 + 2,048, 2,048, 2,560: 4).
    One CLI turn is one request to the engine (measured: --max-turns N made N agent requests, turn-cap.json). What the
    Read tool returns is bounded by no setting (up to 256 KB, measured), so a session can still reach the context
    sooner: the rehearsal's report and the in-job watch count the sessions that did (polarstack.train.learning_signal)."""
    record = record or harness_record()
    context = config["context"]
    first = (
        int(record["agent_turn"]["harness_prompt_tokens"])
        + int(context["harness_margin_tokens"])
        + int(config["grpo"]["rollout_max_prompt_len"])
    )
    out = request_max_tokens(config, record)
    room = int(context["model_context_length"]) - first - out
    return 0 if room < 0 else 1 + room // (out + tool_tokens(config))


def turn_problems(train_args: list[str], config: dict[str, Any], data: dict[str, Any] | None = None) -> list[str]:
    """The turn cap's assumptions against what the pinned CLI did (configs/upstream/turn-cap.json): one turn is one
    request; the CLI asks the rendered max_tokens; the rendered BASH_MAX_OUTPUT_LENGTH keeps every measured Bash
    result within the per-turn tool allowance (its characters are ASCII: at most as many tokens); and the trace's
    response budget holds what the turns before the last add."""
    data = data or turn_record()
    problems = []
    if data["agent_cli"]["version"] != pins().get("AGENT_CLI_VERSION"):
        problems.append(f"{TURN_RECORD} was measured for another agent CLI; rerun scripts/tools/measure_turn_cap.py")
    for run in data["turns"]:
        if run["agent_requests"] != run["max_turns"]:
            problems.append(
                f"{TURN_RECORD}: --max-turns {run['max_turns']} made {run['agent_requests']} agent requests, so a turn "
                "is not one request to the engine, as turn_cap counts it"
            )
    cap = agent_output_cap(config)
    asked = [r["max_tokens"] for r in data["turns"] if r["agent_env"].get(AGENT_OUTPUT_ENV) == str(cap)]
    if cap and asked != [[cap]] * len(asked) or cap and not asked:
        problems.append(f"{TURN_RECORD} shows no run where {AGENT_OUTPUT_ENV}={cap} made the CLI ask max_tokens {cap}")
    chars, tool = bash_output_chars(config), tool_tokens(config)
    cut = [o["tool_result_chars"] for o in data["bash_outputs"] if o["agent_env"].get(BASH_OUTPUT_ENV) == str(chars)]
    if not chars or not cut:
        problems.append(
            f"no Bash result measured with {BASH_OUTPUT_ENV}={chars} ({TURN_RECORD}): one tool result can then hold "
            "~30,000 characters; set context.agent_bash_output_chars to a measured value"
        )
    elif max(cut) > tool:
        problems.append(
            f"the CLI sent back Bash results of up to {max(cut)} characters with {BASH_OUTPUT_ENV}={chars}, more than "
            f"context.tool_output_tokens_per_turn={tool}"
        )
    response = flag_value(train_args, "--rollout-max-response-len") or 0
    turns = turn_cap(config)
    added = (turns - 1) * (request_max_tokens(config) + tool)
    if turns < 1:
        problems.append("the first request leaves no room for one turn: lower the task prompt or the per-request cap")
    elif response < added:
        problems.append(
            f"--rollout-max-response-len {response} is below the {added} tokens {turns - 1} turns add before the last "
            f"({request_max_tokens(config)} of output + {tool} of tool result each); raise grpo.rollout_max_response_len"
        )
    return problems


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
    return problems + request_problems(train_args, config, record) + turn_problems(train_args, config)


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
