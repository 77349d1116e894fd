"""An agent-shaped workload: many concurrent multi-turn sessions that share one long system prompt + tool schemas.

Shape (docs/routing.md says where each size comes from):
- every session sends the SAME system prompt and tool schemas first (an agent harness such as Polar's
  claude_code preset does), sized by default to what Claude Code 2.0.55 sends: 3.0k tokens of system prompt
  and 14.6k tokens of tool schemas (third-party measurement with Claude Code's own `/context`; counted here in
  the emulator's tokenizer, one word = one token);
- then a task message of its own, then per turn: the model's reply and a tool result appended (the context
  grows every turn), with a think time between turns (the tool running in the sandbox);
- every new message starts with a marker `s<session>.t<turn> ` that the emulated engine's served log keeps
  (`/_emulator/served`, field `tag`), so the engine that served each turn can be recovered whatever the router
  does to the request.

The metrics (`metrics`) are computed from the engines' served logs: per-engine request and prompt-token share,
session affinity (share of turns served by the engine that served the session's previous turn), the prefix
cache share and the ideal cache share for the same prompts (all turns of a session on one engine, sessions
spread evenly over the engines).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import httpx

from polarstack.polar import contract
from polarstack.polar.tokenizer import Tokenizer

# Claude Code 2.0.55, `/context` (unpatched): "System prompt 3.0k", "System tools 14.6k" tokens
# (github.com/ykdojo/claude-code-tips, system-prompt/2.0.55/README.md, "Measured Token Savings"). Not measured here.
SYSTEM_PROMPT_TOKENS = 3000
TOOL_SCHEMA_TOKENS = 14600
# Claude Code 2.0.55's built-in tools named in the same README's variable table (15 names) plus one.
TOOL_NAMES = (
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "Read",
    "Edit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "WebSearch",
    "TodoWrite",
    "AskUserQuestion",
    "EnterPlanMode",
    "ExitPlanMode",
    "SlashCommand",
    "BashOutput",
)
TAG = re.compile(r"^s(\d+)\.t(\d+) ")
_WORDS = (
    "file",
    "path",
    "line",
    "test",
    "error",
    "function",
    "module",
    "return",
    "value",
    "call",
    "output",
    "search",
    "pattern",
    "command",
    "result",
    "change",
    "patch",
    "diff",
    "class",
    "method",
    "argument",
    "string",
    "number",
    "list",
    "read",
    "write",
    "edit",
    "run",
    "check",
    "fail",
    "pass",
    "tool",
    "agent",
)


@dataclass(frozen=True)
class AgentWorkload:
    sessions: int = 64
    turns: int = 8
    system_tokens: int = SYSTEM_PROMPT_TOKENS
    tool_tokens: int = TOOL_SCHEMA_TOKENS
    task_tokens: int = 400  # the task statement (issue text); not measured, a choice
    tool_result_tokens: int = 600  # what one tool call returns per turn; not measured, a choice
    output_tokens: int = 24  # max_tokens per turn; not measured, a choice
    think_seconds: tuple[float, float] = (0.05, 0.25)  # tool time between turns, uniform; scaled down
    seed: int = 0

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def words(count: int, rng: random.Random) -> str:
    """`count` space-separated words: exactly `count` tokens in the emulator's tokenizer."""
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def system_prompt(load: AgentWorkload) -> str:
    return words(load.system_tokens, random.Random(f"system:{load.seed}"))


