"""The engines sample from the distribution slime's loss scores (fresh node-path review after issue 26, finding 1).

sglang 0.5.15.post1 defaults `--sampling-defaults` to "model": every sampling field a request leaves out
(temperature, top_p, top_k, min_p, repetition_penalty) comes from the weights' generation_config.json, while slime's
loss scores the rollout tokens at rollout_temperature 1.0 with no truncation. Polar's gateway adds no sampling field,
so the rollout log-probs would be biased on every sample. Pinned: the recorded fact, the engines' flag in
compose.yaml, and verify-offline's check (which fails on the compose file without the flag).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from polarstack.offline import meaning
from polarstack.paths import load_defaults
from polarstack.pins import repo_root
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

RECORDED = meaning.sampling_facts()


def _recorder():
    spec = importlib.util.spec_from_file_location(
        "record_sampling_defaults", repo_root() / "scripts" / "tools" / "record_sampling_defaults.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compose_engines() -> dict[str, list[str]]:
    model = yaml.safe_load((repo_root() / "compose" / "compose.yaml").read_text())
    return {name: meaning.engine_tokens(s) for name, s in model["services"].items() if name.startswith("engine-")}


def _train_args(profile: str = "engine-direct") -> list[str]:
    return build_plan(
        "humaneval", profiles.load(profile), run_id="t", config=load_defaults(), cluster=load_cluster()
    ).train_args


def test_the_recorded_fact_says_what_the_check_relies_on():
    assert RECORDED["sglang"]["version"] == "0.5.15.post1" and RECORDED["sglang"]["default"] == "model"
    assert {"temperature", "top_p", "top_k", "repetition_penalty"} <= set(RECORDED["sglang"]["model_keys"])
    assert "openai" in RECORDED["sglang"]["choices"]
    assert RECORDED["slime"]["rollout_temperature_default"] == 1.0


def test_every_engine_of_the_compose_file_samples_with_the_openai_defaults():
    engines = _compose_engines()
    assert set(engines) == {"engine-0", "engine-1"}
    assert meaning.sampling_problems(engines, _train_args(), RECORDED) == []


@pytest.mark.parametrize("tokens,needle", [([], "the default"), (["--sampling-defaults", "model"], "'model'")])
def test_an_engine_on_the_model_defaults_is_refused(tokens, needle):
    problems = meaning.sampling_problems({"engine-0": ["--port", "30000", *tokens]}, _train_args(), RECORDED)
    assert len(problems) == 1 and needle in problems[0] and "--sampling-defaults openai" in problems[0]


def test_an_unknown_choice_and_another_rollout_temperature_are_refused():
    problems = meaning.sampling_problems({"engine-0": ["--sampling-defaults", "greedy"]}, [], RECORDED)
    assert problems and "not a choice" in problems[0]
    args = _train_args() + ["--rollout-temperature", "0.7"]
    problems = meaning.sampling_problems({"engine-0": ["--sampling-defaults", "openai"]}, args, RECORDED)
    assert len(problems) == 1 and "--rollout-temperature 0.7" in problems[0]


def test_where_the_pin_already_defaults_to_openai_no_flag_is_needed():
    recorded = json.loads(json.dumps(RECORDED))
    recorded["sglang"]["default"] = "openai"
    assert meaning.sampling_problems({"engine-0": []}, _train_args(), recorded) == []


def test_the_recorder_reads_each_fact_from_source_text():
    recorder = _recorder()
    server_args = (
        "from typing import Annotated as A\nclass ServerArgs:\n    other: int = 1\n"
        "    sampling_defaults: A[\n        str,\n        Arg(help='x', choices=['openai', 'model']),\n"
        "    ] = 'model'\n"
    )
    assert recorder.sampling_field(server_args) == {"default": "model", "choices": ["openai", "model"], "line": 4}
    model_config = (
        "class ModelConfig:\n    def get_default_sampling_params(self):\n"
        "        available_params = ['temperature', 'top_p']\n        return {}\n"
    )
    assert recorder.model_params(model_config) == {"keys": ["temperature", "top_p"], "line": 2}
    arguments = "p.add_argument(\n    '--rollout-temperature',\n    type=float,\n    default=1.0,\n)\n"
    loss = "def f(args, logits):\n    t = args.rollout_temperature\n    logits = logits / rollout_temperature\n"
    assert recorder.rollout_temperature(arguments, loss) == {"default": 1.0, "line": 1, "loss_line": 3}
    with pytest.raises(SystemExit):
        recorder.rollout_temperature(arguments, "logits = logits\n")
