"""Pins the tracker wiring (issue 19): with WANDB_API_KEY set the launch uses slime's own --use-wandb options and
the key's value appears nowhere in the dry-run output, launch.sh or Ray's runtime environment (wandb reads it from
the trainer's environment, passed through by compose.yaml); without it, slime's --use-tensorboard with
TENSORBOARD_DIR under the checkpoints volume. Either way the rehearsal's record hash does not depend on it."""

import json

import pytest
import yaml

from polarstack.cli.main import main
from polarstack.paths import compose_file
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import rehearsal_record

pytestmark = pytest.mark.unit
SECRET = "wandb-secret-value-7f3a9c"


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def dry_run(capsys, *extra):
    assert main(["train", "--task", "humaneval", "--dry-run", *extra]) == 0
    return capsys.readouterr()


def test_wandb_key_is_passed_through_never_written(monkeypatch, capsys):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    text = dry_run(capsys)
    plan = json.loads(dry_run(capsys, "--json").out)
    submit = next(c for c in plan["commands"] if c.startswith("ray job submit"))
    assert "--use-wandb --wandb-project polarstack --wandb-group humaneval-engine-direct" in submit
    assert "--wandb-key" not in submit and "--use-tensorboard" not in submit
    runtime_env = json.loads(submit.split("--runtime-env-json=", 1)[1].split("' ", 1)[0].strip("'"))
    for where in (text.out, text.err, json.dumps(plan), plan["files"]["launch.sh"], json.dumps(runtime_env)):
        assert SECRET not in where
    trainer = yaml.safe_load(compose_file().read_text())["services"]["trainer"]["environment"]
    assert "WANDB_API_KEY" in trainer and trainer["WANDB_API_KEY"] is None  # pass-through: no value in the file


def test_tensorboard_under_the_checkpoints_volume_without_a_key(monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    plan = json.loads(dry_run(capsys, "--json").out)
    submit = next(c for c in plan["commands"] if c.startswith("ray job submit"))
    assert "--use-tensorboard --tb-project-name polarstack --tb-experiment-name humaneval-engine-direct" in submit
    assert '"TENSORBOARD_DIR": "/checkpoints/polarstack/tensorboard/humaneval-engine-direct"' in submit
    assert "--use-wandb" not in submit


def test_rehearsal_hash_does_not_depend_on_the_tracker(monkeypatch):
    profile = profiles.load("engine-direct")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    without = rehearsal_record.plan_hash(profile, cluster=load_cluster())
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    assert rehearsal_record.plan_hash(profile, cluster=load_cluster()) == without
    import os

    assert os.environ["WANDB_API_KEY"] == SECRET  # restored
