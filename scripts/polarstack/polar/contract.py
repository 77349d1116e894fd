"""Polar's token contract: the request it sends to SGLang.

Behaviour matched (read, not copied) from NVIDIA-NeMo/ProRL-Agent-Server, `src/polar/gateway/engine.py`,
`SGLangEngine.prepare_request`: the request adds `logprobs`, `return_prompt_token_ids`, `return_meta_info` (and
`proxy.py` forces `stream: false`). What Polar reads back from the answer is polar.model (`normalize`, the trace,
the adapter); why an answer gives nothing to train on is polar.diagnostics.
"""

from __future__ import annotations

import copy
from typing import Any

# The request fields Polar's SGLangEngine adds (names matter: routers drop exactly these).
POLAR_REQUEST_FLAGS = ("return_prompt_token_ids", "return_meta_info")


def prepare_request(request: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of an OpenAI chat request shaped as Polar's gateway sends it to SGLang."""
    shaped = copy.deepcopy(request)
    shaped.pop("stream", None)
    shaped["stream"] = False  # proxy.py InferenceClient._completion
    shaped["logprobs"] = True  # InferenceEngine.prepare_request
    for flag in POLAR_REQUEST_FLAGS:  # SGLangEngine.prepare_request
        shaped[flag] = True
    return shaped
