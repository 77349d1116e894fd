"""Pins a newcomer's path through the docker runtime on a CPU machine (issue 34 point 6): `make up DEVICE=cpu`,
`make bases DEVICE=cpu` and `make demo RUNTIME=docker` install the pinned sglang the engine base copies when it is
missing (saying what and why, before the first base), instead of exiting 8 after the first base; and a Docker that
is installed but not running is answered with the project's own `make dockerd`."""

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.stack import bases, compose, real_sglang
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit


@pytest.fixture
def steps(monkeypatch):
    done: list[str] = []
    monkeypatch.setattr(real_sglang, "install", lambda progress: done.append("install sglang") or "python")
    for name in ("make_python_base", "make_engine_base", "make_trainer_base"):
        monkeypatch.setattr(bases, name, lambda progress, rebuild=False, name=name: done.append(name) or name)
    return done


def test_the_bases_install_the_missing_sglang_first_and_say_why(monkeypatch, steps):
    monkeypatch.setattr(real_sglang, "is_installed", lambda: False)
    lines: list[str] = []
    assert bases.make_all(lines.append) == ["make_python_base", "make_engine_base", "make_trainer_base"]
    assert steps == ["install sglang", "make_python_base", "make_engine_base", "make_trainer_base"]
    said = lines[0]
    assert said.startswith(f"bases: the CPU engine image copies {real_sglang.spec()} from this host's install")
    assert "installing it now, once" in said and "polarstack sglang-install" in said


def test_an_installed_sglang_is_not_installed_again(monkeypatch, steps):
    monkeypatch.setattr(real_sglang, "is_installed", lambda: True)
    lines: list[str] = []
    bases.make_all(lines.append)
    assert steps == ["make_python_base", "make_engine_base", "make_trainer_base"]
    assert not any("installing" in line for line in lines)


def test_a_docker_without_a_running_engine_names_make_dockerd(monkeypatch, tmp_path):
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n"
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(StackError) as raised:
        compose.check_node("up", None, need_gpus=False, where=read_now())
    assert raised.value.code == ExitCode.ENVIRONMENT
    message = raised.value.message
    assert "Cannot connect to the Docker daemon" in message
    assert "start a private one with `make dockerd` and export the DOCKER_HOST line it prints" in message
    assert "RUNTIME=local" in message
