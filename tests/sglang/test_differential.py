"""The stand-in proven faithful: the same requests to the emulator and to the real pinned sglang, compared.

For each request of the set (Polar-shaped with and without its two fields, streamed and not, a stream with the
fields, over-long requests, an unknown model, and the bad inputs the smoke relies on) both answers must agree on:
the status code and content type; for errors, the whole error object with the message's prompt-token counts and
the handler's source location masked (they depend on the tokenizer and on the file that serves the route); for
answers, every JSON path and the type of its value, Polar's verdict (polarstack.polar.model, the smoke's basis) and
the tool-call outcome (tool_exchange.classify); for streams, the sequence of chunk kinds and each kind's shape.
Where they differed, the emulator was changed (sglang wins); the bar is zero differences.
"""

import json
import re
from typing import Any

import httpx
import pytest

from polarstack.checks import tool_exchange
from polarstack.polar import contract
from polarstack.polar import model as polar_model
from polarstack.stack.profiles import knob

MODEL = knob(None, "SERVED_MODEL_NAME")
TIMEOUT = 120.0
HELLO = [{"role": "user", "content": "hello there"}]
SESSION = [
    {"role": "user", "content": "write a function"},
    {"role": "assistant", "content": "def f(): pass"},
    {"role": "user", "content": "now test it"},
]
LONG = [{"role": "user", "content": "a " * 33000}]  # above the context in either tokenizer


def polar(messages=HELLO, **extra) -> dict[str, Any]:
    return contract.prepare_request({"model": MODEL, "messages": messages, "max_tokens": 2, **extra})


def plain(messages=HELLO, **extra) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}


# name -> (body, or raw bytes with a content type)
REQUESTS: dict[str, Any] = {
    "polar": polar(),
    "polar_session_turn": polar(SESSION),
    "plain": plain(),
    "plain_with_logprobs": plain(logprobs=True, top_logprobs=2),
    "polar_tools_scripted": "tools",  # the smoke's tool request with the scripted answer (filled in below)
    "stream": plain(stream=True, stream_options={"include_usage": True}),
    "stream_polar_flags": {**polar(), "stream": True},
    "stream_return_prompt_token_ids": plain(stream=True, return_prompt_token_ids=True),
    "stream_return_meta_info": plain(stream=True, return_meta_info=True),
    "total_tokens_at_context": polar(max_tokens=32768),
    "total_tokens_above_context": polar(max_tokens=40000),
    "total_tokens_stream": plain(max_tokens=32768, stream=True),
    "input_too_long": polar(LONG),
    "unknown_model": {**polar(), "model": "not-served"},
    "empty_messages": plain([]),
    "missing_messages": {"model": MODEL, "max_tokens": 2},
    "max_tokens_not_a_number": plain(max_tokens="many"),
    "tool_choice_required_without_tools": plain(tool_choice="required"),
    "wrong_content_type": (b"{}", "text/plain"),
    "invalid_json": (b"{not json", "application/json"),
}


def _send(url: str, request: Any) -> httpx.Response:
    if isinstance(request, tuple):
        body, media = request
        return httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": media}, timeout=TIMEOUT)
    return httpx.post(f"{url}/v1/chat/completions", json=request, timeout=TIMEOUT)


def _mask(message: str) -> str:
    """Mask what depends on the tokenizer (prompt-token counts) or on the serving file (a validation error's
    `File "...", line N, in NAME` of the route handler); keep the rest of sglang's sentence."""
    message = re.sub(r'File "[^"]+", line \d+, in \w+', "File <handler>", message)
    message = re.sub(r"The input \(\d+ tokens\)", "The input (<prompt> tokens)", message)
    message = re.sub(r"a total of \d+ tokens: \d+ tokens", "a total of <total> tokens: <prompt> tokens", message)
    return message


