"""Pins the stack's Ray token file (issue 28 point 2, polarstack.stack.ray_auth): written by the project itself, 64 hex
digits, mode 0600 in a 0700 folder, created exclusively (a token that exists is never rewritten), never printed; and
the refusals, each one sentence with its exit code: a file inside the repository, readable by others, holding
anything but a token, not a regular file, missing on a node that is not the head. Only `up` (make up, make preflight,
the docker demo: every one goes through compose.run_compose) makes the token, before Compose runs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import fake_node
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.pins import repo_root
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_writes_a_64_hex_token_0600_and_prints_nothing(tmp_path, capsys):
    path = tmp_path / "config" / "polarstack" / "ray-auth-token"
    assert ray_auth.ensure(path) == path
    text = path.read_text()
    assert text.endswith("\n") and len(text.strip()) == ray_auth.TOKEN_HEX_DIGITS
    assert all(c in "0123456789abcdef" for c in text.strip())
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    captured = capsys.readouterr()
    assert text.strip() not in captured.out + captured.err and not captured.out and not captured.err


def test_ensure_keeps_a_token_that_exists(tmp_path):
    path = ray_auth.ensure(tmp_path / "ray-auth-token")
    first = path.read_text()
    assert ray_auth.ensure(path).read_text() == first  # a second `make up` keeps the cluster's token


def test_ensure_creates_exclusively_when_another_up_wrote_it_meanwhile(tmp_path, monkeypatch):
    """The file appears between the existence check and the create (two `make up` at once): O_EXCL refuses to
    overwrite, and the other process's token is checked and kept."""
    path = tmp_path / "ray-auth-token"
    other = "ab" * (ray_auth.TOKEN_HEX_DIGITS // 2) + "\n"
    real_open = os.open

    def racing_open(file, flags, mode=0o777):
        if Path(file) == path and not path.exists():
            fd = real_open(file, os.O_WRONLY | os.O_CREAT, 0o600)  # the other `make up`, just before us
            os.write(fd, other.encode())
            os.close(fd)
        return real_open(file, flags, mode)

    monkeypatch.setattr(ray_auth.os, "open", racing_open)
    assert ray_auth.ensure(path).read_text() == other


def test_a_token_file_inside_the_repository_is_refused():
    path = repo_root() / ".run" / "ray-auth-token"
    with pytest.raises(StackError) as info:
        ray_auth.check(path)
    assert info.value.code == ExitCode.USAGE and "inside the repository" in info.value.message
    assert "RAY_AUTH_TOKEN_FILE" in info.value.message
    assert not path.exists()  # refused before anything was written


def test_ensure_refuses_inside_the_repository_without_writing():
    path = repo_root() / ".run" / "ray-auth-token-test"
    with pytest.raises(StackError) as info:
        ray_auth.ensure(path)
    assert info.value.code == ExitCode.USAGE and not path.exists()


def test_a_token_others_can_read_is_refused(tmp_path):
    path = ray_auth.ensure(tmp_path / "ray-auth-token")
    path.chmod(0o644)  # what `ray get-auth-token --generate` leaves under umask 022 (configs/upstream/ray-auth.json)
    with pytest.raises(StackError) as info:
        ray_auth.check(path)
    assert info.value.code == ExitCode.STATE and "0644" in info.value.message and "chmod 600" in info.value.message


@pytest.mark.parametrize("content", ["", "secret\n", "AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32])
def test_anything_but_64_lowercase_hex_digits_is_refused(tmp_path, content):
    path = tmp_path / "ray-auth-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, content.encode())
    os.close(fd)
    with pytest.raises(StackError) as info:
        ray_auth.check(path)
    assert info.value.code == ExitCode.STATE and "64 hex digits" in info.value.message
    assert content.strip() == "" or content.strip() not in info.value.message  # the content is never quoted


def test_a_directory_in_place_of_the_file_is_refused(tmp_path):
    path = tmp_path / "ray-auth-token"
    path.mkdir()  # what Docker leaves when a bind mount's source is missing and it may create it
    with pytest.raises(StackError) as info:
        ray_auth.check(path)
    assert info.value.code == ExitCode.STATE and "not a regular file" in info.value.message


def test_a_node_that_is_not_the_head_never_makes_a_token(tmp_path):
    path = tmp_path / "ray-auth-token"
    with pytest.raises(StackError) as info:
        ray_auth.prepare(path, head=False)
    assert info.value.code == ExitCode.STATE and "NODE_RANK=0" in info.value.message and "copy" in info.value.message
    assert not path.exists()
    assert ray_auth.prepare(path, head=True) == path and path.is_file()
    assert ray_auth.prepare(path, head=False) == path  # the copy, once there, is accepted


def test_token_path_default_and_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert ray_auth.token_path("") == tmp_path / "polarstack" / "ray-auth-token"
    assert ray_auth.token_path(str(tmp_path / "x")) == tmp_path / "x"
    with pytest.raises(StackError) as info:
        ray_auth.token_path("relative/token")
    assert info.value.code == ExitCode.USAGE and "absolute" in info.value.message


def test_every_ray_process_of_the_trainer_reads_the_mounted_file():
    assert ray_auth.TRAINER_ENV == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ray_auth.CONTAINER_TOKEN_PATH}
    assert "RAY_AUTH_TOKEN" not in ray_auth.TRAINER_ENV  # the token itself never goes into an environment


def test_the_login_hint_names_the_file_not_the_token(tmp_path):
    path = ray_auth.ensure(tmp_path / "ray-auth-token")
    text = "\n".join(ray_auth.login_lines(path, 8265))
    assert str(path) in text and "ssh -L 8265:127.0.0.1:8265" in text
    assert path.read_text().strip() not in text


def test_the_authorization_header_is_the_bearer_form_ray_reads(tmp_path):
    path = ray_auth.ensure(tmp_path / "ray-auth-token")
    assert ray_auth.auth_header(path) == {"Authorization": f"Bearer {path.read_text().strip()}"}


def _fake_compose(monkeypatch, tmp_path) -> None:
    """Compose stands in as /bin/true: run_compose's own steps run, nothing starts."""
    monkeypatch.setenv("COMPOSE_BIN", "/bin/true")
    monkeypatch.setattr(compose, "compose_args", lambda profile, directory=None, *, cluster, cpu: [])


@pytest.mark.parametrize("verb", ["down", "ps", "logs", "config"])
def test_only_up_writes_the_token(tmp_path, monkeypatch, verb):
    _fake_compose(monkeypatch, tmp_path)
    path = tmp_path / "cfg" / "ray-auth-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_FILE", str(path))
    assert compose.run_compose(profiles.load("engine-direct"), [verb], where=read_now(), capture=True).returncode == 0
    assert not path.exists()  # `make down` on a node never makes (or checks) a token


def test_up_writes_the_token_before_compose_runs(tmp_path, monkeypatch):
    _fake_compose(monkeypatch, tmp_path)
    path = tmp_path / "cfg" / "ray-auth-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_FILE", str(path))
    seen = {}
    real_run = compose.subprocess.run

    def run(cmd, **kwargs):
        seen["existed"] = path.is_file() and _mode(path) == 0o600
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(compose.subprocess, "run", run)
    compose.run_compose(profiles.load("engine-direct"), ["up", "--detach", "--wait"], where=read_now(), capture=True)
    assert seen == {"existed": True}


