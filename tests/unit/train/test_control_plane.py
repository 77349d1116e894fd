"""Review point 6: Polar's control-plane token (POLAR_CONTROL_PLANE_TOKEN) reaches Polar's two servers alone.

Polar's rollout server checks it on node registration, heartbeats and session results and its gateway on session
dispatch (configs/upstream/polar-facts.json control_plane), so both servers hold it or neither; the gateway starts the
agent sessions with its own environment, so launch.sh gives it only where Polar runs apptainer with --cleanenv
(POLAR_APPTAINER_CLEANENV), and says why it gives none otherwise. launch.sh makes it fresh per attempt and never
exports, prints or writes it, nor puts it on a command line or in the Ray job's env (the driver needs none).
make verify-offline (polarstack.offline.control_plane) checks the rendered script for what the facts make of it."""

from __future__ import annotations

import copy
import os
import re
import subprocess

import pytest

from polarstack.offline import control_plane as offline
from polarstack.offline import verify
from polarstack.paths import load_defaults
from polarstack.pins import repo_root
from polarstack.stack import profiles
from polarstack.stack.assets import sandbox_mode_env
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.resolved import read_now
from polarstack.train import control_plane
from polarstack.train import plan as plan_mod
from polarstack.train.plan import build_plan
from train_fakes import rendered_launch_sh

pytestmark = pytest.mark.unit

ENV = "POLAR_CONTROL_PLANE_TOKEN"
SWITCH = "POLAR_APPTAINER_CLEANENV"


@pytest.fixture
def cleanenv_on(monkeypatch):
    """The environment launch.sh runs Polar with, with Polar's --cleanenv switch (as the sessions' branch sets it)."""
    base = sandbox_mode_env
    monkeypatch.setattr(plan_mod, "sandbox_mode_env", lambda: {**base(), SWITCH: "1"})


@pytest.fixture
def cleanenv_off(monkeypatch):
    """The environment launch.sh runs Polar with, without Polar's --cleanenv switch (the stack sets it by default:
    polarstack.stack.assets.sandbox_mode_env)."""
    base = sandbox_mode_env
    monkeypatch.setattr(plan_mod, "sandbox_mode_env", lambda: {k: v for k, v in base().items() if k != SWITCH})


def _plan():
    return build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="r", config=load_defaults(), cluster=load_cluster()
    )


def _check(plan, **change) -> list[str]:
    script = change.pop("script", plan.files["launch.sh"])
    return offline.problems(
        script,
        change.pop("trainer_env", {}),
        change.pop("job_env", {}),
        change.pop("harness", "claude_code"),
        "t",
        **change,
    )


def test_the_stack_runs_polar_with_cleanenv_so_its_servers_get_the_token():
    script = _plan().files["launch.sh"]
    assert f"export {SWITCH}=1" in script and f'{ENV}="$' in script
    assert _check(_plan()) == []


def test_without_cleanenv_no_polar_server_gets_the_token_and_launch_sh_says_why(cleanenv_off):
    script = _plan().files["launch.sh"]
    assert f"{ENV}=" not in script and control_plane.VARIABLE not in script
    assert f"# No {ENV} for Polar's servers: without {SWITCH} every agent session would inherit it" in script
    assert _check(_plan()) == []


def test_with_cleanenv_both_servers_get_one_fresh_token_that_nothing_else_sees(cleanenv_on, tmp_path):
    """The rendered launch.sh run with fakes: both servers' environments hold the same 64-hex token, which is new at
    every attempt; it is in no output, no file of the run directory, no command line, and not in `ray job submit`'s
    environment (the driver needs none)."""
    dump = 'env > "$1.env"; tr "\\0" " " < /proc/$$/cmdline > "$1.cmdline"'
    job = 'env > ray.env; echo "driver ran"'
    script = rendered_launch_sh(tmp_path, job, polar=dump)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop(ENV, None)
    tokens = []
    for _ in (1, 2):
        (tmp_path / "healthy").unlink(missing_ok=True)
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert proc.returncode == 0 and "driver ran" in proc.stdout, proc.stderr
        seen = {}
        for server in ("serve_rollout", "serve_gateway"):
            values = dict(
                line.split("=", 1) for line in (tmp_path / f"{server}.env").read_text().splitlines() if "=" in line
            )
            seen[server] = values.get(ENV, "")
            assert seen[server] not in (tmp_path / f"{server}.cmdline").read_text()
        assert seen["serve_rollout"] == seen["serve_gateway"] and re.fullmatch("[0-9a-f]{64}", seen["serve_rollout"])
        token = seen["serve_rollout"]
        assert ENV not in (tmp_path / "ray.env").read_text()
        assert token not in proc.stdout + proc.stderr
        dumps = {f"{s}.env" for s in seen}
        for path in tmp_path.rglob("*"):
            if path.is_file() and path.name not in dumps:
                assert token not in path.read_text(errors="replace"), path
        tokens.append(token)
        for name in dumps:
            (tmp_path / name).unlink()
    assert tokens[0] != tokens[1]