def shape(value: Any, path: str = "$", out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Every JSON path and the types seen there (lists of lists per position: logprob triples)."""
    out = {} if out is None else out
    if isinstance(value, dict):
        out.setdefault(path, set()).add("object")
        for key, item in value.items():
            shape(item, f"{path}.{key}", out)
    elif isinstance(value, list):
        out.setdefault(path, set()).add("array")
        for item in value:
            if isinstance(item, list):
                out.setdefault(f"{path}[]", set()).add("array")
                for position, inner in enumerate(item):
                    shape(inner, f"{path}[][{position}]", out)
            else:
                shape(item, f"{path}[]", out)
    else:
        kind = "null" if value is None else "number" if isinstance(value, int | float) and value is not True else None
        out.setdefault(path, set()).add(kind or type(value).__name__)
    return out


def _shape_diff(real: Any, emulated: Any, where: str) -> list[str]:
    a, b = shape(real), shape(emulated)
    return [
        f"{where} {p}: sglang {sorted(a.get(p, []))}, emulator {sorted(b.get(p, []))}"
        for p in sorted(set(a) | set(b))
        if a.get(p) != b.get(p)
    ]


def _events(text: str) -> list[Any]:
    return [
        "[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


def _kind(event: Any) -> str:
    if event == "[DONE]":
        return "done"
    if not event.get("choices"):
        return "usage" if "usage" in event else "empty"
    choice = event["choices"][0]
    if choice.get("finish_reason"):
        return "finish"
    return "role" if "role" in choice["delta"] else "content"


def _stream_diff(real: str, emulated: str) -> list[str]:
    diffs = []
    kinds = []
    for text in (real, emulated):
        sequence: list[str] = []
        for event in _events(text):
            kind = _kind(event)
            if not (sequence and sequence[-1] == kind == "content"):
                sequence.append(kind)
        kinds.append(sequence)
    if kinds[0] != kinds[1]:
        diffs.append(f"chunk sequence: sglang {kinds[0]}, emulator {kinds[1]}")
    firsts = [{_kind(e): e for e in reversed(_events(t))} for t in (real, emulated)]
    for kind in sorted(set(firsts[0]) & set(firsts[1]) - {"done"}):
        diffs += _shape_diff(firsts[0][kind], firsts[1][kind], f"{kind} chunk")
    return diffs


def _body_diff(name: str, request: Any, real: httpx.Response, emulated: httpx.Response) -> list[str]:
    diffs = []
    if real.status_code != emulated.status_code:
        return [f"status: sglang {real.status_code} ({real.text[:200]}), emulator {emulated.status_code}"]
    media = [r.headers.get("content-type", "").split(";")[0] for r in (real, emulated)]
    if media[0] != media[1]:
        return [f"content type: sglang {media[0]}, emulator {media[1]}"]
    if media[0] == "text/event-stream":
        return _stream_diff(real.text, emulated.text)
    a, b = real.json(), emulated.json()
    if real.status_code != 200:
        a, b = dict(a), dict(b)
        a["message"], b["message"] = _mask(a["message"]), _mask(b["message"])
        if a != b:
            diffs.append(f"error: sglang {a}, emulator {b}")
        return diffs
    diffs += _shape_diff(a, b, "answer")
    body = request if isinstance(request, dict) else None
    verdicts = [polar_model.decide(r.content, body) for r in (real, emulated)]
    if verdicts[0].verdict != verdicts[1].verdict or (verdicts[0].trainable_tokens > 0) != (
        verdicts[1].trainable_tokens > 0
    ):
        diffs.append(f"Polar's verdict: sglang {verdicts[0].verdict}, emulator {verdicts[1].verdict}")
    outcomes = [tool_exchange.classify(x)[0::2] for x in (a, b)]
    if body and body.get("tools") and outcomes[0] != outcomes[1]:
        diffs.append(f"tool outcome: sglang {outcomes[0]}, emulator {outcomes[1]}")
    return diffs


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_emulator_answers_like_sglang(name, real_engine, engine, scripted_tool_fields):
    request = REQUESTS[name]
    if request == "tools":
        request = {**tool_exchange.tool_request(MODEL), **scripted_tool_fields}
    # each answer is the second to the same request: both prefix caches then hold it (cached_tokens > 0), so
    # the comparison does not depend on what either engine served before
    _send(real_engine.url, request), _send(engine.url, request)
    real, emulated = _send(real_engine.url, request), _send(engine.url, request)
    diffs = _body_diff(name, request, real, emulated)
    assert not diffs, "\n".join(diffs)
