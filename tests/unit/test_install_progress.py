"""Pins issue 34 point 7's "progress during every install longer than a few seconds": the project's virtual
environment (`make _venv`, minutes of pip when cold), a router release's venv and Ray's (both pip, seconds to
minutes) each say what they install before and how long it took after; a cached one says nothing; a failed one ends
with its one sentence, never with "installed"."""

import os
import subprocess
from pathlib import Path

import pytest

from polarstack.errors import StackError
from polarstack.routers import harness
from polarstack.routers.catalog import RouterRelease
from polarstack.stack import ray_head

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def fake_run(code: int):
    def run(cmd, **kwargs):
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[3]).mkdir(parents=True)  # the venv the install fills
        return subprocess.CompletedProcess(cmd, code, stdout="", stderr="ERROR: No matching distribution found\n")

    return run


@pytest.mark.parametrize("kind", ["router", "ray"])
def test_an_install_is_announced_before_and_timed_after(monkeypatch, tmp_path, capsys, kind):
    monkeypatch.setenv("POLARSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(subprocess, "run", fake_run(0))
    if kind == "router":
        release = RouterRelease.parse("smg==1.13.0")
        harness.install(release)
        what, where = "smg==1.13.0", harness.venv_dir(release)
    else:
        ray_head.install("2.0.0")
        what, where = "ray[default]==2.0.0", ray_head.venv_dir("2.0.0")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"polarstack: installing {what} into {where} (once, cached for later runs) ..."
    assert lines[1].startswith(f"polarstack: {what} installed in ") and lines[1].endswith(" s")
    if kind == "router":
        harness.install(release)
    else:
        ray_head.install("2.0.0")
    assert capsys.readouterr().err == ""  # cached: nothing to wait for, nothing said


@pytest.mark.parametrize("kind", ["router", "ray"])
def test_a_failed_install_never_says_installed(monkeypatch, tmp_path, capsys, kind):
    monkeypatch.setenv("POLARSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(subprocess, "run", fake_run(1))
    with pytest.raises(StackError) as raised:
        harness.install(RouterRelease.parse("smg==1.13.0")) if kind == "router" else ray_head.install("2.0.0")
    assert "No matching distribution found" in raised.value.message
    assert " installed in " not in capsys.readouterr().err


def test_make_venv_says_what_it_installs_and_how_long_it_took(tmp_path):
    venv, home = tmp_path / "venv", tmp_path / "home"
    (venv / "bin").mkdir(parents=True)
    home.mkdir()
    python = venv / "bin" / "python"
    # stands in for the venv's pip: what it was asked, and where pip and a rustup proxy would write
    python.write_text('#!/bin/sh\necho "$@ | $PIP_CACHE_DIR | $RUSTUP_HOME" > "$(dirname "$0")/pip-args"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_CACHE_DIR", "RUSTUP_HOME", "POLARSTACK_CACHE")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    make = ["make", "-s", "_venv", f"VENV={venv}"]
    proc = subprocess.run(make, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"make: installing polarstack and its test tools into {venv} (pip")
    assert lines[1].startswith(f"make: {venv} ready in ") and lines[1].endswith(" s")
    asked, pip_cache, rustup_home = (venv / "bin" / "pip-args").read_text().strip().split(" | ")
    assert asked.startswith("-m pip install") and (venv / ".installed").exists()
    cache = tmp_path / "xdg" / "polarstack"  # the project's cache, not HOME's ~/.cache/pip or ~/.rustup
    assert (pip_cache, rustup_home) == (str(cache / "pip"), str(cache / "rustup"))


@pytest.mark.parametrize("version", ["3.10.12", None])
def test_make_refuses_a_python_older_than_311_in_one_sentence_before_making_a_venv(tmp_path, version):
    """The node-path review (finding 3): a host whose python3 is older (Ubuntu 22.04's 3.10) or absent gets one
    sentence naming PYTHON=, not a pip traceback, and no .venv is made."""
    fake = tmp_path / "python3.10"
    if version:  # a python3 that answers as an older one
        fake.write_text(f"#!/bin/sh\ncase \"$1\" in --version) echo 'Python {version}';; *) exit 1;; esac\n")
        fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = subprocess.run(
        ["make", "-s", "_venv", f"PYTHON={fake}", f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "MAKEFLAGS": ""},
        timeout=120,
    )
    assert proc.returncode == 2 and not venv.exists()
    (line,) = [text for text in proc.stderr.splitlines() if text.startswith("make: ") and "Error" not in text]
    assert f"make: {fake} is not Python 3.11 or newer" in line and "make PYTHON=python3.11" in line
    assert (f"(Python {version})" if version else "(not found)") in line