def tool_schemas(load: AgentWorkload) -> list[dict[str, Any]]:
    """len(TOOL_NAMES) OpenAI function tools whose descriptions together hold about `tool_tokens` tokens."""

    def tool(name: str, description: str) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "absolute path"},
                        "command": {"type": "string", "description": "what to run"},
                    },
                    "required": ["path"],
                },
            },
        }

    rng = random.Random(f"tools:{load.seed}")
    # the JSON around a description costs tokens too (the emulator renders each tool as sorted-key JSON)
    structure = len(Tokenizer().encode(json.dumps(tool("Task", ""), sort_keys=True)))
    per_tool = max(1, load.tool_tokens // len(TOOL_NAMES) - structure)
    return [tool(name, words(per_tool, rng)) for name in TOOL_NAMES]


def first_messages(load: AgentWorkload, session: int, system: str) -> list[dict[str, Any]]:
    rng = random.Random(f"task:{load.seed}:{session}")
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"s{session}.t0 task: " + words(load.task_tokens, rng)},
    ]


def tool_result(load: AgentWorkload, session: int, turn: int) -> dict[str, Any]:
    rng = random.Random(f"result:{load.seed}:{session}:{turn}")
    return {"role": "user", "content": f"s{session}.t{turn} result: " + words(load.tool_result_tokens, rng)}


@dataclass
class RunResult:
    wall_seconds: float
    turns_ok: int
    failures: int
    latencies: list[float] = field(default_factory=list)
    first_error: str = ""


def request_body(
    load: AgentWorkload, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """Polar's request (contract.prepare_request) without `return_prompt_token_ids`: echoing ~20k prompt ids per
    turn would make the CPU emulator's JSON work, not routing, the bottleneck. No router policy reads the field."""
    body = contract.prepare_request(
        {"model": model, "messages": list(messages), "tools": tools, "max_tokens": load.output_tokens}
    )
    body.pop("return_prompt_token_ids", None)
    return body


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    """POST once more when a kept-alive connection was closed under us (uvicorn closes idle ones after 5 s):
    the request never reached the server, so it is not counted twice."""
    try:
        return await http.post(url, json=body, headers=headers)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.post(url, json=body, headers=headers)


async def run_sessions(
    load: AgentWorkload,
    pick: Callable[[int], str],
    model: str,
    *,
    session_header: str | None = None,
    timeout: float = 300.0,
) -> RunResult:
    """Run every session concurrently; `pick(session)` gives the base URL of each request (router or worker).

    With `session_header`, each request carries `<header>: session-<n>` (a routing key for session-keyed router
    policies; Polar sends none, docs/routing.md).
    """
    system, tools = system_prompt(load), tool_schemas(load)
    result = RunResult(0.0, 0, 0)
    limits = httpx.Limits(max_connections=load.sessions + 8, max_keepalive_connections=load.sessions + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as http:

        async def session(index: int) -> None:
            rng = random.Random(f"think:{load.seed}:{index}")
            messages = first_messages(load, index, system)
            headers = {session_header: f"session-{index}"} if session_header else {}
            await asyncio.sleep(rng.uniform(*load.think_seconds))  # sessions do not all start on the same tick
            for turn in range(load.turns):
                body = request_body(load, model, messages, tools)
                started = time.perf_counter()
                try:
                    reply = await _post(http, f"{pick(index)}/v1/chat/completions", body, headers)
                except httpx.HTTPError as exc:
                    result.failures += 1
                    result.first_error = result.first_error or f"{type(exc).__name__}: {exc}"
                    return
                if not reply.is_success:
                    result.failures += 1
                    result.first_error = result.first_error or f"HTTP {reply.status_code}: {reply.text[:200]}"
                    return
                result.latencies.append(time.perf_counter() - started)
                result.turns_ok += 1
                content = reply.json()["choices"][0]["message"].get("content") or ""
                messages += [{"role": "assistant", "content": content}, tool_result(load, index, turn + 1)]
                if turn + 1 < load.turns:
                    await asyncio.sleep(rng.uniform(*load.think_seconds))

        started = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(load.sessions)))
        result.wall_seconds = time.perf_counter() - started
    return result


# --- metrics ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """One turn as an engine's served log saw it."""

    engine: int
    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0


