"""Pins the router catalog against router-behavior.md's measured table (which releases forward Polar's
chat request fields, which have slime's worker API, which flags each launch accepts)."""

import pytest

from polarstack.errors import StackError
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.harness import venv_dir

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "spec,forwards",
    [
        ("sglang-router==0.1.0", True),
        ("sglang-router==0.1.4", True),
        ("sglang-router==0.1.5", False),
        ("sglang-router==0.2.4", False),
        ("sglang-router==0.3.2", False),
        ("smg==1.4.1", False),
        ("smg==1.5.0", True),
        ("smg==1.13.0", True),
    ],
)
def test_forwarding_matches_the_measured_table(spec, forwards):
    assert RouterRelease.parse(spec).forwards_unknown_chat_fields is forwards


def test_launch_flags_per_release():
    old = RouterRelease.parse("sglang-router==0.1.0").launch_args(9000, ["http://127.0.0.1:1"], 9001)
    assert "--worker-startup-check-interval" not in old and "--prometheus-port" not in old
    passthrough = RouterRelease.parse("sglang-router==0.1.4").launch_args(9000, [], 9001)
    assert "--worker-startup-check-interval" in passthrough and "--prometheus-port" not in passthrough
    stock = RouterRelease.parse("sglang-router==0.3.2").launch_args(9000, [], 9001)
    assert stock[stock.index("--prometheus-port") + 1] == "9001"
    assert stock[stock.index("--host") + 1] == "127.0.0.1"  # 0.3.2 binds 0.0.0.0 without --host
    assert RouterRelease.parse("smg==1.13.0").module == "smg.launch_router"


def test_worker_api():
    assert not RouterRelease.parse("sglang-router==0.1.4").has_worker_api
    assert RouterRelease.parse("sglang-router==0.3.2").has_worker_api
    assert RouterRelease.parse("smg==1.5.0").has_worker_api


@pytest.mark.parametrize("spec", ["sglang-router", "nginx==1.0", "smg==latest"])
def test_bad_specs_are_rejected(spec):
    with pytest.raises(StackError):
        RouterRelease.parse(spec)


def test_each_release_has_its_own_venv():
    a, b = RouterRelease.parse("sglang-router==0.1.4"), RouterRelease.parse("sglang-router==0.1.5")
    assert venv_dir(a) != venv_dir(b)


def test_started_processes_inherit_no_credentials(monkeypatch):
    from polarstack.processes import child_env

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env = child_env()
    assert "HF_TOKEN" not in env and "OPENAI_API_KEY" not in env and env["PATH"]
