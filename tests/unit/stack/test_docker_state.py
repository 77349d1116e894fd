"""Pins the docker runtime's run state (issue 10, point 8): `make up PROFILE=patched-router` records the profile in
.run/docker-state.json, `make smoke` / `make train` / `make down` without PROFILE then act on it instead of
falling back to engine-direct, and `make down` forgets it. The record refuses (STATE) instead of guessing (issue 12
points 8-9): a recorded stack whose containers stopped, a half-written record, another PROFILE than the one up,
`make up` / `make down` of another profile while one runs (a stale record is replaced). `make smoke` runs inside
the trainer (`compose exec -T trainer polarstack smoke --in-trainer ...`), where the installed Polar gives its
second opinion, and the in-trainer side refuses without Polar. Also pins the .dockerignore: the build context of
every image (the repository root) excludes .venv, .run and .git but keeps what the Dockerfiles COPY.
Runs against a fake node (tests/fake_node.py): no Docker, no GPU."""

import json
import re
import subprocess

import pytest

import fake_node
from polarstack import errors
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import repo_root
from polarstack.stack import docker_state
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit
ROOT = repo_root()


@pytest.fixture
def node(tmp_path, monkeypatch):
    log = fake_node.install(tmp_path, monkeypatch)
    # Weights, sandbox and apptainer present, so `compose up` reaches Compose.
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    return log


def compose_calls(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("compose ")]


PATCHED = "engine-0 engine-1 router trainer"  # the long-running services of patched-router / router-passthrough


