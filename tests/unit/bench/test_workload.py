"""Pins the agent workload's metrics (docs/routing.md): per-engine shares, session affinity, and the ideal cache
share (all turns of a session on one engine, sessions spread evenly) computed from engines' served logs; the
workload's sizes in the emulator's tokenizer; and the emulator's prefix cache against a brute-force reference."""

import importlib.util
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polarstack.bench import workload as w
from polarstack.engine.prefix_cache import BLOCK, PrefixCache
from polarstack.polar.tokenizer import Tokenizer, encode_chat

pytestmark = pytest.mark.unit


def _session(engine_of_turn, session, shared=100, step=50):
    """Served lines of one session whose prompt grows by `step` per turn; cached as a per-engine cache would."""
    out, seen = [], {}
    for turn, engine in enumerate(engine_of_turn):
        prompt = shared + 20 + turn * step
        if turn and seen.get(engine) == turn - 1:
            cached = prompt - step
        else:
            cached = shared
        seen[engine] = turn
        out.append(w.Served(engine, session, turn, prompt, cached))
    return out


def test_affinity_shares_and_ideal_on_a_synthetic_log():
    sticky = _session([0, 0, 0], 0) + _session([1, 1, 1], 1)
    flappy = _session([0, 1, 0], 2) + _session([1, 0, 1], 3)
    m = w.metrics(sticky + flappy, 2)
    # 4 sessions x 2 follow-up turns; the two sticky sessions keep their engine, the flappy ones never do.
    assert m["session_affinity"] == pytest.approx(4 / 8)
    assert m["requests_per_engine"] == [6, 6] and m["request_share"] == [0.5, 0.5]
    assert sum(m["prompt_token_share"]) == pytest.approx(1.0)
    # ideal: turns > 0 find their previous prompt; turn 0 finds the shared 100 tokens except on the first
    # session of each engine (2 engines -> sessions 0 and 1 find nothing).
    prompts = {(s.session, s.turn): s.prompt_tokens for s in sticky + flappy}
    expected = 2 * 100 + sum(prompts[(s, t - 1)] for s in range(4) for t in (1, 2))
    assert m["ideal_cached_tokens"] == expected
    assert m["shared_prefix_tokens"] == 100
    assert m["cache_vs_ideal"] == pytest.approx(m["cached_tokens"] / expected)


def test_perfect_affinity_reaches_the_ideal_and_goals():
    turns = [s for i in range(8) for s in _session([i % 2] * 4, i)]
    # the first session on each engine found nothing on turn 0 (a cold engine)
    turns = [
        w.Served(s.engine, s.session, s.turn, s.prompt_tokens, 0) if s.session < 2 and s.turn == 0 else s for s in turns
    ]
    m = w.metrics(turns, 2)
    assert m["session_affinity"] == 1.0 and m["cache_vs_ideal"] == pytest.approx(1.0)
    assert w.meets_goals(m) == {"balanced": True, "affine": True, "cache": True}


def test_one_engine_takes_everything_misses_balance_only():
    turns = [s for i in range(4) for s in _session([0] * 3, i)]
    m = w.metrics(turns, 2)
    assert m["prompt_token_share"][1] == 0.0 and m["session_affinity"] == 1.0
    assert w.meets_goals(m)["balanced"] is False


def test_served_tags_are_recovered_and_foreign_requests_skipped():
    entries = [
        {"tag": "s12.t3 result: file path", "prompt_tokens": 900, "cached_tokens": 850},
        {"tag": "Say hi in 5 words", "prompt_tokens": 20, "cached_tokens": 0},
        {"tag": None, "prompt_tokens": 5, "cached_tokens": 0},
    ]
    assert w.parse_served(1, entries) == [w.Served(1, 12, 3, 900, 850, 0)]


def test_workload_sizes_in_the_emulator_tokenizer():
    load = w.AgentWorkload(sessions=2, turns=2)
    tok = Tokenizer()
    assert len(tok.encode(w.system_prompt(load))) == w.SYSTEM_PROMPT_TOKENS
    tools = w.tool_schemas(load)
    assert len(tools) == len(w.TOOL_NAMES) == 16
    import json

    tool_tokens = sum(len(tok.encode(json.dumps(t, sort_keys=True))) for t in tools)
    assert abs(tool_tokens - w.TOOL_SCHEMA_TOKENS) / w.TOOL_SCHEMA_TOKENS < 0.05, tool_tokens
    a, b = w.first_messages(load, 0, "sys"), w.first_messages(load, 1, "sys")
    assert w.TAG.match(a[1]["content"]).groups() == ("0", "0") and a[1] != b[1]
    assert w.TAG.match(w.tool_result(load, 3, 2)["content"]).groups() == ("3", "2")


def test_request_body_is_polars_without_prompt_id_echo():
    body = w.request_body(w.AgentWorkload(), "m", [{"role": "user", "content": "x"}], [])
    assert body["return_meta_info"] is True and body["logprobs"] is True and body["stream"] is False
    assert "return_prompt_token_ids" not in body


