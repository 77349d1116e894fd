"""Pins the docker runtime's run state (issue 10, point 8): `make up PROFILE=patched-router` records the profile in
.run/docker-state.json, `make smoke` / `make train` / `make down` without PROFILE then act on it instead of
falling back to engine-direct, and `make down` forgets it. Also pins the .dockerignore: the build context of
every image (the repository root) excludes .venv, .run and .git but keeps what the Dockerfiles COPY.
Runs against a fake node (tests/fake_node.py): no Docker, no GPU."""

import json
import re
import subprocess

import pytest

import fake_node
from polarstack import docker_state
from polarstack.cli import main
from polarstack.errors import ExitCode
from polarstack.pins import repo_root

pytestmark = pytest.mark.unit
ROOT = repo_root()


@pytest.fixture
def node(tmp_path, monkeypatch):
    log = fake_node.install(tmp_path, monkeypatch)
    # Weights, sandbox and apptainer present, so `compose up` reaches Compose.
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", "model-download trainer")
    return log


def compose_calls(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("compose ")]


def test_up_records_the_profile_and_train_smoke_down_follow_it(node, capsys):
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    state = docker_state.read()
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
    assert docker_state.read() is None
    capsys.readouterr()
    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "engine-direct"


def test_smoke_without_profile_checks_the_profile_that_is_up(node, monkeypatch, capsys):
    seen = {}

    def fake_smoke(base_url, **kwargs):
        seen.update(base_url=base_url, **kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("polarstack.smoke.run_smoke", fake_smoke)
    assert main(["compose", "up", "--profile", "router-passthrough"]) == 0
    with pytest.raises(SystemExit):
        main(["smoke", "--runtime", "auto"])
    assert seen["base_url"] == "http://127.0.0.1:30080"


def test_failed_up_records_nothing(node, monkeypatch):
    monkeypatch.setenv("FAKE_COMPOSE_RC", "1")
    assert main(["compose", "up", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    assert docker_state.read() is None


def test_makefile_passes_no_default_profile():
    out = subprocess.run(["make", "-n", "smoke", "train", "TASK=humaneval", "DRY_RUN=1"], capture_output=True,
                         text=True, cwd=ROOT).stdout
    assert "--profile" not in out  # the CLI resolves it from .run/docker-state.json
    out = subprocess.run(["make", "-n", "up", "PROFILE=patched-router"], capture_output=True, text=True, cwd=ROOT).stdout
    assert '--profile "patched-router"' in out and "make up:" in out  # and prints its elapsed time


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
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
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
