"""Engine answers shared by the smoke's verdict tests (tests/unit/checks/test_smoke.py) and the second-opinion tests
(tests/unit/polar/test_opinion.py): a Polar-shaped chat completion, and sglang's answer to the smoke's tool request."""

from __future__ import annotations

import json


def answer(prompt=(1, 2, 3), output=((-0.5, 10, "a"), (-0.25, 11, "b")), usage=None, choices=1, **extra) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab"},
        "finish_reason": "stop",
        "prompt_token_ids": list(prompt),
        "logprobs": {"content": [{"token": t, "logprob": lp, "top_logprobs": []} for lp, _, t in output]},
        "meta_info": {"output_token_logprobs": [list(e) for e in output]},
        **extra,
    }
    completion = len(output) * choices
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice] * choices,
        "usage": usage
        or {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion},
    }


# What sglang started with --tool-call-parser answers to the smoke's tool request (issue 10 point 4): parsed
# tool_calls, and Polar's token fields, since that request carries Polar's flags like every other one.
TOOL_ANSWER = answer()
TOOL_ANSWER["choices"][0].update(
    finish_reason="tool_calls",
    message={
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "index": 0,
                "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "a.py", "content": "x"}'},
            }
        ],
    },
)

PROSE_MESSAGE = json.dumps({"message": answer()["choices"][0]["message"]})[1:-1].encode()