def _brute(history, prompt):
    best = 0
    for old in history:
        n = 0
        for a, b in zip(old, prompt, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 80), st.lists(st.integers(0, 3), max_size=40)),
        min_size=1,
        max_size=25,
    )
)
def test_prefix_cache_matches_brute_force(requests):
    """Prompts from a few shared stems, cut and extended: never more than the true longest prefix, and short of it
    by less than one block (prefix_cache's documented bound) while nothing is forgotten."""
    stems = [[random.Random(i).randrange(9) for _ in range(120)] for i in range(6)]
    cache, history = PrefixCache(capacity=1000), []
    for stem, cut, tail in requests:
        prompt = stems[stem][:cut] + tail
        true = _brute(history, prompt)
        assert true - BLOCK < cache.match(prompt) <= true
        history.append(tuple(prompt))


def test_prefix_cache_is_exact_on_agent_sessions():
    """Sessions that share a system prompt and append per turn: exactly the brute-force answer."""
    rng = random.Random(7)
    shared = [rng.randrange(50) for _ in range(333)]
    sessions = {s: shared + [100 + s] + [rng.randrange(50) for _ in range(rng.randrange(5, 40))] for s in range(6)}
    cache, history = PrefixCache(capacity=1000), []
    for _turn in range(4):
        for s in rng.sample(range(6), 6):
            prompt = sessions[s]
            assert cache.match(prompt) == _brute(history, prompt)
            history.append(tuple(prompt))
            sessions[s] = prompt + [rng.randrange(50) for _ in range(rng.randrange(1, 30))]


def test_prefix_cache_forgets_the_oldest_and_clears():
    cache = PrefixCache(capacity=2)
    a, b, c = [1] * 40, [2] * 40, [3] * 40
    for p in (a, b, c):
        assert cache.match(p) == 0
    assert len(cache) == 2
    assert cache.match(a) == 0  # forgotten
    assert cache.match(c + [9]) == 40
    cache.clear()
    assert cache.match(c) == 0 and BLOCK == 16


def test_agent_turns_extend_the_previous_prompt_in_the_chat_template():
    """The ideal assumes turn t's prompt starts with turn t-1's whole prompt (append-only template)."""
    load = w.AgentWorkload(sessions=1, turns=2, system_tokens=30, tool_tokens=200)
    tok, tools = Tokenizer(), w.tool_schemas(load)
    first = w.first_messages(load, 0, w.system_prompt(load))
    second = first + [{"role": "assistant", "content": "done"}, w.tool_result(load, 0, 1)]
    p1, p2 = encode_chat(tok, first, tools=tools), encode_chat(tok, second, tools=tools)
    assert p2[: len(p1)] == p1 and len(p2) > len(p1)


def test_routing_report_rewrites_only_its_table(tmp_path, monkeypatch):
    """`bench --routing` regenerates the table between the markers of routing.md and keeps the prose."""
    import json

    from polarstack.bench import routing as routing_bench
    from polarstack.pins import repo_root

    data = json.loads((repo_root() / "docs" / "routing.json").read_text())
    monkeypatch.setattr(routing_bench, "plot", lambda data, path: path.write_bytes(b"png"))
    doc = tmp_path / "routing.md"
    doc.write_text(
        f"# Routing\n\nprose before\n\n{routing_bench.BEGIN}\nold table\n{routing_bench.END}\n\nprose after\n"
    )
    routing_bench.write_outputs(data, tmp_path, "polarstack bench --routing")
    text = doc.read_text()
    assert "prose before" in text and "prose after" in text and "old table" not in text
    assert "| any | none | Polar worker bypass" in text and "Generated by `polarstack bench --routing`" in text
    assert json.loads((tmp_path / "routing.json").read_text())["command"] == "polarstack bench --routing"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--agent-turns", "1"], "--agent-turns must be at least 2"),
        (["--candidate", "patched-router"], "must look like PROFILE=FLAGS"),
    ],
)
def test_bench_routing_refuses_bad_arguments_before_starting_anything(capsys, argv, needle):
    from polarstack.cli.main import main
    from polarstack.errors import ExitCode

    assert main(["bench", "--routing", *argv]) == ExitCode.USAGE
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--routing"], []])
def test_bench_without_matplotlib_refuses_before_measuring(capsys, monkeypatch, argv):
    """issue 17: `bench --routing` without the bench extra measured for minutes and ended as an internal error."""
    from polarstack.bench import compare, routing
    from polarstack.cli.main import main
    from polarstack.errors import ExitCode

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    started = []
    monkeypatch.setattr(routing, "run", lambda *a, **k: started.append("routing"))
    monkeypatch.setattr(compare, "run_bench", lambda *a, **k: started.append("bench"))
    assert main(["bench", *argv]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "matplotlib" in err and "make bench" in err and "Traceback" not in err
    assert started == []
