"""Pins tests/tier_deps.py, what `make test-deps` installs before pytest starts (issue 34 point 1): the pinned Ray where
the `ray_bin` fixture looks for it (the long cache path), every router release the tiers start, the pin-check wheels
(skipped when already there), the sglang source files; a line per step; a failed step ends with one sentence."""

from __future__ import annotations

import os

import pytest

import tier_deps
from polarstack.errors import ExitCode, StackError

pytestmark = pytest.mark.unit


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    monkeypatch.setenv("POLARSTACK_CACHE", str(tmp_path / "cache"))
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(
        tier_deps.ray_head,
        "install",
        lambda: calls.append(("ray", os.environ["POLARSTACK_CACHE"])) or (tmp_path / "bin", 0.0),
    )
    monkeypatch.setattr(tier_deps.harness, "install", lambda release: calls.append(("router", release.spec)))
    monkeypatch.setattr(
        tier_deps.verify, "check_pin", lambda requirement, python: calls.append(("pin", requirement)) or (True, "")
    )
    monkeypatch.setattr(tier_deps.protocol, "source_dir", lambda: calls.append(("sglang-src", "")))
    monkeypatch.setattr(tier_deps.real_sglang, "is_installed", lambda: False)  # the model: its own test below
    return calls, tmp_path / "cache"


def test_the_test_tier_installs_what_its_fixtures_start(fakes):
    calls, cache = fakes
    said: list[str] = []
    tier_deps.run(["test"], say=said.append)
    assert calls[0] == (
        "ray",
        str(tier_deps.long_cache_path(cache)),
    )  # where ray_bin looks (tier_deps.install_ray_long)
    routers = {spec for kind, spec in calls if kind == "router"}
    # the profiles' pins, one a test of test_real_routers.py starts, the real-engine tier's boundary releases
    assert {"sglang-router==0.1.4", "smg==1.13.0", "sglang-router==0.3.2", "sglang-router==0.1.9"} <= routers
    assert {"smg==1.4.1", "smg==1.5.0", "sglang-router==0.1.5"} <= routers
    assert "smg==0.0.0" not in routers  # a made-up release a test expects to be refused
    pins = [spec for kind, spec in calls if kind == "pin"]
    assert pins == [r for r, _py, _why in tier_deps.verify.pin_requirements()]
    assert ("sglang-src", "") in calls
    assert len([m for m in said if m.endswith("...")]) == len(tier_deps.steps(["test"]))  # a line per step
    assert all(": ready (" in m for m in said if not m.endswith("..."))


def test_the_real_engine_tiers_model_is_built_only_when_sglang_is_installed(fakes, monkeypatch):
    calls, _ = fakes
    assert not any("tiny model" in what for what, _how in tier_deps.steps(["test"]))
    monkeypatch.setattr(tier_deps.real_sglang, "is_installed", lambda: True)
    monkeypatch.setattr(tier_deps.real_sglang, "build_model", lambda progress: calls.append(("model", "")))
    tier_deps.run(["test"], say=lambda m: None)
    assert calls[-1] == ("model", "")


def test_a_wheel_already_in_the_pin_check_folder_is_not_asked_for(fakes):
    calls, cache = fakes
    (cache / "pin-check").mkdir(parents=True)
    (cache / "pin-check" / "sglang_router-0.1.4-cp38-abi3-manylinux_2_28_x86_64.whl").write_text("")
    (cache / "pin-check" / "ray-2.57.0-cp311-cp311-manylinux2014_x86_64.whl").write_text("")  # another version
    tier_deps.fetch_pin_wheels()
    asked = [spec for kind, spec in calls if kind == "pin"]
    assert "sglang-router==0.1.4" not in asked and any(a.startswith("ray==") for a in asked)


def test_the_cluster_tier_installs_ray_under_the_cache_itself(fakes):
    calls, cache = fakes
    tier_deps.run(["cluster"], say=lambda m: None)
    assert [c for c in calls if c[0] == "ray"] == [("ray", str(cache))]
    assert {s for k, s in calls if k == "router"} == {r.spec for r in tier_deps.profile_releases()}


def test_a_failed_step_is_one_sentence_and_its_exit_code(fakes, monkeypatch, capsys):
    def fail(requirement, python):
        return False, "No matching distribution found"

    monkeypatch.setattr(tier_deps.verify, "check_pin", fail)
    assert tier_deps.main(["test"]) == int(ExitCode.ENVIRONMENT)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("test-deps: could not download the pin-check wheels") and "PyPI" in err[-1]
    assert tier_deps.main(["nonsense"]) == 2
    with pytest.raises(StackError):
        tier_deps.fetch_pin_wheels()
