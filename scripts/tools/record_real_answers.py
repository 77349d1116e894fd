#!/usr/bin/env python3
"""Record real sglang answers (the pinned release on the CPU, polarstack.stack.real_sglang) for the Polar agreement corpus.

Each entry is a Polar-shaped request and the engine's raw answer bytes: single turns, a session's second turn,
logprobs with top_logprobs, n=2, the smoke's tool request with its scripted answer, and the same without Polar's
two fields. tests/unit/polar/test_model.py runs the verdict model and the rule-table oracle on every one.

Run from the repository with its venv (starts one server, or uses --url), after a pin change:
  .venv/bin/python scripts/tools/record_real_answers.py > tests/fixtures/real-sglang-answers.json
"""

import argparse
import base64
import json
import os
import sys

import httpx

from polarstack.checks import tool_exchange
from polarstack.engine import tool_parser
from polarstack.pins import pin
from polarstack.polar import contract
from polarstack.stack import real_sglang
from polarstack.stack.profiles import knob


def requests(model: str, scripted: dict) -> dict[str, dict]:
    hello = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    knobs = tool_exchange.knobs_from(os.environ)  # the smoke's knobs, as a tool reads them: its environment
    session = hello + [
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Now add a docstring."},
    ]

    def polar(messages, **extra):
        return contract.prepare_request({"model": model, "messages": messages, "max_tokens": 16, **extra})

    return {
        "single": polar(hello),
        "session_turn_2": polar(session),
        "top_logprobs": polar(hello, top_logprobs=3),
        "n_2": polar(hello, n=2, temperature=1.0),
        "tool_call_scripted": {**tool_exchange.tool_request(model, knobs=knobs), **scripted},
        "no_polar_fields": {"model": model, "messages": hello, "max_tokens": 16},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a running real server (default: start one)")
    args = parser.parse_args()
    engine = None
    url = args.url
    if url is None:
        engine = real_sglang.start(
            served_model_name=knob(None, "SERVED_MODEL_NAME"),
            tool_call_parser=knob(None, "ENGINE_TOOL_CALL_PARSER") or None,
            progress=lambda m: print(m, file=sys.stderr),
        )
        url = engine.url
    try:
        scripted = real_sglang.scripted_answer(tool_parser.smoke_call_text())
        entries = []
        with httpx.Client(timeout=300) as http:
            for name, body in requests(knob(None, "SERVED_MODEL_NAME"), scripted).items():
                answer = http.post(f"{url}/v1/chat/completions", json=body)
                answer.raise_for_status()
                sent = {k: v for k, v in body.items() if k not in ("custom_logit_processor", "custom_params")}
                entries.append({"name": name, "request": sent, "body_b64": base64.b64encode(answer.content).decode()})
    finally:
        if engine is not None:
            engine.stop()
    record = {
        "what": "Raw answers of the real pinned sglang on the CPU (tiny random Qwen2), for the Polar agreement corpus.",
        "regenerate": ".venv/bin/python scripts/tools/record_real_answers.py > tests/fixtures/real-sglang-answers.json",
        "sglang_version": pin("SGLANG_VERSION"),
        "model": real_sglang.MODEL_CONFIG,
        "answers": entries,
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
