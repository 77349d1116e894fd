"""Pins polarstack.stack.target.resolve_target, the one rule for what smoke and train talk to (issue 14 point 1): an
explicit --base-url wins; else the stack `polarstack up` recorded (its URL, route and engines), refused (STATE) when
--profile names another profile than the one up locally - for smoke as for train; else the docker runtime's profile
(its ports, and the engines a slime-registered router needs registered). Also pins the typed run state
(LocalState.profile/route/engine_urls, docker_state.DockerRecord). No processes: a hand-written run state whose
only process is this test's own (alive and owned)."""

import json
import os

import pytest

from polarstack import processes
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.stack import docker_state, local, profiles
from polarstack.stack.profiles import docker_engine_urls, registered_engines
from polarstack.stack.target import resolve_target

pytestmark = pytest.mark.unit


@pytest.fixture
def local_up(tmp_path, monkeypatch):
    """A local state of engine-direct whose recorded process is this test process (so `usable` accepts it)."""
    me = os.getpid()
    (tmp_path / "state.json").write_text(
        json.dumps(
            {
                "profile": "engine-direct",
                "runtime": "local",
                "route": "polar",
                "base_url": "http://127.0.0.1:9",
                "engine_urls": ["http://127.0.0.1:9"],
                "processes": [{"role": "engine-0", "pid": me, "start_time": processes.start_time(me), "port": 9}],
            }
        )
    )
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    return tmp_path


def test_an_explicit_base_url_wins_over_any_run_state(local_up):
    target = resolve_target("auto", "patched-router", "http://127.0.0.1:7", route="base")
    assert (target.runtime, target.base_url, target.route, target.engine_urls, target.register) == (
        "url",
        "http://127.0.0.1:7",
        "base",
        None,
        None,
    )


def test_the_local_stack_gives_url_route_and_engines(local_up):
    target = resolve_target("auto", None, None)
    assert target.local and target.profile == "engine-direct"
    assert (target.base_url, target.route, target.engine_urls) == (
        "http://127.0.0.1:9",
        "polar",
        ["http://127.0.0.1:9"],
    )
    assert resolve_target("local", "engine-direct", None, route="base").route == "base"  # --route wins
    state = local.read_state()
    assert (state.profile, state.route, state.engine_urls) == ("engine-direct", "polar", ["http://127.0.0.1:9"])


@pytest.mark.parametrize("verb", ["smoke", "train"])
def test_another_profile_than_the_one_up_locally_is_refused_by_smoke_and_train(local_up, verb):
    with pytest.raises(StackError) as caught:
        resolve_target("auto", "patched-router", None, verb=verb)
    assert caught.value.code == ExitCode.STATE
    assert "profile engine-direct is up locally, not patched-router" in caught.value.message


def test_make_smoke_with_another_profile_refuses_instead_of_checking_the_local_one(local_up, capsys):
    """`make smoke PROFILE=patched-router` while engine-direct is up locally: it used to smoke engine-direct."""
    assert main(["smoke", "--profile", "patched-router", "--runtime", "auto"]) == ExitCode.STATE
    assert "is up locally, not patched-router" in capsys.readouterr().err


def test_nothing_up_locally_is_refused_per_verb(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    with pytest.raises(StackError) as smoke:
        resolve_target("local", None, None, verb="smoke")
    with pytest.raises(StackError) as train:
        resolve_target("local", None, None, verb="train")
    assert (smoke.value.code, train.value.code) == (ExitCode.USAGE, ExitCode.STATE)


def test_a_dry_run_with_nothing_up_plans_the_default_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    target = resolve_target("auto", None, None, verb="train", plan_only=True)
    assert (target.runtime, target.profile, target.base_url) == ("docker", "engine-direct", "http://127.0.0.1:30000")
    with pytest.raises(StackError) as caught:  # a real run needs the record of `make up`
        resolve_target("auto", None, None, verb="train")
    assert caught.value.code == ExitCode.STATE


def test_the_docker_target_registers_engines_only_where_slime_does(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    for name, registers in (("patched-router", True), ("router-passthrough", False), ("engine-direct", False)):
        profile = profiles.load(name)
        engines = docker_engine_urls(profile)
        assert engines == [f"http://127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]
        assert registered_engines(profile, engines) == (engines if registers else None), name
        target = resolve_target("docker", name, None, in_trainer=True)  # inside the trainer: no record is read
        assert (target.base_url, target.route, target.engine_urls) == (profile.base_url(), profile.route, engines)


def test_the_docker_record_has_a_typed_view():
    record = docker_state.DockerRecord.of({"profile": "patched-router", "base_url": "http://127.0.0.1:30080"})
    assert (record.profile, record.base_url, record.route) == ("patched-router", "http://127.0.0.1:30080", None)


def test_smoke_options_come_from_a_local_stack_of_real_engines_only(local_up):
    """The smoke (`polarstack smoke`) and train's gate (`make train` against a local stack) read the real engine's
    scripted tool answer, why it may not pass the router, and the longer timeout from the run state (as the caller's
    site read it); the
    emulator's stack and any non-local target give none."""
    target = resolve_target("auto", None, None)
    assert local.smoke_options(target, local.read_state()) == {}  # the emulator (no "engine" recorded)
    state = json.loads((local_up / "state.json").read_text())
    script = {"custom_logit_processor": "p", "custom_params": {"token_ids": [1]}}
    state.update(engine="sglang", tool_fields=script, tool_unscripted="dropped by the router")
    (local_up / "state.json").write_text(json.dumps(state))
    from polarstack.stack import real_sglang

    assert local.smoke_options(target, local.read_state()) == {
        "tool_fields": script,
        "tool_unscripted": "dropped by the router",
        "timeout": real_sglang.SMOKE_TIMEOUT,
    }
    url = resolve_target("auto", None, "http://127.0.0.1:7", route="base")
    assert local.smoke_options(url, local.read_state()) == {}


def test_the_docker_target_at_two_nodes_names_every_node_for_the_smoke(tmp_path, monkeypatch):
    """NODES>1 (issue 28 point 4): the docker target's base URL is the head's router and it carries every node's
    engines by cluster address, so `make smoke` on the head checks each engine of each node (checks.per_engine)."""
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    for key, value in {
        "NODES": "2",
        "NODE_RANK": "0",
        "CLUSTER_IFACE": "lo",
        "NODE_ADDRS": "10.9.0.1,10.9.0.2",
    }.items():
        monkeypatch.setenv(key, value)
    profile = profiles.load("patched-router")
    target = resolve_target("docker", "patched-router", None, in_trainer=True)
    assert target.base_url == f"http://10.9.0.1:{profile.router_port}"
    assert [node["addr"] for node in target.nodes] == ["10.9.0.1", "10.9.0.2"]
    assert [url for node in target.nodes for url in node["engine_urls"]] == target.engine_urls
    assert all(url.startswith(("http://10.9.0.1:", "http://10.9.0.2:")) for url in target.engine_urls)
    monkeypatch.setenv("NODES", "1")
    assert resolve_target("docker", "patched-router", None, in_trainer=True).nodes is None
