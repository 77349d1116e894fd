"""Pins Polar's request shape (SGLangEngine.prepare_request, see scripts/polarstack/polar/contract.py)."""

import pytest

from polarstack.polar import contract

pytestmark = pytest.mark.unit


def test_prepare_request_adds_polar_fields_without_mutating_input():
    original = {"model": "m", "messages": [], "stream": True}
    shaped = contract.prepare_request(original)
    assert shaped["stream"] is False and shaped["logprobs"] is True
    assert shaped["return_prompt_token_ids"] is True and shaped["return_meta_info"] is True
    assert original == {"model": "m", "messages": [], "stream": True}