def test_verify_offline_passes_the_rendered_script_with_and_without_the_token(cleanenv_on):
    plan = _plan()
    assert f'{ENV}="${control_plane.VARIABLE}" polar serve_gateway' in plan.files["launch.sh"]
    assert _check(plan) == [] and offline.detail(plan) == "token given to: rollout, gateway"
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        checks = [
            c
            for c in verify.check_profile(profiles.load("engine-direct"), Path(tmp), read_now())
            if "control-plane" in c.name
        ]
    assert len(checks) == 2 and all(c.ok for c in checks), [c.problems for c in checks]


def _without_prefix(script: str, server: str) -> str:
    return "\n".join(
        line.replace(f'{ENV}="${control_plane.VARIABLE}" ', "") if f"polar {server}" in line else line
        for line in script.splitlines()
    )


@pytest.mark.parametrize(
    "change,expected",
    [
        (
            lambda s: _without_prefix(s, "serve_gateway"),
            "to Polar's rollout server but not its gateway: the rollout then refuses (401) the gateway's POST /nodes/register",
        ),
        (
            lambda s: _without_prefix(s, "serve_rollout"),
            "to Polar's gateway server but not its rollout: the gateway then refuses (401) the rollout's POST /sessions (dispatch)",
        ),
        (lambda s: s.replace(f"export {SWITCH}=1\n", ""), f"the gateway holds {ENV} but runs without {SWITCH}"),
        (
            lambda s: s.replace(control_plane.MAKE, control_plane.MAKE + f'\nexport {ENV}="${control_plane.VARIABLE}"'),
            f"{ENV} is exported by launch.sh",
        ),
        (
            lambda s: s.replace(control_plane.MAKE, control_plane.MAKE + f'\necho "${control_plane.VARIABLE}"'),
            "uses the control-plane token on a line of its own",
        ),
        (
            lambda s: s.replace(
                f'{ENV}="${control_plane.VARIABLE}" polar serve_rollout', f"{ENV}=0123abcd polar serve_rollout"
            ),
            "the rollout server's POLAR_CONTROL_PLANE_TOKEN is not the attempt's random token",
        ),
        (lambda s: s.replace(control_plane.MAKE + "\n", ""), "without making it fresh"),
    ],
)
def test_verify_offline_refuses_a_launch_sh_that_breaks_a_recorded_fact(cleanenv_on, change, expected):
    plan = _plan()
    found = _check(plan, script=change(plan.files["launch.sh"]))
    assert any(expected in p for p in found), found


def test_verify_offline_refuses_the_token_in_the_job_or_the_trainer_and_a_harness_that_needs_it(cleanenv_on):
    plan = _plan()
    assert any("in the Ray job's runtime env" in p for p in _check(plan, job_env={ENV: "x"}))
    assert any("in the trainer's environment" in p for p in _check(plan, trainer_env={ENV: "x"}))
    assert any(
        "harness 'spilot_router' makes the rollout server require" in p for p in _check(plan, harness="spilot_router")
    )


def test_verify_offline_refuses_the_token_when_apptainer_would_keep_the_gateways_environment(cleanenv_on):
    """With --cleanenv the session's variables hold no token; an apptainer process beside the session that kept the
    gateway's environment (its /proc/<pid>/environ, readable in the session's user namespace) would undo it."""
    starter = copy.deepcopy(offline.json.loads((repo_root() / offline.STARTER_RECORD).read_text()))
    assert _check(_plan(), starter=starter) == []
    starter["caller_environment_kept_by_apptainer"] = True
    assert any("--cleanenv would not keep the token out" in p for p in _check(_plan(), starter=starter))


def test_the_record_pairs_every_checked_route_with_a_sender():
    """What both-or-neither rests on: each route a server checks is one the other server sends with the token."""
    record = control_plane.record()
    sent = {route: name for name, fact in record["sent_by"].items() for route in fact["routes"]}
    pairs = {(server, sent.get(route)) for server, fact in record["checked_by"].items() for route in fact["routes"]}
    assert pairs == {("rollout", "gateway"), ("gateway", "rollout")}
    assert record["sent_by"]["bridge"]["routes"] == ["POST /rollout/task/submit"]