def parse_served(engine: int, entries: list[dict[str, Any]]) -> list[Served]:
    """Turns of this workload in one engine's `/_emulator/served` answer (other requests are skipped)."""
    out = []
    for entry in entries:
        match = TAG.match(entry.get("tag") or "")
        if match:
            out.append(
                Served(
                    engine,
                    int(match.group(1)),
                    int(match.group(2)),
                    int(entry["prompt_tokens"]),
                    int(entry["cached_tokens"]),
                    int(entry.get("completion_tokens", 0)),
                )
            )
    return out


def collect(engine_urls: list[str]) -> list[Served]:
    out: list[Served] = []
    for index, url in enumerate(engine_urls):
        out += parse_served(index, httpx.get(f"{url}/_emulator/served", timeout=30).json()["served"])
    return out


def ideal_cached(turns: list[Served], engines: int) -> int:
    """Cached tokens if every session kept one engine and sessions were spread evenly over `engines`.

    On its engine, a session's turn t > 0 finds its whole previous prompt cached (the chat template only
    appends), capped at prompt - 1 (the engine recomputes the last token); its turn 0 finds the prefix every
    session shares (system prompt + tools + the user-turn header: the longest cached prefix any turn 0 saw),
    except on the first session of each engine, which finds nothing.
    """
    by_session: dict[int, dict[int, Served]] = {}
    for s in turns:
        by_session.setdefault(s.session, {})[s.turn] = s
    shared = max((s.cached_tokens for s in turns if s.turn == 0), default=0)
    total = 0
    for rank, session in enumerate(sorted(by_session)):
        seq = by_session[session]
        for turn, served in seq.items():
            if turn == 0:
                total += 0 if rank < engines else min(shared, served.prompt_tokens - 1)
            elif turn - 1 in seq:
                total += min(seq[turn - 1].prompt_tokens, served.prompt_tokens - 1)
    return total


def metrics(turns: list[Served], engines: int) -> dict[str, Any]:
    requests = [0] * engines
    prompt = [0] * engines
    for s in turns:
        requests[s.engine] += 1
        prompt[s.engine] += s.prompt_tokens
    by_session: dict[int, dict[int, int]] = {}
    for s in turns:
        by_session.setdefault(s.session, {})[s.turn] = s.engine
    follow = [seq[t] == seq[t - 1] for seq in by_session.values() for t in seq if t > 0 and t - 1 in seq]
    total_prompt = sum(prompt)
    cached = sum(s.cached_tokens for s in turns)
    ideal = ideal_cached(turns, engines)
    share = cached / total_prompt if total_prompt else 0.0
    ideal_share = ideal / total_prompt if total_prompt else 0.0
    return {
        "turns": len(turns),
        "sessions": len(by_session),
        "requests_per_engine": requests,
        "prompt_tokens_per_engine": prompt,
        "request_share": [r / len(turns) if turns else 0.0 for r in requests],
        "prompt_token_share": [p / total_prompt if total_prompt else 0.0 for p in prompt],
        "session_affinity": sum(follow) / len(follow) if follow else 0.0,
        "prompt_tokens": total_prompt,
        "cached_tokens": cached,
        "ideal_cached_tokens": ideal,
        "cache_share": share,
        "ideal_cache_share": ideal_share,
        "cache_vs_ideal": share / ideal_share if ideal_share else 0.0,
        "completion_tokens": sum(s.completion_tokens for s in turns),
        "shared_prefix_tokens": max((s.cached_tokens for s in turns if s.turn == 0), default=0),
    }


def meets_goals(
    m: dict[str, Any],
    *,
    share_band: tuple[float, float] = (0.45, 0.55),
    affinity: float = 0.95,
    cache_ratio: float = 0.95,
) -> dict[str, bool]:
    """The goals of docs/routing.md for one routing mode."""
    return {
        "balanced": all(share_band[0] <= s <= share_band[1] for s in m["prompt_token_share"]),
        "affine": m["session_affinity"] >= affinity,
        "cache": m["cache_vs_ideal"] >= cache_ratio,
    }
