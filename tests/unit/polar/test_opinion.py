"""Pins the second opinion inside the trainer: when `polar` is importable, the smoke runs the installed Polar's own
functions (orjson.loads, get_engine("sglang").normalize_response, CompletionRecord,
record_utils.build_trace_from_completion) on its raw answers and fails with one sentence when their count
disagrees with polarstack's verdict model. Polar cannot be installed here, so a stand-in package with the same
module paths, names and signatures as at POLAR_COMMIT is written below (not copied: a minimal reading of the
same contract), plus a deliberately different variant to prove a disagreement stops the smoke."""

import json
import sys
import textwrap

import httpx
import pytest

from polarstack.checks import smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode
from polarstack.polar import opinion as polar_opinion
from smoke_answers import TOOL_ANSWER

pytestmark = pytest.mark.unit

ENGINE = """
class _SGLang:
    name = "sglang"

    def normalize_response(self, response):
        response.pop("_polar_inference_timings", None)
        for choice in response.get("choices") or []:
            if choice.get("input_token_ids") is None and isinstance(choice.get("prompt_token_ids"), list):
                choice["input_token_ids"] = list(choice["prompt_token_ids"])
            entries = (choice.get("meta_info") or {}).get("output_token_logprobs")
            if isinstance(entries, list) and entries and all(e[0] is not None and e[1] is not None for e in entries):
                choice["token_ids"] = [int(e[1]) for e in entries]
                choice["logprobs"] = {"content": [{"token_id": int(e[1]), "logprob": float(e[0])} for e in entries]}
            choice.pop("meta_info", None)
        return response


def get_engine(name):
    assert name == "sglang"
    return _SGLang()
"""
MODELS = """
from typing import Any
from pydantic import BaseModel, Field


class CompletionRecord(BaseModel):
    completion_id: str
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] | None = None
"""
RECORD_UTILS = """
from polar.trajectory.models import Trace


def build_trace_from_completion(completion, *, tokenizer=None):
    choice = completion.response["choices"][0]
    prompt = choice.get("input_token_ids") or choice.get("prompt_token_ids") or []
    ids = [int(i) for i in choice.get("token_ids") or []]{cut}
    content = (choice.get("logprobs") or {{}}).get("content") or []
    logprobs = [float(c["logprob"]) for c in content] if len(content) == len(ids) and ids else None
    return Trace(prompt_ids=list(prompt), response_ids=ids, loss_mask=[1] * len(ids), response_logprobs=logprobs)
"""


@pytest.fixture
def standin(tmp_path, monkeypatch):
    def install(cut: str = ""):
        files = {
            "polar/__init__.py": "",
            "polar/gateway/__init__.py": "",
            "polar/trajectory/__init__.py": "",
            "polar/trajectory/builder/__init__.py": "",
            "polar/gateway/engine.py": ENGINE,
            "polar/trajectory/models.py": MODELS,
            "polar/trajectory/builder/record_utils.py": RECORD_UTILS.format(cut=cut),
        }
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(tmp_path))
        for name in [m for m in sys.modules if m == "polar" or m.startswith("polar.")]:
            monkeypatch.delitem(sys.modules, name)
        assert polar_opinion.available()

    yield install
    for name in [m for m in sys.modules if m == "polar" or m.startswith("polar.")]:
        del sys.modules[name]


def answer(output=((-0.5, 10, "a"), (-0.25, 11, "b"))):
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab"},
        "prompt_token_ids": [1, 2, 3],
        "logprobs": {"content": [{"token": t, "logprob": lp} for lp, _, t in output]},
        "meta_info": {"output_token_logprobs": [list(e) for e in output]},
    }
    return json.dumps({"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": len(output)}}).encode()


def smoke_on(monkeypatch, body: bytes):
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if json.loads(request.content).get("tools"):  # the smoke's tool-call check: an engine with a parser
            return httpx.Response(200, json=TOOL_ANSWER)
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))
    return smoke.run_smoke(SmokeTarget("http://engine.invalid"), SmokeOptions(requests=1, turns=0))


def test_without_polar_installed_there_is_no_second_opinion(monkeypatch):
    assert not polar_opinion.available()
    report = smoke_on(monkeypatch, answer())
    assert report.ok and report.as_dict()["installed_polar"] == "not importable"


def test_installed_polar_agrees(standin, monkeypatch):
    standin()
    report = smoke_on(monkeypatch, answer())
    assert report.ok, report.message
    assert report.exchanges[0]["installed_polar"] == {"trainable_tokens": 2, "ended": "kept"}
    assert report.as_dict()["installed_polar"] == "agrees"


def test_installed_polar_agrees_on_zero_tokens(standin, monkeypatch):
    standin()
    report = smoke_on(monkeypatch, answer(output=((None, 10, "a"),)))
    assert report.code == ExitCode.INVARIANT and report.exchanges[0]["installed_polar"]["trainable_tokens"] == 0


def test_a_disagreement_with_the_installed_polar_fails_the_smoke(standin, monkeypatch):
    standin(cut="\n    ids = ids[:1]")  # a Polar that keeps one token less than the model predicts
    report = smoke_on(monkeypatch, answer())
    assert report.code == ExitCode.INTERNAL and report.as_dict()["installed_polar"] == "disagrees"
    assert (
        "disagrees with the installed Polar" in report.message and "2 trainable tokens vs Polar's 0" in report.message
    )
