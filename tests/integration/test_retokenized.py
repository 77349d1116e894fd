"""Pins the re-tokenization verdict: when the guarded Polar config gives its trace builder a tokenizer and the path
drops the token ids, Polar would train on ids rebuilt from text. The smoke then refuses (exit 15, one sentence
naming the risk and the drift measured on its own requests against an engine that keeps the ids), and
--allow-retokenized lets it through. Engines are emulators on loopback; `no_extensions` answers as behind a
router that dropped Polar's request fields."""

import json
from dataclasses import replace

import pytest
import yaml

from polarstack.checks.retokenize import EMULATOR_TOKENIZER, configured_name
from polarstack.cli.main import main
from polarstack.errors import ExitCode

pytestmark = pytest.mark.emulator


def polar_config(tmp_path, tokenizer):
    template = {
        "builder": {"strategy": "prefix_merging", "config": {"tokenizer_name_or_path": tokenizer} if tokenizer else {}}
    }
    path = tmp_path / "polar_config.yaml"
    path.write_text(yaml.safe_dump({"polar_task_template": template}))
    return str(path)


def test_the_stacks_rendered_template_sets_no_tokenizer():
    assert configured_name(None) is None


def test_ids_dropped_without_a_tokenizer_stay_tokens_missing(engine_factory, tmp_path, capsys):
    engine = engine_factory()
    engine.fault("no_extensions")
    code = main(["smoke", "--base-url", engine.url, "--json", "--polar-config", polar_config(tmp_path, None)])
    assert code == ExitCode.TOKENS_MISSING
    assert json.loads(capsys.readouterr().out)["fields_missing"] == ["return_prompt_token_ids", "return_meta_info"]


def test_retokenized_only_is_refused_with_the_risk_and_measured_drift(engine_factory, tmp_path, monkeypatch, capsys):
    dropping, keeping = engine_factory(), engine_factory()
    dropping.fault("no_extensions")
    from polarstack.checks import smoke

    real = smoke.run_smoke
    monkeypatch.setattr(
        smoke, "run_smoke", lambda target, options: real(replace(target, engine_urls=[keeping.url]), options)
    )
    # The smoke's tool request as sglang dumps it ("strict": false), so Polar can rebuild its prompt too; without it
    # the tool exchange is not re-tokenizable (tests/integration/test_tool_calls.py pins that case).
    from polarstack.engine import agent_turn

    built = agent_turn.tools
    monkeypatch.setattr(
        agent_turn,
        "tools",
        lambda padded, record=None: [
            {**t, "function": {**t["function"], "strict": False}} for t in built(padded, record)
        ],
    )
    config = polar_config(tmp_path, EMULATOR_TOKENIZER)
    code = main(["smoke", "--base-url", dropping.url, "--json", "--polar-config", config])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert code == ExitCode.RETOKENIZED and report["polar_verdict"] == "retokenized"
    assert "re-tokenizes" in err and "--allow-retokenized" in err and len(err.strip().splitlines()) == 1
    drift = report["retokenization"]["drift"]
    assert (
        drift["responses"] == 6 and drift["sampled_tokens"] > 0
    )  # 4 plain requests + the two tool requests and drift["engine_urls"] == [keeping.url]
    assert "measured drift" in err
    code = main(["smoke", "--base-url", dropping.url, "--json", "--polar-config", config, "--allow-retokenized"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["polar_trainable_tokens"] > 0
    assert any(w.startswith("retokenized:") for w in report["warnings"])


@pytest.mark.unit
def test_an_unreadable_polar_config_is_a_usage_error(tmp_path, capsys):
    code = main(["smoke", "--base-url", "http://127.0.0.1:9", "--polar-config", str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "cannot read the Polar config" in err and len(err.strip().splitlines()) == 1
