"""The real-engine module without the engine: preflight refusals, a missing install, the recorded facts' checks."""

import pytest

from polarstack.engine.emulator.tokenizer_manager import length_problem
from polarstack.errors import ExitCode, StackError
from polarstack.offline import real_sglang_facts
from polarstack.stack import real_sglang

pytestmark = pytest.mark.unit


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_CACHE", str(tmp_path))
    return tmp_path


def test_a_disk_too_small_is_refused_before_anything_starts(empty_cache, monkeypatch):
    monkeypatch.setattr(real_sglang.shutil, "disk_usage", lambda path: type("U", (), {"free": 2 * 2**30})())
    with pytest.raises(StackError) as caught:
        real_sglang.preflight(1)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert "12 GiB" in caught.value.message and "2.0 GiB" in caught.value.message
    assert not real_sglang.venv_dir().exists()


def test_too_little_memory_for_two_servers_is_refused(empty_cache, monkeypatch):
    monkeypatch.setattr(real_sglang.shutil, "disk_usage", lambda path: type("U", (), {"free": 100 * 2**30})())
    monkeypatch.setattr(real_sglang, "_available_memory", lambda: 6 * 2**30)
    real_sglang.preflight(1)  # one server fits in 6 GiB
    with pytest.raises(StackError) as caught:
        real_sglang.preflight(2)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert "2 real sglang server(s) need about 8 GiB" in caught.value.message


def test_a_missing_install_is_an_environment_sentence(empty_cache):
    with pytest.raises(StackError) as caught:
        real_sglang.require_installed()
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert "polarstack sglang-install" in caught.value.message


def test_the_launch_is_the_recorded_cpu_launch():
    args = real_sglang.launch_args("/m", 1234, served_model_name="served", tool_call_parser="qwen")
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--attention-backend") + 1] == "torch_native"
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[-2:] == ["--tool-call-parser", "qwen"]
    assert "--tool-call-parser" not in real_sglang.launch_args("/m", 1, served_model_name="s", tool_call_parser=None)
    assert real_sglang_facts.problems() == []


def test_the_facts_check_catches_a_launch_that_drifted(monkeypatch):
    original = real_sglang.launch_args

    def drifted(*args, **kwargs):
        return [a for a in original(*args, **kwargs) if a != "--sleep-on-idle"] + ["--no-such-flag"]

    monkeypatch.setattr(real_sglang, "launch_args", drifted)
    found = real_sglang_facts.problems()
    assert any("--no-such-flag is not an option" in p for p in found)
    assert any("without --sleep-on-idle" in p for p in found)


def test_the_emulator_refuses_long_requests_with_sglangs_sentences():
    assert length_problem(10, 32758) is None  # exactly the context: accepted (tokenizer_manager uses >)
    assert length_problem(10, 32759).startswith(
        "Requested token count exceeds the model's maximum context length of 32768 tokens. You requested a total "
        "of 32769 tokens: 10 tokens from the input messages and 32759 tokens for the completion."
    )
    assert length_problem(32768, None) == (
        "The input (32768 tokens) is longer than the model's context length (32768 tokens)."
    )
    assert length_problem(100, None) is None


def test_the_script_is_unreachable_exactly_behind_routers_without_a_catch_all():
    """custom_logit_processor is an unknown request field: it reaches the engine with no router and behind releases
    that forward unknown chat fields (routers.catalog), and is dropped, with a sentence, behind the others."""
    from polarstack.routers.catalog import RouterRelease

    assert real_sglang.script_unreachable(None) is None
    for spec in ("sglang-router==0.1.4", "smg==1.5.0", "smg==1.13.0"):
        assert real_sglang.script_unreachable(RouterRelease.parse(spec)) is None, spec
    for spec in ("sglang-router==0.1.5", "sglang-router==0.3.2", "smg==1.4.1"):
        reason = real_sglang.script_unreachable(RouterRelease.parse(spec))
        assert reason and spec in reason and "scripted" in reason, spec
