"""Pins the GPU-node review's finding 11: nothing checked that the node's Docker Compose is new enough for what the
stack's Compose files use, so an older one failed on compose.yaml (`required:` in depends_on, Compose <= 2.19.1), ignored
it (2.20.0-2.20.1), or merged the NODES>1 override's `!override` lists instead of replacing them (< 2.24.4). Every
docker-runtime target now refuses an older Compose (ENVIRONMENT) in one sentence naming the version found and the one
needed, from configs/upstream/compose-features.json (polarstack.stack.compose_version). Runs against the fake node
(tests/fake_node.py: `compose version` reports FAKE_COMPOSE_VERSION)."""

import pytest

import fake_node
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.stack import compose_version

pytestmark = pytest.mark.unit
VERBS = [["up"], ["down"], ["ps"], ["logs"], ["build"], ["model"], ["sif"], ["clean", "--yes"]]


@pytest.fixture
def node(tmp_path, monkeypatch):
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    return log


def compose_calls(log) -> list[str]:
    return [line.removeprefix("compose ") for line in log.read_text().splitlines() if line.startswith("compose ")]


def one_sentence(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("polarstack:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_every_compose_target_refuses_a_compose_too_old_for_compose_yaml(node, monkeypatch, capsys, verb):
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "v2.19.1")  # compose-go 1.15.1: its schema rejects `required:`
    assert main(["compose", *verb, "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    sentence = one_sentence(capsys)
    assert f"make {verb[0]} needs Docker Compose 2.20.2 or newer for `required: false`" in sentence
    assert "reports 2.19.1; install a newer Docker Compose plugin" in sentence
    assert compose_calls(node) == ["version"]  # nothing else ran


def test_ubuntus_packaged_compose_passes_on_one_node(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "2.20.2+ds1-0ubuntu1~22.04.1")  # `docker compose version`, Ubuntu 22.04
    assert main(["compose", "ps", "--profile", "engine-direct"]) == 0
    assert compose_calls(node)[-1].endswith("--profile engine-direct ps")


def test_two_nodes_need_the_override_tag(node, monkeypatch, capsys):
    for key, value in {
        "NODES": "2",
        "NODE_RANK": "0",
        "CLUSTER_IFACE": "ps-test0",
        "NODE_ADDRS": "198.18.0.1,198.18.0.2",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "v2.24.3")  # compose-go 2.0.0-rc.2: no `!override`
    assert main(["compose", "ps", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    sentence = one_sentence(capsys)
    assert "needs Docker Compose 2.24.4 or newer for `!override` in the NODES>1 override" in sentence
    assert "reports 2.24.3" in sentence
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "v2.24.4")
    assert main(["compose", "ps", "--profile", "patched-router"]) == 0


def test_a_version_it_cannot_read_is_named_and_let_through(node, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "dev")
    assert main(["compose", "ps", "--profile", "engine-direct"]) == 0
    assert "cannot read the version of Compose" in one_sentence(capsys)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("Docker Compose version v2.40.3", (2, 40, 3)),
        ("Docker Compose version 2.20.2+ds1-0ubuntu1~22.04.1", (2, 20, 2)),
        ("Docker Compose version v5.0.0", (5, 0, 0)),
        ("Docker Compose version dev", None),
    ],
)
def test_the_version_line_is_read_in_its_packaged_forms(text, version):
    assert compose_version.parse(text) == version
