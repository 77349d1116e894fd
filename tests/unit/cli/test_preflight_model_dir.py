"""Issue 26 point 6: `make preflight` with MODEL_DIR set refuses in one sentence naming MODEL_DIR, since the host's
weights (the 7B) would be mounted where the rehearsal's small model belongs and `make model` would not download it."""

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_preflight_refuses_model_dir(dry_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODEL_DIR", str(tmp_path / "Qwen2.5-7B-Instruct"))
    assert main(["preflight", "--profile", "engine-direct", *dry_run]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert f"MODEL_DIR={tmp_path / 'Qwen2.5-7B-Instruct'}" in err and "unset MODEL_DIR" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_preflight_without_model_dir_plans(monkeypatch, capsys):
    monkeypatch.setenv("MODEL_DIR", "")
    assert main(["preflight", "--profile", "engine-direct", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "memory per trainer GPU" in out and "Qwen2.5-3B-Instruct" in out
