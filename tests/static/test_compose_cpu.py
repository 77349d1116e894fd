"""Pins DEVICE=cpu's Compose model without Docker (issue 27 points 2 and 3): every profile rendered by the real
Compose v2 binary with compose/compose.cpu.yaml is the node's stack minus only what a CPU machine forces: no GPU
reservation, memlock at the machine's hard limit, the engines' CPU arguments, the CPU bases (named locally, no
registry host), the trainer without its GitHub-only stage, the tiny model bound read-only, its own project, volumes
and ports. Also: no Dockerfile fetches a BuildKit frontend, and the trainer's GitHub-only steps sit in one stage."""

import json
import re
import resource
import subprocess

import pytest
import yaml

from polarstack.pins import repo_root
from polarstack.stack import compose, device, docker_state, profiles, ray_auth, ray_head
from polarstack.stack.cluster import load as load_cluster

pytestmark = pytest.mark.static
ROOT = repo_root()
NODE_PORTS = {30000, 30010, 30080, 6379, 8265}


@pytest.fixture(scope="module")
def cpu_rendered(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv(device.DEVICE_ENV, "cpu")
    # what main()'s device.apply_cpu_defaults() sets, set through the monkeypatch so that it is undone afterwards
    for key, value in device.CPU_PORTS.items():
        mp.setenv(key, value)
    mp.setenv("MODEL_PATH", device.CPU_MODEL_PATH)
    mp.setenv("ENGINE_START_PERIOD", device.CPU_ENGINE_START_PERIOD)
    model = tmp_path_factory.mktemp("tiny-model")
    mp.setenv("MODEL_DIR", str(model))
    out = {}
    try:
        for name in profiles.PROFILE_ORDER:
            tmp = tmp_path_factory.mktemp(name)
            args = compose.compose_args(profiles.load(name), tmp, cluster=load_cluster(), cpu=True)
            proc = subprocess.run(
                [str(compose.bundled_compose()), *args, "config", "--format", "json"],
                capture_output=True,
                text=True,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp)},
            )
            assert proc.returncode == 0, proc.stderr
            out[name] = (json.loads(proc.stdout), args)
    finally:
        mp.undo()
    return out, str(model)


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_cpu_stack_changes_only_what_the_machine_forces(cpu_rendered, name):
    rendered, model = cpu_rendered
    config, args = rendered[name]
    assert config["name"] == device.CPU_PROJECT and args[:2] == ["-p", device.CPU_PROJECT]
    assert not any(a.endswith(".gpus.yaml") for a in args), "no GPU reservation file on DEVICE=cpu"
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    for service_name, service in config["services"].items():
        assert "deploy" not in service or not service["deploy"].get("resources"), service_name
        assert service["image"].startswith("polarstack-cpu/"), service["image"]  # never the node's image tags
        for value in service.get("build", {}).get("args", {}).values():
            assert not re.match(r"^[\w.-]+\.[\w.-]+/", str(value)), f"{service_name}: {value} names a registry host"
        if service_name.startswith("engine-") or service_name == "trainer":
            memlock = service["ulimits"]["memlock"]
            assert memlock == (-1 if hard == resource.RLIM_INFINITY else hard) or memlock.get("soft") == hard
            assert service["network_mode"] == "host"  # as on the node
        if service_name.startswith("engine-"):
            extra = service["environment"]["ENGINE_EXTRA_ARGS"].split()
            assert extra[:4] == ["--device", "cpu", "--attention-backend", "torch_native"]
            assert "--enable-custom-logit-processor" in extra  # the smoke's scripted tool answer
            assert service["environment"]["SGLANG_USE_CPU_ENGINE"] == "1"
            assert service["build"]["args"]["SLIME_IMAGE"] == "polarstack-cpu/sglang"
            binds = [v for v in service["volumes"] if v["type"] == "bind" and v["source"] == model]
            assert binds and binds[0]["read_only"] and binds[0]["target"] == device.CPU_MODEL_PATH
            assert int(service["environment"]["ENGINE_PORT"]) not in NODE_PORTS
    trainer = config["services"]["trainer"]
    assert trainer["build"]["args"]["UPSTREAM_STAGE"] == "base"
    assert trainer["build"]["args"]["SLIME_IMAGE"] == "polarstack-cpu/trainer-base"
    assert trainer["build"]["network"] == "host"
    assert trainer["environment"]["POLARSTACK_DEVICE"] == "cpu"
    assert "--dashboard-port=31265" in trainer["command"]
    # Ray's token as on the node (compose.yaml's trainer, not overridden here): the env, the read-only mount, the
    # public healthcheck path on the CPU stack's own dashboard port (issue 28 point 2)
    assert {k: trainer["environment"][k] for k in ray_auth.TRAINER_ENV} == ray_auth.TRAINER_ENV
    binds = [v for v in trainer["volumes"] if v["target"] == ray_auth.CONTAINER_TOKEN_PATH]
    assert len(binds) == 1 and binds[0]["read_only"] and binds[0]["source"] == str(compose.token_file())
    assert trainer["healthcheck"]["test"][-1] == f"http://127.0.0.1:31265{ray_head.HEALTH_PATH}"
    assert set(config["volumes"]) and all(v["name"].startswith("polarstack-cpu_") for v in config["volumes"].values())