def test_up_records_the_profile_and_train_smoke_down_follow_it(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    state = docker_state.read(cpu=False)
    assert state["profile"] == "patched-router" and state["base_url"] == "http://127.0.0.1:30080"
    assert "--profile patched-router up --detach --wait" in compose_calls(node)[-1]
    capsys.readouterr()

    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0  # no --profile: the one that is up
    plan = json.loads(capsys.readouterr().out)
    assert plan["profile"] == "patched-router" and plan["trainer_gpus"] == [2, 3]

    assert main(["compose", "ps"]) == 0
    assert "--profile patched-router ps" in compose_calls(node)[-1]

    assert main(["compose", "down"]) == 0
    assert "--profile patched-router down" in compose_calls(node)[-1]
    assert docker_state.read(cpu=False) is None
    capsys.readouterr()
    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "engine-direct"


def trainer_report(verdict="pass", code=ExitCode.OK, message="2 requests, 18 trainable tokens") -> str:
    return json.dumps(
        {
            "verdict": verdict,
            "exit_code": int(code),
            "code": code.name,
            "message": message,
            "route": "base",
            "base_url": "http://127.0.0.1:30080",
            "model": "m",
            "polar_verdict": "trainable",
            "installed_polar": "agrees",
            "trainable_tokens": 18,
            "requests": [
                {
                    "kind": "single",
                    "turn": 0,
                    "url": "http://127.0.0.1:30080/v1/chat/completions",
                    "status": 200,
                    "polar": {"polar_trainable_tokens": 9},
                    "installed_polar": {"trainable_tokens": 9, "ended": "kept"},
                }
            ],
        }
    )


def test_smoke_without_profile_runs_inside_the_trainer_of_the_profile_that_is_up(node, monkeypatch, capsys):
    def host_smoke(*args, **kwargs):
        raise AssertionError("the docker runtime's smoke ran on the host, where Polar is not installed")

    monkeypatch.setattr("polarstack.checks.smoke.run_smoke", host_smoke)
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    monkeypatch.setenv("FAKE_TRAINER_SMOKE", trainer_report())
    assert main(["compose", "up", "--profile", "router-passthrough"]) == 0
    capsys.readouterr()
    assert main(["smoke", "--runtime", "auto", "--requests", "3", "--turns", "1", "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["installed_polar"] == "agrees"
    call = compose_calls(node)[-1]
    assert (
        "--profile router-passthrough exec -T trainer polarstack smoke --in-trainer --json --runtime docker "
        "--profile router-passthrough --requests 3 --turns 1 --timeout 10.0 --max-tokens 16 --strict" in call
    )
    assert main(["smoke"]) == 0  # the human form
    assert "installed Polar agrees" in capsys.readouterr().out


def test_the_in_trainer_command_line_is_one_the_cli_accepts_with_every_option():
    from polarstack.checks.docker_smoke import trainer_command
    from polarstack.checks.smoke_inputs import SmokeOptions
    from polarstack.cli.main import build_parser

    host = build_parser().parse_args(
        [
            "smoke",
            "--requests",
            "1",
            "--turns",
            "0",
            "--timeout",
            "2.5",
            "--max-tokens",
            "8",
            "--model",
            "m",
            "--route",
            "polar",
            "--strict",
            "--allow-retokenized",
        ]
    )
    command = trainer_command(SmokeOptions.from_args(host), "stock-router", route=host.route)
    assert command[:2] == ["polarstack", "smoke"]
    inner = build_parser().parse_args(command[1:])
    assert inner.in_trainer and inner.json and inner.profile == "stock-router"
    for key in ("requests", "turns", "timeout", "max_tokens", "model", "route", "strict", "allow_retokenized"):
        assert getattr(inner, key) == getattr(host, key), key


def test_smoke_in_the_trainer_hands_its_verdict_and_code_to_the_host(node, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    monkeypatch.setenv("FAKE_TRAINER_SMOKE", trainer_report("fail", ExitCode.TOKENS_MISSING, "no token ids came back"))
    monkeypatch.setenv("FAKE_TRAINER_SMOKE_RC", "3")
    config = tmp_path / "polar.yaml"
    config.write_text("polar_task_template: {}\n")
    capsys.readouterr()
    assert main(["smoke", "--polar-config", str(config)]) == ExitCode.TOKENS_MISSING
    assert "no token ids came back" in capsys.readouterr().err
    assert "--polar-config /run-polarstack/train/smoke/polar_config.yaml" in compose_calls(node)[-1]
    assert (
        docker_state.state_path(cpu=False).parent / "train" / "smoke" / "polar_config.yaml"
    ).read_text() == config.read_text()
    monkeypatch.delenv("FAKE_TRAINER_SMOKE")  # the trainer's polarstack died without a report
    monkeypatch.setenv("FAKE_TRAINER_SMOKE_RC", "137")
    assert main(["smoke"]) == ExitCode.ENVIRONMENT
    assert "make logs SERVICE=trainer" in capsys.readouterr().err


def test_smoke_inside_the_trainer_refuses_without_polar(node, monkeypatch, capsys):
    monkeypatch.setattr("polarstack.polar.opinion.available", lambda: False)
    monkeypatch.setattr(
        "polarstack.checks.smoke.run_smoke", lambda *a, **k: pytest.fail("smoked without the second opinion")
    )
    assert main(["smoke", "--in-trainer", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    assert "not importable" in capsys.readouterr().err


def test_smoke_inside_the_trainer_checks_the_rendered_profile(node, monkeypatch, capsys):
    seen = {}

    def fake_smoke(target, options):
        seen.update(base_url=target.base_url, register=target.register)
        raise SystemExit(0)

    monkeypatch.setattr("polarstack.polar.opinion.available", lambda: True)
    monkeypatch.setattr("polarstack.checks.smoke.run_smoke", fake_smoke)
    monkeypatch.setenv("PROFILE_NAME", "patched-router")
    monkeypatch.setenv("SGLANG_ROUTER_BASE_URL", "http://127.0.0.1:30999")  # the image's profile file is stale
    assert main(["smoke", "--in-trainer", "--profile", "patched-router"]) == ExitCode.STATE
    assert "make build PROFILE=patched-router" in capsys.readouterr().err
    monkeypatch.setenv("SGLANG_ROUTER_BASE_URL", "http://127.0.0.1:30080")
    with pytest.raises(SystemExit):
        main(["smoke", "--in-trainer", "--profile", "patched-router"])
    assert seen["base_url"] == "http://127.0.0.1:30080"
    assert seen["register"] == ["http://127.0.0.1:30000", "http://127.0.0.1:30010"]  # slime-registered engines
    assert main(["smoke", "--in-trainer"]) == ExitCode.USAGE  # no profile: nothing to check


# --- a record that is no longer true refuses -------------------------------------------------------------


def refused(capsys, args, *needles) -> str:
    assert main(args) == ExitCode.STATE, args
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("polarstack:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "running, exited", [("", ""), ("engine-0 engine-1 router", "trainer"), ("engine-0 router trainer", "")]
)
def test_a_dead_recorded_stack_is_refused_by_smoke_and_train(node, monkeypatch, capsys, running, exited):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    monkeypatch.setenv("FAKE_RUNNING", running)  # the stack died (or a part of it) behind the user's back
    monkeypatch.setenv("FAKE_EXITED", exited)
    monkeypatch.setenv("FAKE_TRAINER_SMOKE", trainer_report())  # whatever listens would pass
    capsys.readouterr()
    for args in (
        ["smoke"],
        ["smoke", "--runtime", "docker"],
        ["train", "--task", "humaneval"],
        ["train", "--task", "humaneval", "--dry-run"],
    ):
        refused(capsys, args, "is not running", "make down PROFILE=patched-router", "make up PROFILE=patched-router")
    assert not any(" exec " in call for call in compose_calls(node))  # nothing ran in a trainer
    assert "ps --all --format json" in compose_calls(node)[-1]


def test_another_profile_than_the_one_up_is_refused(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    capsys.readouterr()
    for args in (
        ["smoke", "--profile", "router-passthrough"],
        ["smoke", "--profile", "stock-router", "--runtime", "docker"],
        ["train", "--task", "humaneval", "--profile", "engine-direct"],
    ):
        refused(capsys, args, "patched-router is up", "make down PROFILE=patched-router")
    assert not any(" exec " in call for call in compose_calls(node))


def test_nothing_recorded_is_refused_by_docker_smoke_and_train(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)  # something listens, but `make up` recorded nothing
    refused(
        capsys, ["smoke", "--profile", "patched-router"], "nothing is up under Docker", "make up PROFILE=patched-router"
    )
    refused(capsys, ["train", "--task", "humaneval"], "nothing is up under Docker", "make up PROFILE=engine-direct")


def test_half_written_or_changed_record_is_refused(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    path = docker_state.state_path(cpu=False)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": "patched-router", "runtime": "docker"}))
    refused(capsys, ["smoke"], "half-written", "make up PROFILE=patched-router")
    path.write_text(
        json.dumps({"profile": "patched-router", "runtime": "docker", "base_url": "http://127.0.0.1:31000"})
    )
    refused(capsys, ["train", "--task", "humaneval"], "changed since `make up`")


def test_up_over_another_running_profile_is_refused_and_a_stale_record_replaced(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    ups = len([c for c in compose_calls(node) if c.endswith("up --detach --wait")])
    capsys.readouterr()
    refused(
        capsys,
        ["compose", "up", "--profile", "engine-direct"],
        "patched-router is up",
        "make down PROFILE=patched-router",
        "make up PROFILE=engine-direct",
    )
    assert len([c for c in compose_calls(node) if c.endswith("up --detach --wait")]) == ups  # nothing started
    assert docker_state.read(cpu=False)["profile"] == "patched-router"
    assert main(["compose", "up", "--profile", "patched-router"]) == 0  # the same profile again: fine
    monkeypatch.setenv("FAKE_RUNNING", "")  # patched-router's containers are gone
    monkeypatch.setenv("FAKE_EXITED", "engine-0 trainer")
    assert main(["compose", "up", "--profile", "engine-direct"]) == 0
    assert "forgot the record of profile patched-router" in capsys.readouterr().err
    assert docker_state.read(cpu=False)["profile"] == "engine-direct"


def test_down_of_another_profile_keeps_the_record_of_the_one_up(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", PATCHED)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    capsys.readouterr()
    for verb in ("down", "clean"):
        refused(
            capsys,
            ["compose", verb, "--profile", "engine-direct", "--yes"][: 5 if verb == "clean" else 4],
            "patched-router is up",
            "stays recorded",
            "make down PROFILE=patched-router",
        )
        assert docker_state.read(cpu=False)["profile"] == "patched-router"
    assert not any(" down" in call for call in compose_calls(node))  # nothing of patched-router was stopped
    assert main(["compose", "down"]) == 0  # the profile that is up
    assert docker_state.read(cpu=False) is None


def test_failed_up_records_nothing(node, monkeypatch):
    monkeypatch.setenv("FAKE_COMPOSE_RC", "1")
    assert main(["compose", "up", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    assert docker_state.read(cpu=False) is None


def test_up_after_an_up_that_did_not_finish_is_refused_naming_make_down(node, monkeypatch, capsys):
    """The GPU-node review's finding 4: `compose up --wait` failed (engine-0 never became healthy) and left its
    containers for `make logs`; the next `make up` recorded nothing to go by and ran `compose up --wait` again over
    them (or, with an engine listening, refused as if a stranger held its port). Now the record says the up never
    finished, and every `make up` refuses (STATE) naming what is left and `make down`, which removes it."""
    monkeypatch.setenv("FAKE_UP_RC", "1")
    monkeypatch.setenv("FAKE_UNHEALTHY", "engine-0")
    monkeypatch.setenv("FAKE_EXITED", "model-download")
    assert main(["compose", "up", "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    assert "engine-0 of profile engine-direct never passed its healthcheck" in capsys.readouterr().err
    assert docker_state.read(cpu=False)["unfinished"] == "make up"
    monkeypatch.delenv("FAKE_UP_RC")
    ups = len([c for c in compose_calls(node) if c.endswith("up --detach --wait")])
    for args in (
        ["compose", "up"],
        ["compose", "up", "--profile", "engine-direct"],
        ["compose", "up", "--profile", "patched-router"],
    ):
        refused(
            capsys,
            args,
            "an earlier `make up PROFILE=engine-direct` did not finish and left engine-0 (unhealthy), model-download "
            "(exited) under Docker (polarstack)",
            "run `make down` (it stops profile engine-direct) first",
        )
    assert len([c for c in compose_calls(node) if c.endswith("up --detach --wait")]) == ups  # nothing started again
    refused(capsys, ["smoke"], "half-written", "`make up` did not finish")
    assert main(["compose", "down"]) == 0
    assert "--profile engine-direct down" in compose_calls(node)[-1] and docker_state.read(cpu=False) is None
    monkeypatch.setenv("FAKE_UNHEALTHY", "")
    monkeypatch.setenv("FAKE_EXITED", "")
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 trainer")
    assert main(["compose", "up"]) == 0 and "base_url" in docker_state.read(cpu=False)


def test_an_unfinished_up_that_left_no_container_is_forgotten(node, monkeypatch, capsys):
    """Compose failed before it created anything (a build, a pull): nothing to take down, so `make up` goes on."""
    from polarstack.stack import profiles

    docker_state.write_unfinished(profiles.load("patched-router"), cpu=False)
    assert main(["compose", "up", "--profile", "engine-direct"]) == 0
    assert "forgot the record of an unfinished `make up PROFILE=patched-router`" in capsys.readouterr().err
    assert docker_state.read(cpu=False)["profile"] == "engine-direct" and not docker_state.unfinished(
        docker_state.read(cpu=False)
    )


def test_makefile_passes_no_default_profile():
    out = subprocess.run(
        ["make", "-n", "smoke", "train", "TASK=humaneval", "DRY_RUN=1"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert "--profile" not in out  # the CLI resolves it from .run/docker-state.json
    out = subprocess.run(
        ["make", "-n", "up", "PROFILE=patched-router"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert '--profile "patched-router"' in out and "make up:" in out  # and prints its elapsed time


def test_compose_ps_json_is_read_in_both_of_composes_formats():
    lines = '{"Service":"engine-0","State":"running","Health":"healthy"}\n{"Service":"trainer","State":"exited"}\n'
    array = '[{"Service":"engine-0","State":"running","Health":"unhealthy"},{"Service":"router","State":"running"}]'
    assert {k: v["State"] for k, v in docker_state.parse_ps(lines).items()} == {
        "engine-0": "running",
        "trainer": "exited",
    }
    assert set(docker_state.parse_ps(array)) == {"engine-0", "router"} and docker_state.parse_ps("") == {}
    with pytest.raises(errors.StackError) as caught:
        docker_state.parse_ps("NAME  IMAGE  STATUS")
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert docker_state.expected_services("patched-router") == ["engine-0", "engine-1", "router", "trainer"]
    assert docker_state.expected_services("engine-direct") == ["engine-0", "trainer"]


def test_an_unhealthy_service_counts_as_not_running(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 trainer")
    assert main(["compose", "up", "--profile", "engine-direct"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(
        docker_state,
        "parse_ps",
        lambda text: {
            "engine-0": {"State": "running", "Health": "unhealthy"},
            "trainer": {"State": "running", "Health": "healthy"},
        },
    )
    refused(capsys, ["smoke"], "engine-0 (unhealthy)")


# --- .dockerignore ----------------------------------------------------------------------------------------


def to_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex: `**` spans directories, `*` and `?` stay within one path element."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return f"^{out}$"


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; a match on a parent excludes children."""
    verdict = False
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = to_regex(pattern.lstrip("!").strip("/"))
        if any(re.match(regex, prefix) for prefix in prefixes):
            verdict = not negate
    return verdict


def test_dockerignore_keeps_venv_run_and_git_out_of_every_build_context():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (".venv/bin/python", ".run/compose/x.env", ".git/HEAD", "scripts/polarstack/__pycache__/cli.pyc"):
        assert ignored(path, patterns), path
    copied = set()
    for dockerfile in ROOT.glob("images/*/Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from" not in line:
                copied.update(line.split()[1:-1])
    assert {"pyproject.toml", "scripts", "configs"} <= copied
    for source in copied:
        assert not ignored(source, patterns), f"{source} is COPYed by a Dockerfile but excluded by .dockerignore"
        assert (ROOT / source).exists(), source


def test_a_demo_swaps_profiles_on_its_shared_engines_and_refuses_everyone_else(node, monkeypatch):
    """Issue 27 point 5: `make demo` keeps its engines running from one profile to the next; the guard tells that
    demo's own swap from a user's `make up` (or another stack's) while it runs, and an ended demo's leftovers."""
    from polarstack.errors import StackError
    from polarstack.stack import profiles

    patched, stock = profiles.load("patched-router"), profiles.load("stock-router")
    owner = docker_state.demo_owner(["engine-0", "engine-1"])
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 engine-1")  # the previous profile's router is already down
    docker_state.write(patched, cpu=False, demo=owner)
    assert docker_state.guard_other_profile("up", stock, read_now(), demo=owner) is None  # the demo's own swap
    assert docker_state.read(cpu=False) is None

    docker_state.write(patched, cpu=False, demo=owner)
    for wanted in (stock, patched):  # a user's command, even for the profile the demo runs
        with pytest.raises(StackError) as refused_:
            docker_state.guard_other_profile("up", wanted, read_now())
        assert refused_.value.code == ExitCode.STATE and f"`make demo` (pid {owner['pid']})" in refused_.value.message
    assert docker_state.read(cpu=False)["profile"] == "patched-router"

    monkeypatch.setenv("FAKE_RUNNING", "engine-0 engine-1 router")  # the demo forgot to stop the last router
    with pytest.raises(StackError) as refused_:
        docker_state.guard_other_profile("up", stock, read_now(), demo=owner)
    assert "still runs router beside the shared engines" in refused_.value.message

    ended = {**owner, "start_time": -1}  # the demo's pid now names another process: the demo has ended
    docker_state.write(patched, cpu=False, demo=ended)
    with pytest.raises(StackError) as refused_:  # its containers still run: refused like any other stack
        docker_state.guard_other_profile("up", stock, read_now(), demo=owner)
    assert "make down PROFILE=patched-router" in refused_.value.message
    monkeypatch.setenv("FAKE_RUNNING", "")
    assert docker_state.guard_other_profile("up", stock, read_now()) is None  # none runs: forgotten
