"""Pins issue 34 point 7's "nothing written into the user's HOME outside the project's cache": pip (which runs
`rustc --version` for its user agent, and a rustup proxy then creates ~/.rustup) and npm (its cache and logs in
~/.npm) keep their folders under the project's cache when the stack runs them (paths.tool_homes, through
processes.child_env). The rustc and npm here behave as rustup's proxy and npm do about their homes; pip is the real
one, offline."""

import os

import pytest

from polarstack import paths
from polarstack.offline import verify

# What paths.tool_homes covers, spelled out here (the fixture clears them; an old tree has no such list).
TOOL_HOMES = [
    ("RUSTUP_HOME", ".rustup", "rustup"),
    ("CARGO_HOME", ".cargo", "cargo"),
    ("npm_config_cache", None, "npm"),
    ("PIP_CACHE_DIR", None, "pip"),
    ("FLASHINFER_WORKSPACE_BASE", None, "flashinfer"),
    ("TILELANG_CACHE_DIR", None, "tilelang"),
    ("DOCKER_CONFIG", ".docker", "docker-config"),
]

pytestmark = pytest.mark.unit

RUSTC = '#!/bin/sh\nmkdir -p "${RUSTUP_HOME:-$HOME/.rustup}"; echo "rustc 1.0.0"\n'  # as rustup's proxy does
NPM = '#!/bin/sh\nmkdir -p "${npm_config_cache:-$HOME/.npm}/_logs"; echo 2.1.332\n'  # npm's cache and its logs


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    home, cache, bin_dir = tmp_path / "home", tmp_path / "cache", tmp_path / "bin"
    for folder in (home, bin_dir):
        folder.mkdir()
    for name, text in (("rustc", RUSTC), ("npm", NPM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("POLARSTACK_CACHE", str(cache))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip stays offline: the requirement below is never found
    for variable, _, _ in TOOL_HOMES:
        monkeypatch.delenv(variable, raising=False)
    return home, cache


def test_pip_and_npm_leave_nothing_in_a_fresh_home(fresh_home):
    home, cache = fresh_home
    ok, why = verify.check_pin("polarstack-no-such-package==0", "3.11")  # a real pip download
    assert not ok and "polarstack-no-such-package" in why
    assert verify.check_npm_pin("@anthropic-ai/claude-code", "2.1.332").ok
    assert sorted(p.name for p in home.iterdir()) == []
    assert (cache / "rustup").is_dir() and (cache / "npm" / "_logs").is_dir()


def test_the_users_own_homes_and_settings_are_kept(fresh_home, monkeypatch):
    home, cache = fresh_home
    (home / ".rustup").mkdir()  # a rustup with toolchains: the user's, never hidden
    monkeypatch.setenv("npm_config_cache", str(home / "npm-cache"))
    homes = paths.tool_homes()
    assert "RUSTUP_HOME" not in homes and "npm_config_cache" not in homes
    assert homes == {
        key: str(cache / folder) for key, _, folder in TOOL_HOMES if key not in ("RUSTUP_HOME", "npm_config_cache")
    }


def test_every_command_runs_with_them(fresh_home, monkeypatch):
    """`polarstack <command>` sets them for everything it starts (docker, pip, npm), as a default only."""
    import os

    from polarstack.cli.main import main

    home, cache = fresh_home
    monkeypatch.setenv("DOCKER_CONFIG", str(home / "mine"))  # the user's choice stays
    for key, _, _ in TOOL_HOMES:
        monkeypatch.setenv(key, os.environ.get(key, ""))  # whatever main sets is undone after the test
        if key != "DOCKER_CONFIG":
            monkeypatch.delenv(key)
    assert main(["routers", "catalog", "--json"]) == 0
    assert os.environ["DOCKER_CONFIG"] == str(home / "mine")
    assert os.environ["TILELANG_CACHE_DIR"] == str(cache / "tilelang") and os.environ["CARGO_HOME"] == str(
        cache / "cargo"
    )


def test_the_real_engine_keeps_flashinfers_cache_out_of_home(fresh_home):
    from polarstack.stack import real_sglang

    home, cache = fresh_home
    assert real_sglang.server_env()["FLASHINFER_WORKSPACE_BASE"] == str(cache / "flashinfer")


def test_make_creates_the_venv_without_writing_into_home(tmp_path):
    """`python3 -m venv` runs ensurepip's pip, which runs `rustc --version` too: in the cold CI run of 2026-12-03 the
    rustup proxy on PATH left ~/.rustup in the empty HOME 3 s after start, from the Makefile's venv line. That line
    (as `make -n` prints it, the real interpreter and the rustc stand-in above on PATH) leaves HOME empty."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    home, bin_dir, venv = tmp_path / "home", tmp_path / "bin", tmp_path / "venv"
    home.mkdir()
    bin_dir.mkdir()
    (bin_dir / "rustc").write_text(RUSTC)
    (bin_dir / "rustc").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in dict.fromkeys(n for n, _, _ in TOOL_HOMES)}
    env.update(HOME=str(home), PATH=f"{bin_dir}:{env.get('PATH', '')}", POLARSTACK_CACHE=str(tmp_path / "cache"))
    printed = subprocess.run(
        ["make", "-n", "-B", "_venv", f"VENV={venv}", f"PYTHON={sys.executable}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    creation = next(line for line in printed.splitlines() if " -m venv " in line)
    subprocess.run(["bash", "-c", creation], cwd=repo, env=env, check=True, capture_output=True)
    assert (venv / "bin" / "python").exists()
    assert sorted(p.name for p in home.iterdir()) == [], creation