def test_the_node_stack_is_untouched_without_device(tmp_path, monkeypatch):
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)
    args = compose.compose_args(profiles.load("patched-router"), tmp_path, cluster=load_cluster(), cpu=False)
    assert "-p" not in args and not any("compose.cpu.yaml" in a for a in args)
    assert any(a.endswith(".gpus.yaml") for a in args)


def test_cpu_override_touches_only_named_keys():
    spec = yaml.safe_load((ROOT / "compose/compose.cpu.yaml").read_text())
    allowed = {"ulimits", "image", "build", "environment"}
    for name, service in spec["services"].items():
        assert set(service) - {"<<"} <= allowed, f"{name}: {set(service) - allowed}"
    text = (ROOT / "compose/compose.cpu.yaml").read_text()
    # every service block is explained by a comment right inside it
    for name in spec["services"]:
        block = text.split(f"\n  {name}:\n", 1)[1]
        assert block.lstrip().startswith("#") or block.lstrip().startswith("<<"), name


def test_no_dockerfile_fetches_a_frontend():
    for dockerfile in ROOT.glob("images/*/Dockerfile"):
        assert not re.search(r"^#\s*syntax=", dockerfile.read_text(), re.M), dockerfile


def test_the_trainer_github_steps_sit_in_the_upstream_stage_only():
    text = (ROOT / "images/trainer/Dockerfile").read_text()
    stages = re.split(r"^FROM .*$", text, flags=re.M)
    names = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert names == ["base", "upstream", "trainer"]
    by_name = dict(zip(names, stages[1:], strict=True))
    for stage, body in by_name.items():
        github = bool(re.search(r"SLIME_REPO|POLAR_REPO|github\.com|git -C", body))
        assert github == (stage == "upstream"), stage
    assert re.search(r"^FROM \$\{UPSTREAM_STAGE\} AS trainer$", text, re.M)


def test_state_and_project_are_per_device(monkeypatch, tmp_path):
    """The device as the site reads it (POLARSTACK_DEVICE), and what it names: the record and the Compose project."""
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)
    assert device.current() == "gpu"
    assert docker_state.state_path(tmp_path, cpu=False).name == "docker-state.json"
    assert device.project(False) == "polarstack"
    monkeypatch.setenv(device.DEVICE_ENV, "cpu")
    assert device.current() == "cpu"
    assert docker_state.state_path(tmp_path, cpu=True).name == device.CPU_STATE_FILE
    assert device.project(True) == device.CPU_PROJECT
    monkeypatch.setenv(device.DEVICE_ENV, "tpu")
    with pytest.raises(Exception, match="DEVICE=tpu is not gpu or cpu"):
        device.current()