def test_up_on_a_worker_node_needs_the_heads_copy(tmp_path, monkeypatch):
    _fake_compose(monkeypatch, tmp_path)
    path = tmp_path / "cfg" / "ray-auth-token"
    for key, value in {
        "RAY_AUTH_TOKEN_FILE": str(path),
        "NODES": "2",
        "NODE_RANK": "1",
        "CLUSTER_IFACE": "ps-test0",
        "NODE_ADDRS": "198.18.0.1,198.18.0.2",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StackError) as info:
        compose.run_compose(
            profiles.load("patched-router"), ["up", "--detach", "--wait"], where=read_now(), capture=True
        )
    assert info.value.code == ExitCode.STATE and "NODE_RANK=0" in info.value.message and not path.exists()


def test_make_up_writes_the_token_and_names_only_its_file(tmp_path, monkeypatch, capsys):
    """`polarstack compose up` on a fake node (tests/fake_node.py: no Docker, no GPU): the token is there afterwards,
    and what the command prints names the file and the dashboard's route, never the token."""
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 engine-1 router trainer")
    path = tmp_path / "cfg" / "ray-auth-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_FILE", str(path))
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    token = ray_auth.check(path).read_text().strip()
    out = capsys.readouterr()
    assert str(path) in out.err and "ssh -L 8265:127.0.0.1:8265" in out.err
    assert token not in out.out + out.err
    assert main(["compose", "down"]) == 0
