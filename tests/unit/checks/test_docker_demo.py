"""Pins `make demo RUNTIME=docker`'s refusal without an engine: exit 8 and one sentence saying how to get one
(polarstack.checks.docker_demo), before anything is built or started."""

import pytest

from polarstack.checks import docker_demo
from polarstack.cli.main import main
from polarstack.errors import ExitCode

pytestmark = pytest.mark.unit


def test_no_engine_is_one_sentence_with_the_way_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    assert main(["demo", "--runtime", "docker"]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"polarstack: {docker_demo.NO_ENGINE}"]
    assert "`make dockerd`" in docker_demo.NO_ENGINE and "DOCKER_HOST" in docker_demo.NO_ENGINE
