"""Pins profile validation: every shipped profile is valid, and broken ones fail with the file and the fix named."""

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.stack import profiles

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_shipped_profiles_are_valid(name):
    profile = profiles.load(name)
    assert profile.name == name
    assert not set(profile.engine_gpus) & set(profile.trainer_gpus)


def test_profile_roles_and_routers():
    assert profiles.load("engine-direct").router is None
    assert profiles.load("router-passthrough").router.forwards_unknown_chat_fields
    assert profiles.load("patched-router").router.forwards_unknown_chat_fields
    assert not profiles.load("stock-router").router.forwards_unknown_chat_fields
    assert profiles.load("stock-router").expect == "TOKENS_MISSING"


def broken(tmp_path, name, replace):
    src = profiles.profiles_dir() / f"{name}.env"
    text = src.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / f"{name}.env"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "replace,needle",
    [
        ({"TRAINER_GPUS=1,2,3": "TRAINER_GPUS=0,1,2"}, "GPU 0 is in both ENGINE_GPUS and TRAINER_GPUS"),
        ({"TRAINER_GPUS=1,2,3": "TRAINER_GPUS=1,2,3,4"}, "GPU 4 does not exist on a 4-GPU node"),
        ({"ENGINE_COUNT=1": "ENGINE_COUNT=2"}, "one GPU per engine"),
        ({"POLAR_ROUTE=polar": "POLAR_ROUTE=sideways"}, "POLAR_ROUTE=sideways must be one of"),
        ({"ENGINE_PORT_BASE=30000\n": ""}, "missing ENGINE_PORT_BASE"),
        ({"EXPECT_SMOKE=pass": "EXPECT_SMOKE=pass\nGPU_COUNT=4"}, "unknown key GPU_COUNT"),
    ],
)
def test_broken_profiles_name_file_and_fix(tmp_path, replace, needle):
    path = broken(tmp_path, "engine-direct", replace)
    with pytest.raises(StackError) as exc:
        profiles.load("engine-direct", path=path)
    assert exc.value.code == ExitCode.USAGE
    assert str(path) in exc.value.message and needle in exc.value.message


def test_static_only_router_cannot_register(tmp_path):
    path = broken(tmp_path, "router-passthrough", {"ROUTER_REGISTRATION=static": "ROUTER_REGISTRATION=register"})
    with pytest.raises(StackError, match="has no POST /workers"):
        profiles.load("router-passthrough", path=path)


def test_environment_overrides_profile_values(monkeypatch):
    monkeypatch.setenv("TRAINER_GPUS", "0,1")
    with pytest.raises(StackError, match="GPU 0 is in both"):
        profiles.load("engine-direct")


def test_unknown_profile():
    with pytest.raises(StackError, match="choose one of"):
        profiles.load("nope")


@pytest.mark.parametrize(
    "value,needle",
    [
        (
            "--policy sticky",
            "ROUTER_ARGS --policy sticky: sglang-router==0.1.4 offers random, round_robin, cache_aware",
        ),
        ("--port 9", "ROUTER_ARGS sets --port, which the stack sets itself"),
        ("--worker-urls=http://x", "ROUTER_ARGS sets --worker-urls"),
        ("--cache-threshold '0.5 0.6'", "holds a space"),
        ("--policy", "ends with --policy"),
        ("--policy 'cache_aware", "is not a list of shell words"),
    ],
)
def test_router_args_are_validated(monkeypatch, value, needle):
    monkeypatch.setenv("ROUTER_ARGS", value)
    with pytest.raises(StackError) as exc:
        profiles.load("router-passthrough")
    assert exc.value.code == ExitCode.USAGE and needle in exc.value.message


def test_router_args_need_a_router(monkeypatch):
    monkeypatch.setenv("ROUTER_ARGS", "--policy round_robin")
    with pytest.raises(StackError, match="ROUTER_ARGS needs a ROUTER"):
        profiles.load("engine-direct")


def test_router_args_reach_the_local_runtime_launch(monkeypatch):
    monkeypatch.setenv("ROUTER_ARGS", "--policy=round_robin --cache-threshold 0.9")
    profile = profiles.load("patched-router")
    assert profile.router_args == ["--policy=round_robin", "--cache-threshold", "0.9"]
    args = profile.router.launch_args(30080, [], 30081, profile.router_args)
    assert args[-3:] == ["--policy=round_robin", "--cache-threshold", "0.9"]


def test_each_pinned_router_names_its_policies():
    for name in ("router-passthrough", "patched-router", "stock-router"):
        policies = profiles.load(name).router.policies
        assert {"random", "round_robin", "cache_aware"} <= set(policies)
    assert "consistent_hashing" in profiles.load("patched-router").router.policies
