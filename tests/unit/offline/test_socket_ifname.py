"""Pins NCCL and Gloo on loopback at NODES=1 (issue 34 point 3): with host networking, NCCL left alone takes an ib* or
any other non-loopback interface and Gloo the hostname's address (configs/upstream/socket-ifname.json, recorded by
scripts/tools/record_socket_ifname.py), so the trainer, the engines, launch.sh and the Ray job set
NCCL_SOCKET_IFNAME=lo and GLOO_SOCKET_IFNAME=lo; `make verify-offline` checks the environments and what the record
means."""

import copy
import json

import pytest

from polarstack.offline import socket_ifname
from polarstack.paths import load_defaults
from polarstack.stack import compose, exposure, profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit
LOOPBACK = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_compose_gives_the_trainer_and_every_engine_loopback_interfaces():
    services = compose.compose_services()
    for name in ("trainer", "engine-0", "engine-1"):
        env = services[name]["environment"]
        assert {k: env.get(k) for k in LOOPBACK} == LOOPBACK, name
        assert exposure.interface_problems(env, name) == []


@pytest.mark.parametrize("name", profiles.available())
def test_launch_sh_and_the_ray_job_set_loopback_interfaces(name, tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    plan = build_plan("humaneval", profiles.load(name), run_id="t", config=load_defaults(), cluster=load_cluster())
    submit = plan.commands[-1]
    job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]
    assert {k: job_env.get(k) for k in LOOPBACK} == LOOPBACK
    assert exposure.trainer_problems(job_env, name, plan.train_args) == []
    for key, value in LOOPBACK.items():
        assert f"export {key}={value}\n" in plan.files["launch.sh"]


def test_a_missing_interface_is_named():
    found = exposure.interface_problems({"NCCL_SOCKET_IFNAME": "lo"}, "trainer")
    assert len(found) == 1 and "GLOO_SOCKET_IFNAME=lo is missing" in found[0]
    assert len(exposure.trainer_problems({}, "trainer")) >= 2


def test_the_record_means_loopback_is_the_right_choice():
    assert socket_ifname.problems() == []


def test_record_problems_catch_a_different_rule():
    data = socket_ifname.record()
    broken = copy.deepcopy(data)
    broken["nccl"]["tags"][0]["picks"].insert(0, {"prefix": "lo"})
    assert any("does not start with ib*" in p for p in socket_ifname.problems(broken))
    broken = copy.deepcopy(data)
    next(r for r in broken["gloo"]["runs"] if r["GLOO_SOCKET_IFNAME"] == "lo")["listened_on"] = ["192.0.2.2"]
    assert any("GLOO_SOCKET_IFNAME=lo did not listen on loopback" in p for p in socket_ifname.problems(broken))
    broken = copy.deepcopy(data)
    next(r for r in broken["gloo"]["runs"] if r["GLOO_SOCKET_IFNAME"] is None)["listened_on"] = ["10.0.0.9"]
    assert any("without GLOO_SOCKET_IFNAME" in p for p in socket_ifname.problems(broken))
