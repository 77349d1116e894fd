"""The docker tier (marker `docker`): the Docker runtime on a real engine, DEVICE=cpu (issue 27 point 6).

It needs a Docker engine at DOCKER_HOST (or the default socket): `make dockerd` starts this project's private one,
and `.ci/run` does. Without one the tier is skipped, naming what is missing; under CI=true (or
POLARSTACK_REQUIRE_DOCKER=1) it fails instead, so a CI machine whose engine cannot start never passes silently.
Every test's stack is its own Compose project, run-state file and ports (TIER_PORTS and friends), so the tier never
touches a user's `make up DEVICE=cpu` stack (31000...) or the Docker demo (32000...).
"""

from __future__ import annotations

import os

import pytest

from polarstack.stack import dockerd


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("POLARSTACK_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def docker_engine() -> str:
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not dockerd.answers(host):
        message = (
            f"no Docker engine answers at DOCKER_HOST={host}; start this project's private one with `make dockerd` "
            "and export the DOCKER_HOST it prints"
        )
        if _required():
            pytest.fail(f"the docker tier is required here (CI=true): {message}")
        pytest.skip(message)
    return host
